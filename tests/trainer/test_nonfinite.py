"""Non-finite losses: the step never applies them; the host raises ('raise') or skips up to a limit ('skip')."""
import numpy as np
import pytest

from jaxcomposer import Trainer
from jaxcomposer.callbacks import NonFiniteLossError
from jaxcomposer.optim import DecoupledSGDW
from tests.trainer.helpers import digits, leaves, mlp_task


class PoisonedLoader:
    """32-example batches of digits; the batches whose numbers are in ``bad`` (1-based) hold a NaN."""

    def __init__(self, bad):
        self.data, self.bad = digits("train", 320), set(bad)

    def __len__(self):
        return 10

    def __iter__(self):
        for i in range(10):
            batch = {k: v[i * 32:(i + 1) * 32].copy() for k, v in self.data.items()}
            if i + 1 in self.bad:
                batch["input"][0, 0, 0, 0] = np.nan
            yield batch


def make(bad, tmp_path=None, **kw):
    return Trainer(model=mlp_task(), train_dataloader=PoisonedLoader(bad), max_duration="6ba",
                   optimizers=DecoupledSGDW(lr=0.1), seed=0, progress_bar=False,
                   save_folder=None if tmp_path is None else tmp_path / "ck", save_interval="1ba", **kw)


def test_raise_names_the_batch_and_never_saves_the_bad_state(tmp_path):
    trainer = make({3}, tmp_path)
    with pytest.raises(NonFiniteLossError, match="batch 3: the loss is nan"):
        trainer.fit()
    trainer.close()
    assert max(trainer.store.all_steps()) == 2
    assert all(np.all(np.isfinite(x)) for x in leaves(trainer.state.train_state.params))


def test_skip_leaves_params_bitwise_unchanged_across_the_bad_step():
    seen = []

    from jaxcomposer import Callback

    class Snapshot(Callback):
        def batch_end(self, state, logger):
            seen.append(leaves(state.train_state.params))

    trainer = make({3}, nonfinite="skip", callbacks=[Snapshot()])
    trainer.fit()
    for a, b in zip(seen[1], seen[2]):  # after batch 2 == after batch 3 (skipped)
        np.testing.assert_array_equal(a, b)
    assert any(not np.array_equal(a, b) for a, b in zip(seen[2], seen[3]))  # batch 4 trains again
    assert trainer.state.timestamp.batch == 6


def test_skip_raises_past_the_limit():
    trainer = make({2, 3, 4}, nonfinite="skip", nonfinite_max_skips=2)
    with pytest.raises(NonFiniteLossError, match="batch 4: .*3 such steps in a row"):
        trainer.fit()


def test_policy_is_validated():
    with pytest.raises(ValueError, match="nonfinite: Input should be 'raise' or 'skip' \\(got 'ignore'\\)"):
        make(set(), nonfinite="ignore")


class Flag:
    """A step's finite flag as the host sees it: computed yet or not. ``waited`` records a read before it was
    computed, i.e. a read that would have made the host wait on the device."""

    def __init__(self, ready: bool, finite: bool = True):
        self.ready, self.finite, self.waited = ready, finite, False

    def is_ready(self) -> bool:
        return self.ready

    def __array__(self, dtype=None, copy=None):
        self.waited = self.waited or not self.ready
        return np.asarray(self.finite)


def test_flags_are_read_without_waiting_up_to_the_queue_limit():
    from jaxcomposer.trainer.nonfinite import MAX_UNCHECKED_STEPS as limit
    trainer = make(set())
    pending = trainer.nonfinite_checks.pending
    flags = {b: Flag(ready=b <= 2) for b in range(1, limit + 1)}
    pending.extend((b, {"finite": f}) for b, f in flags.items())
    # the computed flags are taken; the host stops at the first one still running
    trainer.nonfinite_checks.check(wait=False)
    assert [b for b, _ in pending] == list(range(3, limit + 1)) and not any(f.waited for f in flags.values())
    late = Flag(ready=False)
    pending.extend((b, {"finite": late}) for b in range(limit + 1, limit + 5))  # limit + 2 queued now
    trainer.nonfinite_checks.check(wait=False)
    assert len(pending) == limit  # only the two oldest, past the limit, were waited for
    assert [b for b, f in flags.items() if f.waited] == [3, 4]
    trainer.nonfinite_checks.check()  # a sync point (save, eval, fit end) reads them all
    assert not pending


def test_a_bad_flag_read_later_still_names_its_batch():
    trainer = make(set())
    bad = {"finite": Flag(ready=True, finite=False), "loss": float("nan"), "grad_norm": 1.0}
    trainer.nonfinite_checks.pending.extend([(7, {"finite": Flag(ready=True)}), (8, bad),
                                             (9, {"finite": Flag(ready=False)})])
    with pytest.raises(NonFiniteLossError, match="batch 8: the loss is nan"):
        trainer.nonfinite_checks.check(wait=False)
    assert not trainer.nonfinite_checks.pending


def test_several_processes_read_each_flag_exactly_one_step_late(monkeypatch):
    """Processes must all raise after the same step: there a flag is read one step late, computed or not."""
    import jax
    trainer = make(set())
    monkeypatch.setattr(jax, "process_count", lambda: 2)
    pending = trainer.nonfinite_checks.pending
    flags = [Flag(ready=True), Flag(ready=True), Flag(ready=False)]
    pending.extend((b, {"finite": f}) for b, f in enumerate(flags, 1))
    trainer.nonfinite_checks.check(wait=False)
    assert [b for b, _ in pending] == [3]  # the newest stays queued even when the older ones were computed
    pending.append((4, {"finite": Flag(ready=True)}))
    trainer.nonfinite_checks.check(wait=False)
    assert [b for b, _ in pending] == [4] and flags[2].waited  # step 3's flag: read (waited for) one step late
