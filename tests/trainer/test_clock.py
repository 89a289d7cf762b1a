"""One clock (docs/design.md, "The clock"): a step skipped for a non-finite loss advances the clock that every
slot, method and the LR schedule read, exactly as it advances the timestamp, so none of them disagrees about the
step afterwards; and autoresume across the skip is still bitwise.
"""
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxcomposer import Callback, Method, PostStep, Trainer, algorithms
from jaxcomposer.optim import DecoupledSGDW, MultiStepScheduler
from jaxcomposer.data import ArrayLoader
from jaxcomposer.loggers import InMemoryLogger
from tests.trainer.helpers import digits, leaves, mlp_task
from tests.trainer.test_nonfinite import PoisonedLoader

BAD = 3  # the third batch (clock 2) holds a NaN


def _probe(seen: list) -> Method:
    """Records the clock every slot sees: in-jit slots through a debug callback, host slots directly."""

    def record(slot):
        def fn(step):
            seen.append((slot, int(step)))
        return lambda ctx: jax.debug.callback(fn, ctx.step, ordered=False)

    def batch(b, ctx):
        record("batch")(ctx)
        return b

    def loss(loss_fn, ctx):
        record("loss")(ctx)
        return loss_fn

    def grad(grad_fn, ctx):
        record("grad")(ctx)
        return grad_fn

    def tx(inner, ctx):
        if not isinstance(ctx.step, int):  # skip the host-side build for tx.init
            record("tx")(ctx)
        return inner

    def schedule(alpha, ctx):
        if not isinstance(ctx.step, int):
            record("schedule")(ctx)
        return alpha

    def update(extra, params, model_state, ctx):
        record("post_step")(ctx)
        return extra

    def stage(shapes, ctx):
        seen.append(("stage", ctx.step))
        return None

    return Method(name="Probe", batch=batch, loss=loss, grad=grad, tx=tx, schedule=schedule, stage=stage,
                  post_step=PostStep(lambda p, s, ctx: jnp.zeros(()), update))


class Snapshot(Callback):
    def __init__(self):
        self.params, self.batches = [], []

    def batch_end(self, state, logger):
        self.params.append(leaves(state.train_state.params))
        self.batches.append(int(state.timestamp.batch))


def test_every_slot_reads_the_clock_the_timestamp_reads():
    seen = []
    trainer = Trainer(model=mlp_task(), train_dataloader=PoisonedLoader({BAD}), max_duration="5ba",
                      optimizers=DecoupledSGDW(lr=0.1), algorithms=[_probe(seen)], nonfinite="skip",
                      seed=0, progress_bar=False)
    trainer.fit()
    jax.effects_barrier()
    assert int(trainer.state.train_state.step) == trainer.state.timestamp.batch == 5
    by_slot = {}
    for slot, step in seen:
        by_slot.setdefault(slot, []).append(step)
    for slot in ("batch", "loss", "grad", "tx", "schedule", "post_step", "stage"):
        # traced slots run once per step (one compile: their callbacks fire every step, skipped one included)
        assert sorted(by_slot[slot]) == [0, 1, 2, 3, 4], slot


def test_lr_schedule_counts_the_skipped_step():
    """The LR drops to 0 from clock 3 on. Were the schedule counting applied updates (2 after the skip), batch 4
    (clock 3) would still train at the full rate."""
    snap = Snapshot()
    trainer = Trainer(model=mlp_task(), train_dataloader=PoisonedLoader({BAD}), max_duration="5ba",
                      optimizers=DecoupledSGDW(lr=0.1), schedulers=[MultiStepScheduler(["3ba"], gamma=0.0)],
                      nonfinite="skip", callbacks=[snap], seed=0, progress_bar=False)
    trainer.fit()
    assert any(not np.array_equal(a, b) for a, b in zip(snap.params[0], snap.params[1]))  # batch 2 trained
    for later in snap.params[2:]:  # batch 3 skipped, batches 4 and 5 at LR 0: nothing moves after batch 2
        for a, b in zip(snap.params[1], later):
            np.testing.assert_array_equal(a, b)
    assert trainer.lr_multiplier(3) == 0.0 and trainer.lr_multiplier(2) == 1.0


