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
    (ConstantWithWarmupScheduler("10ba", alpha=0.5), {0: 0.0, 4: 0.2, 10: 0.5, 99: 0.5, 100: 0.5}),
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


def test_warmup_longer_than_t_max_warns_and_ramps_as_composer():
    # Composer refuses neither: the ramp t / t_warmup runs for the whole run. We compute the same and warn.
    with pytest.warns(UserWarning, match="t_warmup='20ba' .*longer than t_max"):
        fn = CosineAnnealingWithWarmupScheduler("20ba", t_max="10ba").schedule(max_batches=10, steps_per_epoch=None)
    np.testing.assert_allclose([float(fn(s)) for s in (0, 5, 9)], [0.0, 0.25, 0.45], atol=1e-6)
    with pytest.warns(UserWarning, match="longer than max_duration"):
        fn = MultiStepWithWarmupScheduler("200ba", ["10ba"]).schedule(max_batches=100, steps_per_epoch=None)
    np.testing.assert_allclose([float(fn(s)) for s in (50, 99)], [0.25, 0.495], atol=1e-6)


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


# ----- Composer's fail-fast rules for the warmup schedulers with a t_max -------------------------------------------
# (t_warmup, t_max, max_duration, ssr, expected): None = accepted, else (error type, text the message has).
# Composer converts 'dur' to max_duration's unit ('ba' for 'ep'), 'ep' to 'ba', scales t_max (not 'dur') by ssr,
# then requires t_warmup and t_max in one unit and t_max >= max_duration where the units compare. Runs are 100
# batches: 10 per epoch, 32 samples per batch (max_duration '3200sp'), max_batches scaled by ssr.
UNITS = "Cannot use warmup scheduler"
SHORT = "greater than or equal to max_duration"
WARMUP_RULES = [
    ("10ba", "1dur", "100ba", 1.0, None),
    ("10ba", "1dur", None, 1.0, None),  # no max_duration: a run of max_batches batches
    ("1ep", "1dur", "10ep", 1.0, None),  # both become 'ba'
    ("0.1dur", "100ba", "10ep", 1.0, None),
    ("320sp", "1dur", "3200sp", 1.0, None),  # 'dur' takes 'sp' from max_duration
    ("10ba", "1dur", "3200sp", 1.0, (ValueError, UNITS)),  # 'ba' vs 'dur' -> 'sp'
    ("0.1dur", "100ba", "3200sp", 1.0, (ValueError, UNITS)),  # 'dur' -> 'sp' vs 'ba'
    ("320sp", "1dur", "100ba", 1.0, (ValueError, UNITS)),
    ("10ba", "3200sp", "100ba", 1.0, (ValueError, UNITS)),
    ("320sp", "1600sp", "100ba", 1.0, None),  # same unit; 'sp' vs 'ba' max_duration cannot be compared: no check
    ("10ba", "0.75dur", "100ba", 1.0, (ValueError, SHORT)),
    ("1ep", "0.75dur", "10ep", 1.0, (ValueError, SHORT)),
    ("320sp", "0.75dur", "3200sp", 1.0, (ValueError, SHORT)),
    ("10ba", "0.75dur", None, 1.0, (ValueError, SHORT)),
    ("10ba", "9ep", "10ep", 1.0, (ValueError, SHORT)),  # 90ba < 10ep of 10 batches
    ("10ba", "99ba", "100ba", 1.0, (ValueError, SHORT)),
    ("10ba", "10ep", "100ba", 1.0, None),
    ("10ba", "200ba", "100ba", 1.0, None),
    ("10ba", "100ba", "50ba", 0.5, None),  # t_max scaled: 50ba >= the scaled 50ba
    ("10ba", "60ba", "50ba", 0.5, (ValueError, SHORT)),  # 30ba < 50ba, though the unscaled 60ba is not
    ("10sec", "1dur", "100ba", 1.0, (ValueError, "wall clock")),
]
WITH_T_MAX = [ConstantWithWarmupScheduler, LinearWithWarmupScheduler, CosineAnnealingWithWarmupScheduler,
              PolynomialWithWarmupScheduler]


@pytest.mark.parametrize("cls", WITH_T_MAX, ids=lambda c: c.__name__)
@pytest.mark.parametrize("t_warmup, t_max, max_duration, ssr, expected", WARMUP_RULES)
def test_warmup_unit_and_t_max_rules(cls, t_warmup, t_max, max_duration, ssr, expected):
    sched = cls(t_warmup, t_max=t_max)
    kw = dict(max_batches=int(100 * ssr), steps_per_epoch=SPE, ssr=ssr, batch_size=32, max_duration=max_duration)
    if expected is None:
        fn = sched.schedule(**kw)
        assert fn(0).dtype == jnp.float32
        return
    error, text = expected
    with pytest.raises(error, match=text) as info:
        sched.schedule(**kw)
    msg = str(info.value)
    assert type(info.value) is error
    as_written = {name: Time.from_timestring(v).to_timestring() for name, v in (("t_warmup", t_warmup),
                                                                                  ("t_max", t_max))}
    if text == "wall clock":
        assert f"t_warmup={as_written['t_warmup']!r}" in msg
        return
    assert msg.startswith(f"{cls.__name__}: ")  # names the scheduler ...
    assert f"t_max={as_written['t_max']!r}" in msg  # ... and the argument, with its value
    if text == UNITS:  # ... both arguments, and the expected unit
        assert f"t_warmup={as_written['t_warmup']!r}" in msg and "same units" in msg and "give t_warmup in '" in msg
    else:  # ... the run length it falls short of, and the fix
        assert f"max_duration={(max_duration or '100ba')!r}" in msg and "Use t_max='1dur'" in msg


