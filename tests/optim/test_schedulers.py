"""Schedulers against Composer's documented scheduler formulas (hand-computed), jit safety, and SSR semantics."""
import math
import warnings

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from jaxcomposer.core.time import Time
from jaxcomposer.optim import (
    ConstantScheduler,
    ConstantWithWarmupScheduler,
    CosineAnnealingScheduler,
    CosineAnnealingWarmRestartsScheduler,
    CosineAnnealingWithWarmupScheduler,
    ExponentialScheduler,
    LinearScheduler,
    LinearWithWarmupScheduler,
    MultiStepScheduler,
    MultiStepWithWarmupScheduler,
    PolynomialScheduler,
    PolynomialWithWarmupScheduler,
    StepScheduler,
    compose_schedules,
)

MAX, SPE = 100, 10  # a run of 100 batches, 10 per epoch


def cos(x, a_f=0.0):
    return a_f + (1 - a_f) * 0.5 * (1 + math.cos(math.pi * x))


# (scheduler, {step: expected alpha}) computed by hand from Composer's formulas.
CASES = [
    (StepScheduler("2ep", gamma=0.5), {0: 1.0, 19: 1.0, 20: 0.5, 45: 0.25, 99: 0.5**4}),
    (StepScheduler("30ba"), {29: 1.0, 30: 0.1, 60: 0.1**2}),
    (MultiStepScheduler(["3ep", "50ba", "0.8dur"], gamma=0.5), {0: 1.0, 29: 1.0, 30: 0.5, 50: 0.25, 80: 0.125}),
    (ConstantScheduler(alpha=0.3, t_max="40ba"), {0: 0.3, 39: 0.3, 40: 1.0, 99: 1.0}),
    (ConstantScheduler(), {0: 1.0, 99: 1.0}),
    (LinearScheduler(), {0: 1.0, 25: 0.75, 50: 0.5, 100: 0.0}),
    (LinearScheduler(alpha_i=0.2, alpha_f=1.0, t_max="40ba"), {0: 0.2, 10: 0.4, 40: 1.0, 90: 1.0}),
    (ExponentialScheduler(gamma=0.5), {0: 1.0, 10: 0.5, 15: 0.5**1.5, 30: 0.125}),
    (ExponentialScheduler(0.9, decay_period="4ba"), {6: 0.9**1.5}),
    (CosineAnnealingScheduler(), {0: 1.0, 25: cos(0.25), 50: 0.5, 100: 0.0}),
    (CosineAnnealingScheduler(t_max="5ep", alpha_f=0.1), {0: 1.0, 25: cos(0.5, 0.1), 50: 0.1, 80: 0.1}),
    (CosineAnnealingWarmRestartsScheduler("2ep"), {0: 1.0, 10: 0.5, 19: cos(19 / 20), 20: 1.0, 30: 0.5}),
    # t_mult=2: cycles [0, 10), [10, 30), [30, 70), [70, 150)
    (CosineAnnealingWarmRestartsScheduler("10ba", t_mult=2.0, alpha_f=0.2),
     {5: cos(0.5, 0.2), 10: 1.0, 20: cos(0.5, 0.2), 30: 1.0, 50: cos(0.5, 0.2), 70: 1.0, 90: cos(0.25, 0.2)}),
    # t_mult=1.5 truncates each cycle: 10, 15, 22, 33, 49 -> starts 0, 10, 25, 47, 80
    (CosineAnnealingWarmRestartsScheduler("10ba", t_mult=1.5),
     {12: cos(2 / 15), 25: 1.0, 47: 1.0, 60: cos(13 / 33), 80: 1.0}),
    (PolynomialScheduler(power=2.0), {0: 1.0, 50: 0.25, 90: 0.01 ** 1, 100: 0.0}),
    (PolynomialScheduler(power=0.5, t_max="50ba", alpha_f=0.1), {0: 1.0, 25: 0.1 + 0.9 * 0.5**0.5, 50: 0.1, 99: 0.1}),
    (MultiStepWithWarmupScheduler("5ba", ["20ba", "4ep"], gamma=0.5),
     {0: 0.0, 2: 0.4, 5: 1.0, 19: 1.0, 20: 0.5, 40: 0.25}),
    (ConstantWithWarmupScheduler("10ba", alpha=0.5, t_max="50ba"), {0: 0.0, 4: 0.2, 10: 0.5, 49: 0.5, 50: 1.0}),
    (LinearWithWarmupScheduler("20ba", alpha_i=0.8, alpha_f=0.2), {0: 0.0, 10: 0.4, 20: 0.8, 60: 0.5, 100: 0.2}),
    (CosineAnnealingWithWarmupScheduler("1ep"), {0: 0.0, 5: 0.5, 10: 1.0, 55: 0.5, 100: 0.0}),
    (CosineAnnealingWithWarmupScheduler("20ba", alpha_f=0.1), {10: 0.5, 40: cos(0.25, 0.1), 100: 0.1}),
    (PolynomialWithWarmupScheduler("0.2dur"), {0: 0.0, 10: 0.5, 20: 1.0, 60: 0.25, 100: 0.0}),
    (PolynomialWithWarmupScheduler("20ba", power=1.0, alpha_f=0.5), {60: 0.75}),
]


