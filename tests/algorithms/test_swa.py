import math

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from flax import nnx

from jaxcomposer import Trainer
from jaxcomposer.algorithms import SWA
from jaxcomposer.algorithms.swa import (SWAState, _Plan, _plan, find_swa_state, swa_tx, swalr_schedule,
                                       update_swa_average)
from jaxcomposer.core.events import Callback
from jaxcomposer.core.method import RunInfo
from jaxcomposer.core.time import Time
from jaxcomposer.data import ArrayLoader
from jaxcomposer.models import MLP
from jaxcomposer.models.tasks import ComposerClassifier
from jaxcomposer.optim import DecoupledSGDW
from tests.algorithms.algo_testing import make_ctx
from tests.trainer.helpers import digits, stop_at
from jaxcomposer import algorithms
from tests.algorithms.algo_testing import Example

# one representative configuration: the composition table and the Trainer contract run it
# sample every batch from the start; the params become the average at the last step (0.9dur of 2 or 4
# steps); SWALR anneals the LR over the first 2 samples
EXAMPLE = Example(lambda: algorithms.SWA(swa_start="0.0dur", swa_end="0.9dur", update_interval="1ba",
                                          schedule_swa_lr=True, anneal_steps=2, swa_lr=0.05))


def _t(s):
    return Time.from_timestring(s)


# (1) numerics: when things happen, the average, the LR ----------------------------------------------------------

@pytest.mark.parametrize("start,end,interval,total,spe,want", [
    ("0.0dur", "0.9dur", "1ba", 4, None, (1, 1, 4)),  # the contract example: 4 samples, replaced at the last step
    ("0.5dur", "0.75dur", "2ba", 8, None, (4, 2, 6)),
    ("0.25dur", "0.7dur", "1ep", 12, 3, (3, 3, 9)),  # epoch ends 3, 6, 9: 9/12 >= 0.7
    ("1ep", "3ep", "1ba", 20, 4, (5, 1, 13)),  # at a batch end the epoch count is (n - 1) // 4
    ("1ep", "3ep", "1ep", 20, 4, (4, 4, 12)),  # at an epoch end it is n // 4
    ("0.71dur", "0.72dur", "1ba", 10, None, (8, 1, 8)),  # start and end at the same event
    ("1ep", "9ep", "1ba", 12, 4, (5, 1, 2**31 - 1)),  # never ends within the run
    ("0.95dur", "0.99dur", "1ep", 10, 4, (2**31 - 1, 4, 2**31 - 1)),  # no epoch end past the start
])
def test_plan_hand_checked(start, end, interval, total, spe, want):
    assert tuple(_plan(_t(start), _t(end), _t(interval), RunInfo(total, spe, 0.1))) == want


def test_update_swa_average_is_the_mean(key):
    samples = [jax.random.normal(jax.random.fold_in(key, i), (3, 4)) for i in range(5)]
    avg = {"w": jnp.full((3, 4), 123.0)}  # whatever it holds before the first sample is discarded
    for n, s in enumerate(samples):
        avg = update_swa_average(avg, {"w": s}, n)
        np.testing.assert_allclose(avg["w"], np.mean(np.stack(samples[:n + 1]), 0), rtol=1e-6, atol=1e-6)
    np.testing.assert_array_equal(update_swa_average(avg, {"w": samples[0]}, 0)["w"], samples[0])  # a copy