@pytest.mark.parametrize("t_warmup, max_duration", [("10ba", "3200sp"), ("0.1dur", "3200sp"), ("320sp", "100ba")])
def test_multistep_with_warmup_has_no_unit_checks(t_warmup, max_duration):
    """Composer's MultiStepWithWarmupScheduler runs neither check; its milestones do not need a t_max."""
    fn = MultiStepWithWarmupScheduler(t_warmup, ["50ba"], gamma=0.5).schedule(
        max_batches=100, steps_per_epoch=SPE, batch_size=32, max_duration=max_duration)
    np.testing.assert_allclose([float(fn(5)), float(fn(49)), float(fn(50))], [0.5, 1.0, 0.5], atol=1e-6)


def test_checks_run_before_anything_is_compiled():
    # compose_schedules builds every scheduler first; a refused one raises before any alpha exists or is traced.
    calls = []

    class Spy(LinearScheduler):
        def _build(self, ctx):
            calls.append(ctx)
            return super()._build(ctx)

    with pytest.raises(ValueError, match="PolynomialWithWarmupScheduler: t_max='0.75dur'"):
        compose_schedules([PolynomialWithWarmupScheduler("10ba", t_max="0.75dur"), Spy()], max_batches=MAX,
                          steps_per_epoch=SPE)
    assert calls == []


@pytest.mark.parametrize(
    "max_duration, max_batches, error, text",
    [
        ("90ba", 100, ValueError, "is 90 batches but max_batches=100"),
        ("9ep", 100, ValueError, "is 90 batches but max_batches=100"),
        ("0.5dur", 100, ValueError, "expected a positive time in 'ep', 'ba', 'sp' or 'tok'"),
        ("1h", 100, ValueError, "expected a positive time"),
        (100, 100, TypeError, "max_duration must be a Time or a time string"),
    ],
)
def test_max_duration_argument_is_checked(max_duration, max_batches, error, text):
    with pytest.raises(error, match=text):
        LinearWithWarmupScheduler("10ba").schedule(max_batches=max_batches, steps_per_epoch=SPE,
                                                  max_duration=max_duration)


def composer_constant_with_warmup(t, t_warmup, alpha):
    """Composer's ConstantWithWarmupScheduler: LinearWithWarmupScheduler(alpha_i=alpha, alpha_f=alpha), i.e. the
    ramp alpha * t / t_warmup before t_warmup and alpha from then on, after t_max too."""
    return alpha * t / t_warmup if t < t_warmup else alpha


@pytest.mark.parametrize(
    "kwargs, schedule_kw, t_warmup_batches, steps",
    [
        # t_max = max_duration: the last step and beyond (a run continued by fit(duration=...)) are after t_max.
        (dict(t_warmup="10ba", alpha=0.5), dict(max_duration="100ba"), 10, [0, 4, 9, 10, 55, 99, 100, 150]),
        (dict(t_warmup="1ep", alpha=3.0, t_max="100ba"), dict(max_duration="10ep"), 10, [0, 5, 10, 100, 120]),
        (dict(t_warmup="0.2dur", alpha=2.0, t_max="2dur"), dict(), 20, [0, 10, 20, 100, 199, 200, 250]),
        # t_max in samples, max_duration in batches: not comparable, so not checked; t_max = batch 50 < the run.
        (dict(t_warmup="320sp", alpha=0.25, t_max="1600sp"), dict(max_duration="100ba", batch_size=32), 10,
         [0, 5, 10, 49, 50, 75, 99]),
        (dict(t_warmup="10ba", alpha=0.5, scale_warmup=True), dict(ssr=0.5, max_duration="50ba"), 5,
         [0, 2, 5, 49, 50]),
    ],
)
def test_constant_with_warmup_matches_composer(kwargs, schedule_kw, t_warmup_batches, steps):
    sched = ConstantWithWarmupScheduler(**kwargs)
    max_batches = 50 if schedule_kw.get("ssr") == 0.5 else MAX
    fn = sched.schedule(max_batches=max_batches, steps_per_epoch=SPE, **schedule_kw)
    got = [float(fn(s)) for s in steps]
    want = [composer_constant_with_warmup(s, t_warmup_batches, kwargs["alpha"]) for s in steps]
    np.testing.assert_allclose(got, want, rtol=1e-6, atol=1e-7)
    assert float(fn(steps[-1])) == pytest.approx(kwargs["alpha"])  # after t_max: alpha, not 1.0


def test_function_schedulers_are_called_as_composer_calls_them():
    """Composer's compile_composer_scheduler passes ``ssr`` only to a function whose signature takes more than the
    state: ``def sched(state): return 0.5`` is Composer-valid and must not get two arguments; with ``ssr != 1`` a
    one-parameter function cannot be scaled and raises, as Composer's."""
    from jaxcomposer.errors import ConfigurationError
    from jaxcomposer.optim import call_function_scheduler

    state, calls = object(), []

    def one(state):
        calls.append(("one", state))
        return 0.5

    def two(state, ssr=1.0):
        calls.append(("two", state, ssr))
        return 0.25 * ssr

    assert call_function_scheduler(one, state, 1.0) == 0.5
    assert call_function_scheduler(lambda s: 0.125, state) == 0.125
    assert call_function_scheduler(two, state, 0.5) == 0.125
    assert call_function_scheduler(lambda s, r: r, state, 2.0) == 2.0
    assert calls == [("one", state), ("two", state, 0.5)]
    with pytest.raises(ConfigurationError, match="does not support `scale_schedule_ratio`") as info:
        call_function_scheduler(one, state, 0.5)
    assert isinstance(info.value, ValueError) and len(calls) == 2  # refused before calling it
    with pytest.raises(TypeError):  # no parameter at all: Composer's two-argument call fails
        call_function_scheduler(lambda: 1.0, state)
