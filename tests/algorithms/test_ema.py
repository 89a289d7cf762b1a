import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxcomposer.algorithms import EMA, compute_ema
from jaxcomposer.core.time import Time
from tests.algorithms.algo_testing import make_ctx
from jaxcomposer import algorithms
from tests.algorithms.algo_testing import Example

# one representative configuration: the composition table and the Trainer contract run it
EXAMPLE = Example(lambda: algorithms.EMA(half_life="2ba"))


def _smoothing_of(m):
    # The smoothing a factory chose, read back through one update from a started average: ema=1, params=0.
    extra = {"params": jnp.ones(()), "state": {}, "started": jnp.ones((), bool)}
    out = m.post_step.update(extra, jnp.zeros(()), {}, make_ctx(999, total_steps=1000))
    return float(out["params"])


# (1) functional numerics ----------------------------------------------------------------------------------------

def test_compute_ema_hand_checked_and_identities():
    params = {"w": jnp.array([1.0, 2.0]), "n": jnp.array(7, jnp.int32)}
    ema = {"w": jnp.array([3.0, 4.0]), "n": jnp.array(1, jnp.int32)}
    out = compute_ema(params, ema, smoothing=0.75)
    np.testing.assert_allclose(out["w"], [2.5, 3.5], rtol=1e-6)  # 0.75 * ema + 0.25 * params
    assert int(out["n"]) == 7 and out["n"].dtype == jnp.int32  # integer leaves are copied, not averaged
    np.testing.assert_array_equal(compute_ema(params, ema, 1.0)["w"], ema["w"])
    np.testing.assert_array_equal(compute_ema(params, ema, 0.0)["w"], params["w"])
    bf = compute_ema({"w": jnp.ones(2, jnp.bfloat16)}, {"w": jnp.zeros(2, jnp.bfloat16)}, 0.5)
    assert bf["w"].dtype == jnp.bfloat16


def test_factory_rules():
    assert _smoothing_of(EMA()) == pytest.approx(2 ** (-1 / 1000), rel=1e-5)
    assert _smoothing_of(EMA(half_life="100ba", update_interval="20ba")) == pytest.approx(2 ** -0.2, rel=1e-5)
    assert _smoothing_of(EMA(half_life=None, smoothing=0.9)) == pytest.approx(0.9, rel=1e-5)
    assert _smoothing_of(EMA(half_life="0ba")) == pytest.approx(0.0)  # half life 0: no averaging
    EMA(half_life=Time(10, "ba"))  # Time objects are accepted too
    with pytest.raises(ValueError, match="only one of"):
        EMA(smoothing=0.9)  # Composer: half_life defaults to '1000ba', so pass half_life=None with smoothing
    with pytest.raises(ValueError, match="give either half_life"):
        EMA(half_life=None)
    with pytest.raises(ValueError, match="must match"):
        EMA(half_life="10ba", update_interval="1ep")
    with pytest.raises(ValueError, match="update_interval"):
        EMA(half_life=None, smoothing=0.9, update_interval="0.1dur")
    with pytest.raises(ValueError, match="ema_start"):
        EMA(ema_start="100sp")
    with pytest.raises(ValueError, match="smoothing"):
        EMA(half_life=None, smoothing=1.5)
    with pytest.raises(ValueError, match="time string"):
        EMA(half_life=10)


def _composer_reference(n_steps, smoothing, interval, unit, start, steps_per_epoch, total_steps):
    """Composer's EMA event logic, replayed in Python on scalar weights w_n = n (the weights after batch n).

    Update event: BATCH_END (unit 'ba') or EPOCH_END ('ep'). At the first update event where ``_should_start``,
    the average restarts from the current weights; on update events after that, ``compute_ema`` runs when the
    timestamp (batches or epochs) is a multiple of the interval. Returns (ema, started) after each batch.
    """
    ema, started, out = 0.0, False, []
    for n in range(1, n_steps + 1):
        is_epoch_end = n % steps_per_epoch == 0
        for event in (["BATCH_END"] + (["EPOCH_END"] if is_epoch_end else [])):
            if event != ("BATCH_END" if unit == "ba" else "EPOCH_END"):
                continue
            epoch = n // steps_per_epoch if event == "EPOCH_END" else (n - 1) // steps_per_epoch
            sv, su = start
            now = {"dur": n / total_steps, "ba": n, "ep": epoch}[su]
            if not started and sv <= now:
                ema, started = float(n), True
            if started and ({"ba": n, "ep": epoch}[unit] % interval == 0):
                ema = smoothing * ema + (1 - smoothing) * n
        out.append((ema, started))
    return out