def _composer_reference(deltas, p0, start, end, interval, spe, total):
    """Composer's SWA.match/apply replayed on the host: params after each batch are the previous ones plus a delta,
    unless SWA replaced them. Returns (params, swa_n, average) after each batch."""
    sv, su = start
    ev_, iv = end[0], interval
    match_event = "BATCH_END" if iv[1] == "ba" else "EPOCH_END"
    started = completed = False
    counter, n_avg, avg, p, out = 0, 0, None, p0.copy(), []
    for n in range(1, total + 1):
        p = p + deltas[n - 1]
        for event in ["BATCH_END"] + (["EPOCH_END"] if n % spe == 0 else []):
            if event != match_event or completed:
                continue
            time = n / total if su == "dur" else (n // spe if event == "EPOCH_END" else (n - 1) // spe)
            if not time >= sv:
                continue
            if not started:  # _initialize_swa: a fresh AveragedModel
                started, n_avg = True, 0
            if counter % iv[0] == 0:
                avg = p.copy() if n_avg == 0 else avg + (p - avg) / np.float32(n_avg + 1)
                n_avg += 1
            counter += 1
            if time >= ev_:
                completed, p = True, avg.copy()
        out.append((p.copy(), n_avg, None if avg is None else avg.copy()))
    return out


@pytest.mark.parametrize("start,end,interval,spe,total", [
    ("0.25dur", "0.75dur", "1ba", 4, 12),
    ("0.25dur", "0.75dur", "2ba", 4, 12),
    ("0.2dur", "0.9dur", "1ep", 3, 12),
    ("1ep", "3ep", "1ba", 4, 20),
    ("1ep", "3ep", "1ep", 4, 20),
    ("1ep", "4ep", "2ep", 4, 24),
    ("0.5dur", "0.95dur", "3ba", 5, 10),
    ("0.0dur", "0.05dur", "1ba", 5, 10),
    ("1ep", "9ep", "1ba", 4, 12),
])
def test_matches_composer_event_logic(start, end, interval, spe, total, key):
    st, en, iv = _t(start), _t(end), _t(interval)
    deltas = np.asarray(jax.random.normal(key, (total, 5)), np.float32)
    p0 = np.zeros(5, np.float32)
    ref = _composer_reference(deltas, p0, (st.value, st.unit.value), (en.value, en.unit.value),
                              (iv.value, iv.unit.value), spe, total)
    m = SWA(swa_start=start, swa_end=end, update_interval=interval)
    # built from each step's ctx, as the Trainer does; params move by exactly the given deltas
    tx_at = lambda s: m.tx(optax.identity(), make_ctx(s, total_steps=total, steps_per_epoch=spe, base_lr=0.1))
    step = jax.jit(lambda p, o, d, s: (lambda u, o2: (optax.apply_updates(p, u), o2))(*tx_at(s).update(d, o, p)))
    p, opt = jnp.asarray(p0), tx_at(0).init(jnp.asarray(p0))
    for n in range(total):
        p, opt = step(p, opt, jnp.asarray(deltas[n]), n)
        want_p, want_n, want_avg = ref[n]
        assert int(opt.swa_n) == want_n, (n + 1, ref)
        np.testing.assert_allclose(p, want_p, rtol=1e-6, atol=1e-6, err_msg=str(n + 1))
        if want_avg is not None:
            np.testing.assert_allclose(opt.average, want_avg, rtol=1e-6, atol=1e-6)
    assert m.schedule is None  # no SWALR unless asked


def _torch_swalr(lr0, swa_lr, anneal_epochs, strategy, n_steps):
    """torch.optim.swa_utils.SWALR.get_lr, replayed: the LR after each of n_steps .step() calls."""
    f = (lambda t: t) if strategy == "linear" else (lambda t: (1 - math.cos(math.pi * t)) / 2)
    state = {"lr": lr0, "count": 0}

    def step():
        state["count"] += 1
        s = state["count"] - 1
        prev_alpha = f(max(0, min(1, (s - 1) / max(1, anneal_epochs))))
        prev_lr = swa_lr if prev_alpha == 1 else (state["lr"] - prev_alpha * swa_lr) / (1 - prev_alpha)
        alpha = f(max(0, min(1, s / max(1, anneal_epochs))))
        state["lr"] = swa_lr * alpha + prev_lr * (1 - alpha)

    step()  # the constructor's initial step leaves the LR alone
    out = []
    for _ in range(n_steps):
        step()
        out.append(state["lr"])
    return out


@pytest.mark.parametrize("strategy,anneal_steps,target", [("linear", 3, 0.25), ("cos", 3, 0.25), ("cos", 1, 0.5),
                                                          ("linear", 2, None)])
def test_swalr_schedule_matches_torch(strategy, anneal_steps, target):
    base = lambda s: 1.0 - jnp.asarray(s, jnp.float32) / 40.0
    plan = _Plan(first=4, stride=2, end=12)  # samples after batches 4, 6, 8, 10, 12
    alpha = jax.jit(swalr_schedule(base, plan, strategy, anneal_steps, target))
    a0 = 1.0 - 4 / 40
    lrs = _torch_swalr(a0, a0 if target is None else target, anneal_steps, strategy, 5)
    for s in range(20):
        k = 0 if s < 4 else min((s - 4) // 2 + 1, 5)  # samples whose batch end precedes step s
        want = 1.0 - s / 40 if k == 0 else lrs[k - 1]
        assert float(alpha(s)) == pytest.approx(want, rel=1e-6), (s, k)
    if target is None:
        assert float(alpha(15)) == pytest.approx(a0)  # swa_lr=None holds the LR in force at swa_start


def test_factory_rules():
    with pytest.raises(ValueError, match="same unit"):
        SWA(swa_start="0.5dur", swa_end="9ep")
    with pytest.raises(ValueError, match="'dur' or 'ep'"):
        SWA(swa_start="10ba", swa_end="20ba")
    with pytest.raises(ValueError, match="update_interval"):
        SWA(update_interval="0.1dur")
    with pytest.raises(ValueError, match="swa_end must be > swa_start"):
        SWA(swa_start="0.8dur", swa_end="0.7dur")
    with pytest.raises(ValueError, match="<= 1"):
        SWA(swa_start="0.5dur", swa_end="1.5dur")
    with pytest.raises(ValueError, match="anneal_steps"):
        SWA(anneal_steps=0)
    with pytest.raises(ValueError, match="anneal_strategy"):
        SWA(anneal_strategy="exp")
    with pytest.raises(ValueError, match="swa_lr"):
        SWA(swa_lr=-1.0)
    with pytest.warns(UserWarning, match="BatchNorm"):
        SWA(swa_end="1dur")
    assert "'cos'" in SWA(anneal_strategy="Cosine").description
    with pytest.raises(ValueError, match="steps_per_epoch"):  # default '1ep' needs the epoch length
        SWA().tx(optax.sgd(0.1), make_ctx(0, total_steps=10, steps_per_epoch=None, base_lr=0.1))
    with pytest.raises(ValueError, match="base LR"):
        SWA(swa_start="0.5dur", update_interval="1ba", schedule_swa_lr=True, swa_lr=0.01).schedule(
            lambda s: 1.0, make_ctx(0, total_steps=10, steps_per_epoch=None, base_lr=None))
    with pytest.raises(ValueError, match="needs params"):
        tx = SWA(update_interval="1ba").tx(optax.sgd(0.1), make_ctx(0, total_steps=10, base_lr=0.1))
        tx.update(jnp.ones(2), tx.init(jnp.ones(2)))
    # the clock is ctx.step: the state holds no counter of its own
    assert SWAState._fields == ("swa_n", "average", "inner_state")


# (2) jit == eager, no retrace; resume mid-averaging ----------------------------------------------------------------

def _sgdw():
    return optax.chain(DecoupledSGDW(lr=0.1, momentum=0.9, weight_decay=1e-4), optax.scale_by_schedule(lambda s: 1.0))


def test_jit_equals_eager_and_no_retrace(key):
    plan = _Plan(2, 2, 6)
    params = {"w": jax.random.normal(key, (4, 3)), "b": jnp.zeros((3,))}
    traces = []

    def update(g, o, p, s):
        traces.append(1)
        u, o = swa_tx(_sgdw(), plan, s).update(g, o, p)
        return optax.apply_updates(p, u), o

    jupdate = jax.jit(update)
    jp = ep = params
    jo = eo = swa_tx(_sgdw(), plan, 0).init(params)
    for s in range(8):
        g = jax.tree.map(lambda x: jax.random.normal(jax.random.fold_in(key, s), x.shape), params)
        (jp, jo), (ep, eo) = jupdate(g, jo, jp, s), update(g, eo, ep, s)
        jax.tree.map(lambda a, b: np.testing.assert_allclose(a, b, rtol=1e-6, atol=1e-7), (jp, jo), (ep, eo))
    assert int(jo.swa_n) == 3 and len(traces) == 1 + 8  # samples after batches 2, 4, 6; one trace for jit


def test_resume_mid_averaging_is_bitwise(key):
    plan = _Plan(2, 1, 7)
    params = {"w": jax.random.normal(key, (4, 3))}

    def run(p, o, steps):
        # a fresh wrapper for every step, from the clock (the step index), as the Trainer builds it
        step = jax.jit(lambda p, o, g, s: (lambda u, o2: (optax.apply_updates(p, u), o2))(
            *swa_tx(_sgdw(), plan, s).update(g, o, p)))
        for s in steps:
            p, o = step(p, o, jax.tree.map(lambda x: jax.random.normal(jax.random.fold_in(key, s), x.shape), p), s)
        return p, o

    init = lambda: swa_tx(_sgdw(), plan, 0).init(params)
    straight = run(params, init(), range(9))
    half = run(params, init(), range(4))  # 3 samples in, the replacement still ahead
    assert int(half[1].swa_n) == 3
    restored = jax.tree.map(lambda x: jnp.asarray(np.asarray(x)), half)
    # a checkpoint holds the state (no clock inside it); the resumed run's clock restarts at 4
    assert jax.tree_util.tree_structure(restored[1]) == jax.tree_util.tree_structure(init())
    resumed = run(*restored, range(4, 9))
    jax.tree.map(np.testing.assert_array_equal, resumed, straight)


# (3)+(4) in the Trainer: sampling, replacement at swa_end, SWALR, checkpoint resume ------------------------------

class _Recorder(Callback):
    def __init__(self):
        self.params, self.swa = [], []

    def batch_end(self, state, logger):
        ts = state.train_state
        self.params.append(np.array(ts.params["hidden"][0]["kernel"][...]))
        swa = find_swa_state(ts.opt_state)
        self.swa.append((int(swa.swa_n), np.array(swa.average["hidden"][0]["kernel"][...])))


def _trainer(**kw):
    task = ComposerClassifier(MLP(64, hidden=(16,), num_classes=10, rngs=nnx.Rngs(0)), num_classes=10)
    swa = SWA(swa_start="0.25dur", swa_end="0.75dur", update_interval="2ba", schedule_swa_lr=True, swa_lr=0.02,
              anneal_steps=2)
    return Trainer(model=task, train_dataloader=ArrayLoader(digits("train", n=256), 32, seed=3), max_duration="2ep",
                   optimizers=DecoupledSGDW(lr=0.1, momentum=0.9), algorithms=[swa], seed=7, progress_bar=False,
                   devices=jax.devices()[:1], **kw)


def test_trainer_averages_replaces_and_resumes(tmp_path):
    rec = _Recorder()
    straight = _trainer(callbacks=[rec])
    # 16 batches: samples after batches 4, 6, 8, 10, 12; params replaced after 12. SWALR from 1.0 to 0.02/0.1.
    assert [round(float(straight.lr_multiplier(s)), 6) for s in (0, 3, 4, 5, 6, 15)] == [1, 1, 0.6, 0.6, 0.2, 0.2]
    straight.fit()
    swa_n = [n for n, _ in rec.swa]
    assert swa_n == [0, 0, 0, 1, 1, 2, 2, 3, 3, 4, 4, 5, 5, 5, 5, 5]
    after = lambda b: rec.params[b - 1]  # params after batch b
    np.testing.assert_allclose(rec.swa[9][1], np.mean([after(b) for b in (4, 6, 8, 10)], 0), rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(after(12), rec.swa[11][1], rtol=0, atol=1e-6)  # the model is now the average
    assert not np.allclose(after(12), after(11))
    for b in range(13, 17):  # training goes on from the average; the average no longer moves
        assert not np.array_equal(after(b), after(b - 1))
        np.testing.assert_array_equal(rec.swa[b - 1][1], rec.swa[11][1])

    first = _trainer(callbacks=[stop_at(7)])  # mid-averaging: 2 samples in; the plan (total steps) unchanged
    first.fit()
    assert first.state.timestamp.batch == 7
    first.save_checkpoint(tmp_path / "ckpt")
    resumed = _trainer(load_path=tmp_path / "ckpt")
    resumed.fit()
    a, b = jax.tree_util.tree_leaves(straight.state.train_state), jax.tree_util.tree_leaves(resumed.state.train_state)
    assert len(a) == len(b)
    for x, y in zip(a, b):
        np.testing.assert_array_equal(np.asarray(x), np.asarray(y))