@pytest.mark.parametrize("sched, expected", CASES, ids=lambda x: repr(x)[:60] if not isinstance(x, dict) else "")
def test_values_match_formulas(sched, expected):
    fn = sched.schedule(max_batches=MAX, steps_per_epoch=SPE)
    for step, want in expected.items():
        got = fn(step)
        assert got.dtype == jnp.float32 and got.shape == ()
        np.testing.assert_allclose(float(got), want, rtol=1e-5, atol=1e-6, err_msg=f"{sched!r} at step {step}")


@pytest.mark.parametrize("sched, expected", CASES, ids=lambda x: repr(x)[:60] if not isinstance(x, dict) else "")
def test_jit_matches_python(sched, expected):
    fn = sched.schedule(max_batches=MAX, steps_per_epoch=SPE)
    jitted = jax.jit(fn)
    steps = jnp.arange(0, MAX + 1, 7, dtype=jnp.int32)
    eager = np.array([float(fn(int(s))) for s in steps])
    np.testing.assert_allclose(np.array([float(jitted(s)) for s in steps]), eager, rtol=1e-6, atol=1e-7)
    np.testing.assert_allclose(np.asarray(jax.vmap(fn)(steps)), eager, rtol=1e-6, atol=1e-7)


def test_string_and_time_arguments_are_equivalent():
    a = CosineAnnealingWithWarmupScheduler("8ep", t_max="100ba")
    b = CosineAnnealingWithWarmupScheduler(Time(8, "ep"), t_max=Time(100, "ba"))
    assert a == b and a.t_warmup == Time(8, "ep")
    assert repr(a).startswith("CosineAnnealingWithWarmupScheduler(t_warmup=Time(8, TimeUnit.EPOCH)")


def test_defaults_match_composer():
    assert StepScheduler("1ep").gamma == 0.1
    assert ConstantScheduler().alpha == 1.0 and ConstantScheduler().t_max == Time(1.0, "dur")
    assert (LinearScheduler().alpha_i, LinearScheduler().alpha_f) == (1.0, 0.0)
    assert ExponentialScheduler(0.5).decay_period == Time(1, "ep")
    assert CosineAnnealingWarmRestartsScheduler("1ep").t_mult == 1.0
    assert PolynomialWithWarmupScheduler("1ba").power == 2.0
    assert MultiStepWithWarmupScheduler("1ba", ["2ba"]).scale_warmup is False


def test_ssr_scales_everything_but_dur_and_warmup():
    # Composer: max_duration 100ba with ssr=0.5 -> the trainer passes 50 scaled batches.
    step_fn = StepScheduler("20ba", gamma=0.5).schedule(max_batches=50, steps_per_epoch=SPE, ssr=0.5)
    assert float(step_fn(9)) == 1.0 and float(step_fn(10)) == 0.5  # 20ba * 0.5 = 10
    ms = MultiStepScheduler(["2ep"]).schedule(max_batches=50, steps_per_epoch=SPE, ssr=0.5)
    assert float(ms(9)) == 1.0 and np.isclose(float(ms(10)), 0.1)  # 2ep = 20ba, scaled to 10
    # '1dur' is already relative to the scaled run: not scaled again.
    cos_fn = CosineAnnealingScheduler().schedule(max_batches=50, steps_per_epoch=SPE, ssr=0.5)
    np.testing.assert_allclose(float(cos_fn(25)), 0.5, atol=1e-6)
    # Warmup is not scaled by default: 10ba of warmup stays 10ba; the cosine then spans [10, 50).
    warm = CosineAnnealingWithWarmupScheduler("10ba").schedule(max_batches=50, steps_per_epoch=SPE, ssr=0.5)
    np.testing.assert_allclose([float(warm(5)), float(warm(10)), float(warm(30))], [0.5, 1.0, 0.5], atol=1e-6)
    scaled = CosineAnnealingWithWarmupScheduler("10ba", scale_warmup=True).schedule(
        max_batches=50, steps_per_epoch=SPE, ssr=0.5
    )
    np.testing.assert_allclose([float(scaled(0)), float(scaled(2)), float(scaled(5)), float(scaled(50))],
                               [0.0, 0.4, 1.0, 0.0], atol=1e-6)