@pytest.mark.parametrize("half_life,update_interval,ema_start", [
    ("1ba", None, "0.0dur"),
    ("3ba", "3ba", "0.0dur"),
    ("4ba", "2ba", "5ba"),
    ("2ba", None, "0.5dur"),
    ("2ba", None, "0.3dur"),
    ("1ep", None, "0.0dur"),
    ("2ep", "2ep", "1ep"),
    ("2ba", "1ba", "1ep"),
])
def test_schedule_matches_composer_event_logic(half_life, update_interval, ema_start):
    total, spe = 10, 3
    m = EMA(half_life=half_life, update_interval=update_interval, ema_start=ema_start)
    hl, ui = Time.from_timestring(half_life), Time.from_timestring(update_interval or f"1{half_life[-2:]}")
    st = Time.from_timestring(ema_start)
    smoothing = 2 ** (-(ui.value / hl.value))
    ref = _composer_reference(total, smoothing, ui.value, ui.unit.value, (st.value, st.unit.value), spe, total)
    extra = m.post_step.init(jnp.zeros(()), {"bn": jnp.zeros(()), "count": jnp.zeros((), jnp.int32)},
                             make_ctx(0, total_steps=total, steps_per_epoch=spe))
    # ctx.run's static facts (total_steps, steps_per_epoch) must stay Python ints: build the ctx inside jit.
    update = jax.jit(lambda e, p, s, step: m.post_step.update(e, p, s, make_ctx(step, total_steps=total,
                                                                                    steps_per_epoch=spe)))
    for step in range(total):
        n = step + 1
        state = {"bn": jnp.asarray(-n, jnp.float32), "count": jnp.asarray(n, jnp.int32)}
        extra = update(extra, jnp.asarray(n, jnp.float32), state, step)
        want, started = ref[step]
        assert bool(extra["started"]) == started, (step, ref)
        if started:
            np.testing.assert_allclose(float(extra["params"]), want, rtol=1e-6, err_msg=str((step, ref)))
            np.testing.assert_allclose(float(extra["state"]["bn"]), -want, rtol=1e-6)  # buffers averaged too
        assert int(extra["state"]["count"]) == n  # integer state tracks the model
        p, s = m.eval(extra, jnp.asarray(n, jnp.float32), state, make_ctx(step, total_steps=total, steps_per_epoch=spe))
        assert float(p) == (pytest.approx(want) if started else n)  # raw weights until the average starts
        assert float(s["bn"]) == (pytest.approx(-want) if started else -n)


def test_epoch_units_need_steps_per_epoch():
    m = EMA(half_life="1ep")
    extra = m.post_step.init(jnp.zeros(()), {}, make_ctx(0))
    with pytest.raises(ValueError, match="steps_per_epoch"):
        m.post_step.update(extra, jnp.ones(()), {}, make_ctx(0))


def test_init_copies_and_keeps_structure(key):
    params = {"a": jax.random.normal(key, (3,)), "b": {"c": jnp.ones((2, 2), jnp.bfloat16)}}
    extra = EMA().post_step.init(params, {"k": jnp.zeros((), jnp.int32)}, make_ctx(0))
    assert jax.tree_util.tree_structure(extra["params"]) == jax.tree_util.tree_structure(params)
    assert extra["params"]["b"]["c"].dtype == jnp.bfloat16 and not bool(extra["started"])
    assert extra["params"]["a"] is not params["a"]


# (2) jit == eager, no retrace -------------------------------------------------------------------------------------

def test_jit_equals_eager_and_no_retrace(key):
    m = EMA(half_life="2ba", ema_start="2ba")
    params = {"w": jax.random.normal(key, (4, 3))}
    state = {"mean": jnp.zeros((3,)), "count": jnp.zeros((), jnp.int32)}
    traces = []

    def update(extra, params, state, step):
        traces.append(1)
        return m.post_step.update(extra, params, state, make_ctx(step))

    jupdate = jax.jit(update)
    je = ee = m.post_step.init(params, state, make_ctx(0))
    for step in range(5):
        params = jax.tree_util.tree_map(lambda x: x + 0.1, params)
        state = {"mean": state["mean"] + 1.0, "count": state["count"] + 1}
        je, ee = jupdate(je, params, state, step), update(ee, params, state, step)
        jax.tree_util.tree_map(lambda a, b: np.testing.assert_allclose(a, b, rtol=1e-6), je, ee)
    assert bool(je["started"])
    assert len(traces) == 1 + 5  # one trace for jit; the eager calls run the Python body each time
    jeval = jax.jit(lambda e, p, s, step: m.eval(e, p, s, make_ctx(step)))
    jax.tree_util.tree_map(np.testing.assert_array_equal, jeval(je, params, state, 5),
                           m.eval(je, params, state, make_ctx(5)))