def test_swa_swaps_in_the_average_at_the_planned_step_despite_a_skip():
    """SWA samples every batch and swaps the average in at its end (0.8dur of 5 = batch 4). With its own count
    of applied updates it would reach that point one batch late; on the clock it swaps at batch 4."""
    snap = Snapshot()
    trainer = Trainer(model=mlp_task(), train_dataloader=PoisonedLoader({BAD}), max_duration="5ba",
                      optimizers=DecoupledSGDW(lr=0.1),
                      algorithms=[algorithms.SWA(swa_start="0.0dur", swa_end="0.8dur", update_interval="1ba")],
                      nonfinite="skip", callbacks=[snap], seed=0, progress_bar=False)
    trainer.fit()
    from jaxcomposer.algorithms.swa import find_swa_state

    swa = find_swa_state(trainer.state.train_state.opt_state)
    assert int(swa.swa_n) == 3  # batches 1, 2 and 4 sampled; 3 was skipped
    average = leaves(swa.average)
    # the swap is applied as an update, p + (avg - p): equal to the average up to float rounding, which a
    # missed swap (params one SGD step away) is nowhere near
    assert max(np.abs(a - b).max() for a, b in zip(snap.params[2], average)) > 1e-4
    for a, b in zip(snap.params[3], average):  # after batch 4 the params are the average
        np.testing.assert_allclose(a, b, rtol=1e-6, atol=1e-9)


RECIPE = {
    "EMA": lambda: algorithms.EMA(half_life="2ba"),
    "SWA": lambda: algorithms.SWA(swa_start="0.0dur", swa_end="0.9dur", update_interval="1ba"),
    "LayerFreezing": lambda: algorithms.LayerFreezing(freeze_start=0.0, freeze_level=1.0, update_interval="1ba"),
    "SelectiveBackprop": lambda: algorithms.SelectiveBackprop(start=0.0, end=1.0, keep=0.5, interrupt=2),
}


def poisoned_array_loader():
    """Like PoisonedLoader, but seekable (an ArrayLoader in order), so a resumed run reads from its position."""
    data = digits("train", 320)
    data["input"][(BAD - 1) * 32, 0, 0, 0] = np.nan
    return ArrayLoader(data, 32, shuffle=False)


@pytest.mark.parametrize("name", sorted(RECIPE))
def test_autoresume_across_a_skip_is_bitwise(name, tmp_path):
    def make(**kw):
        return Trainer(model=mlp_task(dropout=0.1), train_dataloader=poisoned_array_loader(), max_duration="6ba",
                       optimizers=DecoupledSGDW(lr=0.1, momentum=0.9), schedulers=[MultiStepScheduler(["4ba"])],
                       algorithms=[RECIPE[name]()], nonfinite="skip", seed=0, progress_bar=False,
                       save_interval="1ba", **kw)

    logger = InMemoryLogger()
    straight = make(save_folder=tmp_path / "a", loggers=[logger])
    straight.fit()
    straight.close()
    assert [int(ts.batch) for ts, _ in logger.data["nonfinite/skipped_in_a_row"]] == [BAD]  # the skip happened
    resumed = make(load_path=tmp_path / "a" / str(BAD))  # the checkpoint right after the skipped step
    assert resumed.state.timestamp.batch == int(resumed.state.train_state.step) == BAD
    resumed.fit()
    for x, y in zip(leaves(straight.state.train_state), leaves(resumed.state.train_state)):
        np.testing.assert_array_equal(x, y)


def test_host_lr_matches_the_device_schedule_across_table_chunks():
    """The LR callbacks read (``state.learning_rate``) comes from host tables of ``TABLE_STEPS`` steps, so
    reading it never waits for the step in flight; it must equal the compiled schedule, also past a chunk edge."""
    from jaxcomposer.optim import CosineAnnealingWithWarmupScheduler
    from jaxcomposer.trainer.lr_table import TABLE_STEPS
    trainer = Trainer(model=mlp_task(), train_dataloader=PoisonedLoader(set()), max_duration="9000ba",
                      optimizers=DecoupledSGDW(lr=0.1), schedulers=[CosineAnnealingWithWarmupScheduler("100ba")],
                      seed=0, progress_bar=False)
    probes = [0, 1, 99, 100, 2500, TABLE_STEPS - 1, TABLE_STEPS, 2 * TABLE_STEPS + 7, 8999]
    host = [trainer.state.learning_rate(s) for s in probes]
    device = [0.1 * float(trainer.lr_multiplier(s)) for s in probes]
    np.testing.assert_allclose(host, device, rtol=1e-6, atol=1e-9)
    assert host[0] == 0.0 and host[3] == pytest.approx(0.1) and host[-1] < 1e-6
    assert sorted(trainer.lr_table.chunks) == [0, 1, 2]  # three chunks computed, each once