def test_ssr_equals_time_compression():
    """alpha_sigma(t) = alpha(t / sigma) for a schedule written in batches (Composer's definition of SSR)."""
    sched = LinearScheduler(alpha_f=0.1, t_max="80ba")
    base = sched.schedule(max_batches=100, steps_per_epoch=None)
    half = sched.schedule(max_batches=50, steps_per_epoch=None, ssr=0.5)
    for t in range(0, 50, 5):
        np.testing.assert_allclose(float(half(t)), float(base(2 * t)), atol=1e-6)


def test_zero_warmup_warns_and_skips_warmup():
    with pytest.warns(UserWarning, match="t_warmup"):
        fn = LinearWithWarmupScheduler("0ba").schedule(max_batches=MAX, steps_per_epoch=SPE)
    assert float(fn(0)) == 1.0


def test_warmup_longer_than_t_max_raises():
    with pytest.raises(ValueError, match="t_warmup"):
        CosineAnnealingWithWarmupScheduler("20ba", t_max="10ba").schedule(max_batches=10, steps_per_epoch=None)
    with pytest.raises(ValueError, match="t_warmup"):
        MultiStepWithWarmupScheduler("200ba", ["10ba"]).schedule(max_batches=100, steps_per_epoch=None)


def test_t_max_shorter_than_run_raises_for_warmup_schedulers():
    with pytest.raises(ValueError, match="max_duration"):
        LinearWithWarmupScheduler("5ba", t_max="50ba").schedule(max_batches=100, steps_per_epoch=None)


def test_warmup_equal_to_t_max_holds_peak():
    fn = CosineAnnealingWithWarmupScheduler("100ba", t_max="100ba").schedule(max_batches=100, steps_per_epoch=None)
    assert float(fn(50)) == 0.5 and float(fn(100)) == 1.0  # Composer: fraction 0 when t_max == t_warmup


def test_conversion_errors_are_clear():
    with pytest.raises(ValueError, match="steps_per_epoch"):
        StepScheduler("1ep").schedule(max_batches=MAX, steps_per_epoch=None)
    with pytest.raises(ValueError, match="step_size"):
        StepScheduler("0ba").schedule(max_batches=MAX, steps_per_epoch=None)
    with pytest.raises(ValueError, match="max_batches"):
        StepScheduler("1ba").schedule(max_batches=0, steps_per_epoch=None)
    with pytest.raises(TypeError, match="t_max"):
        CosineAnnealingScheduler(t_max=5)
    with pytest.raises(ValueError, match="shrinks"):
        CosineAnnealingWarmRestartsScheduler("2ba", t_mult=0.4).schedule(max_batches=MAX, steps_per_epoch=None)
    s = StepScheduler("64sp").schedule(max_batches=MAX, steps_per_epoch=None, batch_size=32)
    assert np.isclose(float(s(2)), 0.1) and float(s(1)) == 1.0


def test_compose_schedules_multiplies():
    kw = dict(max_batches=MAX, steps_per_epoch=SPE)
    both = compose_schedules([LinearScheduler(), StepScheduler("5ep", gamma=0.5)], **kw)
    np.testing.assert_allclose(float(both(60)), 0.4 * 0.5, atol=1e-6)
    np.testing.assert_allclose(float(jax.jit(both)(jnp.int32(60))), 0.2, atol=1e-6)
    empty = compose_schedules([], **kw)
    assert float(empty(17)) == 1.0 and empty(17).dtype == jnp.float32


def test_works_as_optax_schedule():
    fn = LinearScheduler().schedule(max_batches=4, steps_per_epoch=None)
    tx = optax.chain(optax.sgd(1.0), optax.scale_by_schedule(fn))
    params = jnp.zeros(2)
    state = tx.init(params)
    seen = []
    for _ in range(3):
        updates, state = jax.jit(tx.update)(jnp.ones(2), state, params)
        seen.append(float(-updates[0]))
    np.testing.assert_allclose(seen, [1.0, 0.75, 0.5], atol=1e-6)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # plain schedulers must not warn
        CosineAnnealingScheduler().schedule(max_batches=4, steps_per_epoch=None)
