"""Time, Timestamp and to_batches follow Composer's documented semantics."""
import copy
import dataclasses
import datetime
import json
import pickle

import pytest

from jaxcomposer.core.time import Time, TimeInputError, Timestamp, TimeUnit, to_batches


@pytest.mark.parametrize(
    "text, value, unit",
    [
        ("10ep", 10, TimeUnit.EPOCH),
        ("500ba", 500, TimeUnit.BATCH),
        ("0.5dur", 0.5, TimeUnit.DURATION),
        ("1dur", 1.0, TimeUnit.DURATION),
        ("3_0e10sp", 300_000_000_000, TimeUnit.SAMPLE),
        ("3e4tok", 30_000, TimeUnit.TOKEN),
        ("2iter", 2, TimeUnit.ITERATION),
        ("30sec", 30, TimeUnit.SECOND),
        ("1h20m40s", 4840, TimeUnit.SECOND),
        ("2h", 7200, TimeUnit.SECOND),
        ("5m", 300, TimeUnit.SECOND),
        ("45s", 45, TimeUnit.SECOND),
        ("12EP", 12, TimeUnit.EPOCH),
        (" 7ba ", 7, TimeUnit.BATCH),
    ],
)
def test_parse_table(text, value, unit):
    t = Time.from_timestring(text)
    assert t.unit is unit
    assert t.value == value
    assert type(t.value) is (float if unit == TimeUnit.DURATION else int)


def test_scientific_samples_exact():
    t = Time.from_timestring("3_0e10sp")
    assert t == Time(300_000_000_000, "sp")
    assert isinstance(t.value, int)


def test_fractional_non_duration_raises_type_error():
    with pytest.raises(TypeError, match="integer"):
        Time.from_timestring("1.5ep")
    with pytest.raises(TypeError):
        Time(2.5, "ba")
    with pytest.raises(TypeError, match="write 3"):  # Composer takes only an int, even for a whole float
        Time(3.0, "ba")
    assert Time.from_timestring("3.0ba").value == 3 and isinstance(Time.from_timestring("3.0ba").value, int)


# What Composer's constructors raise for invalid input (composer/core/time.py and tests/test_time.py):
# (callable, args, expected): a Time to compare with, or the exception type and text of our message.
CONSTRUCTOR_ERRORS = [
    # Time(value, unit)
    (Time, (3, "epochs"), (ValueError, "Unknown time unit 'epochs'")),
    (Time, (3, 5), (TypeError, "must be a str or TimeUnit")),
    (Time, (1.5, "ep"), (TypeError, "must be an int")),
    (Time, (3.0, "ba"), (TypeError, "write 3")),
    (Time, ("5", "ba"), (TypeError, "must be an int")),
    (Time, (None, "ba"), (TypeError, "must be an int")),
    (Time, ("x", "dur"), (ValueError, "with unit 'dur' must be a number")),  # Composer: float('x')
    (Time, (None, "dur"), (TypeError, "with unit 'dur' must be a number")),  # Composer: float(None)
    (Time, (True, "ba"), (TypeError, "bool")),  # deliberate: Composer takes True as 1
    (Time, ("0.5", "dur"), Time(0.5, "dur")),  # Composer's float(value)
    (Time, (3, "EPOCH"), Time(3, "ep")),  # Composer's StringEnum: case-insensitive name or value
    (Time, (3, "Ba"), Time(3, "ba")),
    # Time.from_timestring: Composer's tests/test_time.py bad and valid strings
    (Time.from_timestring, ("1.1iter",), (TypeError, "must be an integer")),
    (Time.from_timestring, ("1.5ep",), (TypeError, "must be an integer")),
    (Time.from_timestring, ("2.1ba",), (TypeError, "must be an integer")),
    (Time.from_timestring, ("3.2sp",), (TypeError, "must be an integer")),
    (Time.from_timestring, ("3.4tok",), (TypeError, "must be an integer")),
    (Time.from_timestring, ("0.1sec",), (TypeError, "must be an integer")),
    (Time.from_timestring, ("1.0iter",), Time(1, "iter")),
    (Time.from_timestring, ("2.0ep",), Time(2, "ep")),
    (Time.from_timestring, ("3.000ba",), Time(3, "ba")),
    (Time.from_timestring, ("030.0sp",), Time(30, "sp")),
    (Time.from_timestring, ("30sec",), Time(30, "sec")),
    (Time.from_timestring, ("4_00_0tok",), Time(4000, "tok")),
    (Time.from_timestring, ("+5ba",), Time(5, "ba")),
    (Time.from_timestring, (5,), (TypeError, "timestring must be a str")),
    (Time.from_timestring, (None,), (TypeError, "timestring must be a str")),
    (Time.from_timestring, ("10epochs",), (ValueError, "Cannot parse time string")),
    (Time.from_timestring, ("1__0ep",), (ValueError, "Cannot parse time string")),  # float('1__0') fails too
    (Time.from_timestring, ("1e400dur",), (ValueError, "not a finite number")),
    # wall clock, as Composer's strptime('%Hh%Mm%Ss'): hours 0-23, minutes and seconds 0-59
    (Time.from_timestring, ("23h59m59s",), Time(86399, "sec")),
    (Time.from_timestring, ("1h30s",), Time(3630, "sec")),
    (Time.from_timestring, ("24h",), (ValueError, "'86400sec'")),
    (Time.from_timestring, ("90m",), (ValueError, "'5400sec'")),
    (Time.from_timestring, ("60s",), (ValueError, "seconds 0-59")),
    (Time.from_timestring, ("007h",), (ValueError, "at most 2 digits")),
    (Time.from_timedelta, ("5m",), Time(300, "sec")),
    (Time.from_timedelta, ("5ba",), (ValueError, "expected 'XhYmZs'")),
    (Time.from_timedelta, (5,), (TypeError, "timestring must be a str")),
    # Time.from_input: Composer raises RuntimeError for a bare number without a unit and for other types
    (Time.from_input, (None,), (RuntimeError, "Cannot convert None")),
    (Time.from_input, ([123],), (RuntimeError, "Cannot convert [123]")),
    (Time.from_input, (1,), (RuntimeError, "no default_int_unit")),
    (Time.from_input, (1.5,), (RuntimeError, "no default_int_unit")),
    (Time.from_input, (True, "ep"), (RuntimeError, "Cannot convert True")),  # deliberate, as Time
    (Time.from_input, (1.5, "ep"), (TypeError, "must be an int")),  # from Time(1.5, 'ep'), as Composer
    (Time.from_input, (2.0, "ep"), (TypeError, "write 2")),
    (Time.from_input, ("1.5ep",), (TypeError, "must be an integer")),  # from from_timestring
    (Time.from_input, ("10epochs",), (ValueError, "Cannot parse time string")),
    (Time.from_input, (1, "ep"), Time(1, "ep")),
    (Time.from_input, (0.5, "dur"), Time(0.5, "dur")),
]


@pytest.mark.parametrize("fn, args, expected", CONSTRUCTOR_ERRORS,
                         ids=[f"{fn.__name__}{args!r}" for fn, args, _ in CONSTRUCTOR_ERRORS])
def test_constructor_errors_match_composer(fn, args, expected):
    if isinstance(expected, Time):
        got = fn(*args)
        assert got == expected and got.unit is expected.unit and type(got.value) is type(expected.value)
        return
    error, text = expected
    with pytest.raises(error) as info:
        fn(*args)
    assert text in str(info.value)
    # Composer's type exactly, or (from_input) our TimeInputError, a RuntimeError that is also a ValueError or
    # TypeError for code written against our earlier contract.
    if error is RuntimeError:
        assert isinstance(info.value, TimeInputError)
        assert isinstance(info.value, ValueError if "no default_int_unit" in text else TypeError)
    else:
        assert type(info.value) is error


@pytest.mark.parametrize("bad", ["10epochs", "ep", "", "10", "1.2.3ba", "h", "10 ep ba"])
def test_unparseable_raises_value_error_with_help(bad):
    with pytest.raises(ValueError) as info:
        Time.from_timestring(bad)
    msg = str(info.value)
    assert repr(bad) in msg
    for unit in ("'ep'", "'ba'", "'dur'", "'sp'", "'tok'", "'iter'", "'sec'"):
        assert unit in msg
    assert "'10ep'" in msg and "'500ba'" in msg and "'0.5dur'" in msg


def test_unknown_unit_in_constructor():
    with pytest.raises(ValueError, match="valid units"):
        Time(3, "epochs")


@pytest.mark.parametrize("text", ["10ep", "500ba", "0.5dur", "0.125dur", "4840sec", "300000000000sp", "7tok", "2iter"])
def test_timestring_round_trip(text):
    t = Time.from_timestring(text)
    assert t.to_timestring() == text
    assert Time.from_timestring(t.to_timestring()) == t


def test_negative_round_trip():
    t = -Time(5, "ba")
    assert Time.from_timestring(t.to_timestring()) == t


def test_constructors_and_repr():
    assert Time.from_epoch(3) == Time(3, TimeUnit.EPOCH)
    assert Time.from_batch(3).unit is TimeUnit.BATCH
    assert Time.from_sample(3).unit is TimeUnit.SAMPLE
    assert Time.from_token(3).unit is TimeUnit.TOKEN
    assert Time.from_duration(0.25).value == 0.25
    assert Time.from_iteration(1).unit is TimeUnit.ITERATION
    assert Time.from_second(9).unit is TimeUnit.SECOND
    assert repr(Time(10, "ep")) == "Time(10, TimeUnit.EPOCH)"
    assert repr(Time(0.5, "dur")) == "Time(0.5, TimeUnit.DURATION)"
    assert TimeUnit("ep") == "ep"


def test_from_input():
    t = Time(4, "ba")
    assert Time.from_input(t) is t
    assert Time.from_input("2ep") == Time(2, "ep")
    assert Time.from_input(3, default_int_unit="ep") == Time(3, "ep")
    assert Time.from_input(3, TimeUnit.BATCH) == Time(3, "ba")
    with pytest.raises(RuntimeError, match="default_int_unit"):  # Composer's type
        Time.from_input(3)
    with pytest.raises(RuntimeError):
        Time.from_input([3])


def test_immutable_hashable_picklable():
    t = Time(3, "ep")
    with pytest.raises(AttributeError):
        t.value = 4
    assert {t: 1}[Time(3, "ep")] == 1
    assert len({Time(3, "ep"), Time(3, "ep"), Time(4, "ep")}) == 2
    assert pickle.loads(pickle.dumps(t)) == t
    assert copy.deepcopy(t) == t


def test_add_sub_mod_same_unit_and_numbers():
    assert Time(3, "ep") + Time(2, "ep") == Time(5, "ep")
    assert Time(3, "ep") - Time(2, "ep") == Time(1, "ep")
    assert Time(7, "ba") % Time(3, "ba") == Time(1, "ba")
    assert Time(3, "ep") + 2 == Time(5, "ep")
    assert 2 + Time(3, "ep") == Time(5, "ep")
    assert 10 - Time(3, "ba") == Time(7, "ba")
    assert Time(3, "ep") + "2ep" == Time(5, "ep")
    assert Time(0.25, "dur") + 0.5 == Time(0.75, "dur")


@pytest.mark.parametrize("op", ["+", "-", "%"])
def test_mixed_units_raise(op):
    a, b = Time(3, "ep"), Time(2, "ba")
    with pytest.raises(RuntimeError, match="units differ"):
        eval(f"a {op} b")


def test_multiplication():
    assert Time(3, "ep") * 2 == Time(6, "ep")
    assert 2 * Time(3, "ep") == Time(6, "ep")
    assert (Time(100, "ba") * Time(0.5, "dur")) == Time(50, "ba")
    assert (Time(0.5, "dur") * Time(100, "ba")).unit is TimeUnit.BATCH
    prod = Time(0.5, "dur") * Time(0.5, "dur")
    assert prod.unit is TimeUnit.DURATION and prod.value == 0.25
    assert Time(3, "ep") * 0.5 == Time(1, "ep")  # Composer keeps the int type: truncates
    with pytest.raises(RuntimeError, match="dur"):
        Time(3, "ep") * Time(2, "ep")


def test_division():
    d = Time(5, "ba") / Time(20, "ba")
    assert d.unit is TimeUnit.DURATION and d.value == 0.25
    assert Time(10, "ba") / 2 == Time(5, "ba")
    assert (Time(0.5, "dur") / 2).value == 0.25
    with pytest.raises(RuntimeError):
        Time(5, "ba") / Time(1, "ep")


def test_unary_and_conversions():
    assert -Time(3, "ba") == Time(-3, "ba")
    assert abs(Time(-3, "ba")) == Time(3, "ba")
    assert float(Time(3, "ba")) == 3.0
    assert int(Time(0.75, "dur")) == 0


def test_comparisons():
    assert Time(3, "ep") < Time(4, "ep")
    assert Time(4, "ep") <= Time(4, "ep")
    assert Time(5, "ep") > Time(4, "ep")
    assert Time(5, "ep") >= "5ep"
    assert Time(5, "ep") == 5
    assert Time(5, "ep") != 6
    assert Time(5, "ba") < 5.5  # plain numbers are taken in the same unit, even fractional ones
    assert Time(0.5, "dur") < 0.75
    with pytest.raises(RuntimeError, match="units differ"):
        Time(3, "ep") < Time(4, "ba")
    with pytest.raises(RuntimeError):
        Time(3, "ep") == Time(3, "ba")
    assert (Time(3, "ep") == object()) is False


def test_timestamp_advances():
    ts = Timestamp()
    one = datetime.timedelta(seconds=1)
    ts = ts.to_next_batch(samples=8, tokens=80, duration=one)
    ts = ts.to_next_batch(samples=8, tokens=80, duration=one)
    assert (ts.batch, ts.sample, ts.token) == (2, 16, 160)
    assert (ts.batch_in_epoch, ts.sample_in_epoch, ts.token_in_epoch, ts.token_in_iteration) == (2, 16, 160, 160)
    assert ts.total_wct == 2 * one and ts.epoch_wct == 2 * one and ts.batch_wct == one
    ts = ts.to_next_epoch(duration=one)
    in_epoch = (ts.batch_in_epoch, ts.sample_in_epoch, ts.token_in_epoch)
    assert (ts.epoch, ts.epoch_in_iteration, in_epoch) == (1, 1, (0, 0, 0))
    assert ts.batch == 2 and ts.total_wct == 3 * one and ts.epoch_wct == datetime.timedelta(0)
    ts = ts.to_next_batch(samples=4)
    assert ts.batch_in_epoch == 1 and ts.sample == 20
    ts = ts.to_next_iteration()
    assert (ts.iteration, ts.epoch_in_iteration, ts.token_in_iteration, ts.batch_in_epoch) == (1, 0, 0, 0)
    assert ts.epoch == 1 and ts.batch == 3 and ts.iteration_wct == datetime.timedelta(0)


def test_timestamp_is_immutable_and_copy():
    ts = Timestamp(batch=3)
    with pytest.raises(dataclasses.FrozenInstanceError):
        ts.batch = 4
    assert ts.copy(epoch_in_iteration=2).epoch_in_iteration == 2 and ts.epoch_in_iteration == 0
    ts2 = ts.copy(epoch=2)
    assert (ts.epoch, ts2.epoch, ts2.batch) == (0, 2, 3)
    with pytest.raises(TypeError):
        Timestamp(batch=1.5)


def test_composer_timestamp_usage():
    """What Composer's own tests do with a Timestamp: its one setter (test_set_timestamp), an in-place
    load_state_dict (State.load_state_dict ignores the return value), and the usual construct / compare / copy /
    to_next_* / eval(repr) round trip; every other field stays read-only."""
    timestamp = Timestamp(epoch_in_iteration=1)
    assert timestamp.epoch_in_iteration == 1
    timestamp.epoch_in_iteration = 2
    assert timestamp.epoch_in_iteration == 2 and timestamp.epoch_in_iteration.unit == TimeUnit.EPOCH
    timestamp.epoch_in_iteration = Time(3, "ep")
    assert timestamp.epoch_in_iteration == 3
    with pytest.raises(ValueError, match="argument has units of"):
        timestamp.epoch_in_iteration = Time(3, "ba")
    for name in ("epoch", "batch", "total_wct"):
        with pytest.raises(dataclasses.FrozenInstanceError):
            setattr(timestamp, name, 1)

    loaded = Timestamp(epoch=1, batch=7, sample=56, batch_wct=0.5)
    target = Timestamp(epoch=4)
    target.load_state_dict(loaded.state_dict())  # Composer's call, its return value ignored
    assert target == loaded and target.epoch == 1 and target.batch_wct == datetime.timedelta(seconds=0.5)

    timestamp = Timestamp()
    assert timestamp < Time(10, "ep") and timestamp.get("ep") == Time.from_epoch(0)
    timestamp_2 = Timestamp(epoch=1).copy(batch=2)
    assert (timestamp_2.epoch, timestamp_2.batch, timestamp_2.sample) == (1, 2, 0)
    timestamp = timestamp.to_next_batch(10, 20, datetime.timedelta(seconds=5))
    timestamp = timestamp.to_next_epoch(duration=datetime.timedelta(seconds=5))
    assert (timestamp.epoch, timestamp.batch, timestamp.batch_in_epoch, timestamp.sample) == (1, 1, 0, 10)
    assert timestamp.total_wct == datetime.timedelta(seconds=10) and timestamp.batch_wct == datetime.timedelta(0)
    assert timestamp == eval(repr(timestamp))  # noqa: S307 (Composer's test_timestamp_repr)


def test_state_timestamp_is_assignable_as_in_composer_tests():
    """Composer's scheduler tests move the clock by assigning ``state.timestamp`` a copy; the state reads it back."""
    from jaxcomposer.core.run_state import RunPlan, RunState

    state = RunState(run_name="r", run_dir=None, plan=RunPlan(Time(10, "ep"), 100, 10), timestamp=Timestamp())
    parsed_time = Time.from_timestring("25ba")
    state.timestamp = state.timestamp.copy(batch=parsed_time,
                                           epoch=Time(int(parsed_time) // int(state.dataloader_len), TimeUnit.EPOCH))
    assert (state.timestamp.batch, state.timestamp.epoch) == (25, 2)
    assert state.get_elapsed_duration() == Time(0.2, "dur")  # max_duration is in epochs


_FULL = dict(iteration=1, epoch=2, batch=30, sample=300, token=3000, epoch_in_iteration=2, token_in_iteration=3000,
             batch_in_epoch=5, sample_in_epoch=50, token_in_epoch=500)
_UNIT_OF = dict(iteration="iter", epoch="ep", batch="ba", sample="sp", token="tok", epoch_in_iteration="ep",
                token_in_iteration="tok", batch_in_epoch="ba", sample_in_epoch="sp", token_in_epoch="tok")


@pytest.mark.parametrize("field", sorted(_UNIT_OF))
@pytest.mark.parametrize(
    "make, expected",
    [
        (lambda f, u: 7, 7),
        (lambda f, u: Time(7, u), 7),  # Composer: timestamp.copy(epoch=Time(0, 'ep'))
        (lambda f, u: f"7{u}", 7),  # Composer's Time.from_input takes a time string too
        (lambda f, u: Time(0, u), 0),
        (lambda f, u: Time(7, "ep" if u != "ep" else "ba"), (ValueError, "argument has units of")),
        (lambda f, u: Time(0.5, "dur"), (ValueError, "argument has units of 'dur'")),
        (lambda f, u: 1.5, (TypeError, "must be an int")),
        (lambda f, u: 2.0, (TypeError, "write 2")),
        (lambda f, u: [1], (RuntimeError, "Cannot convert [1]")),
        (lambda f, u: True, (TypeError, "bool")),  # deliberate: Composer counts True as 1
    ],
    ids=["int", "Time", "timestring", "zero", "other-unit", "dur", "fraction", "whole-float", "list", "bool"],
)
def test_timestamp_fields_take_int_or_time(field, make, expected):
    value = make(field, _UNIT_OF[field])
    base = Timestamp(**_FULL)
    if isinstance(expected, int):
        for ts in (Timestamp(**{field: value}), base.copy(**{field: value})):
            got = getattr(ts, field)  # an int that also reads as Composer's Time
            assert got == expected and isinstance(got, int) and got.value == expected
            assert got.unit == TimeUnit(_UNIT_OF[field]) and got.as_time() == Time(expected, _UNIT_OF[field])
        assert all(getattr(base.copy(**{field: value}), f) == v for f, v in _FULL.items() if f != field)
        return
    error, text = expected
    for build in (lambda: Timestamp(**{field: value}), lambda: base.copy(**{field: value})):
        with pytest.raises(error) as info:
            build()
        assert type(info.value) is error or (error is RuntimeError and isinstance(info.value, TimeInputError))
        assert str(info.value).startswith(f"Timestamp.{field}") and text in str(info.value)


def test_timestamp_copy_none_keeps_and_wall_clock_none_is_zero():
    ts = Timestamp(epoch=3, total_wct=datetime.timedelta(seconds=5))
    assert ts.copy(epoch=None, total_wct=None) == ts  # Composer: None means "keep"
    assert Timestamp(total_wct=None, batch_wct=None).total_wct == datetime.timedelta(0)
    with pytest.raises(TypeError, match="unknown field"):
        ts.copy(epochs=1)
    with pytest.raises(TypeError, match="total_wct"):
        Timestamp(total_wct="5s")


def test_timestamp_orders_against_times_only():
    ts = Timestamp(batch=5)
    assert ts < Time(6, "ba") and ts >= "5ba" and not ts > "5ba"
    with pytest.raises(TypeError):  # a bare number has no unit: unordered, as in Composer
        _ = ts < 6
    # equality as Composer's: against a Time or a string, that unit's counter; against a Timestamp, every field
    assert ts == Time(5, "ba") and Time(5, "ba") == ts and ts == "5ba" and ts != "4ba"
    assert ts == Time(0, "ep") and ts != Time(1, "ep")  # each unit's own counter
    assert ts == Timestamp(batch=5) and ts != Timestamp(batch=5, sample=1) and ts != 5
    assert hash(ts) == hash(Timestamp(batch=5)) and len({ts, Timestamp(batch=5)}) == 1


def test_timestamp_get():
    ts = Timestamp(iteration=1, epoch=2, batch=30, sample=300, token=3000, total_wct=datetime.timedelta(seconds=61.7))
    assert ts.get("ep") == Time(2, "ep")
    assert ts.get(TimeUnit.BATCH) == Time(30, "ba")
    assert ts.get(Time(5, "sp")) == Time(300, "sp")
    assert ts.get("tok").value == 3000
    assert ts.get("iter").value == 1
    assert ts.get("sec") == Time(61, "sec")
    with pytest.raises(ValueError, match="max_duration"):
        ts.get("dur")
    assert ts < Time(31, "ba") and ts >= "2ep" and not ts > "300sp"


def test_timestamp_state_dict_round_trip():
    ts = Timestamp(epoch=1, batch=7, sample=56, total_wct=datetime.timedelta(seconds=1.234567), batch_wct=0.5)
    d = json.loads(json.dumps(ts.state_dict()))
    assert Timestamp.from_state_dict(d) == ts
    assert Timestamp().load_state_dict(d) == ts
    with pytest.raises(ValueError, match="Unknown"):
        Timestamp.from_state_dict({"bogus": 1})


def test_to_batches():
    kw = dict(steps_per_epoch=10, max_batches=95)
    assert to_batches(Time(7, "ba"), **kw) == 7
    assert to_batches("3ep", **kw) == 30
    assert to_batches("0.5dur", **kw) == 47  # floored
    assert to_batches("1dur", **kw) == 95
    assert to_batches("33sp", batch_size=8, **kw) == 5  # ceil
    assert to_batches("100tok", tokens_per_batch=50, **kw) == 2
    assert to_batches("101tok", tokens_per_batch=50, **kw) == 3
    with pytest.raises(ValueError, match="steps_per_epoch"):
        to_batches("3ep", steps_per_epoch=None, max_batches=10)
    with pytest.raises(ValueError, match="max_batches"):
        to_batches("0.5dur", steps_per_epoch=None, max_batches=None)
    with pytest.raises(ValueError, match="batch_size"):
        to_batches("3sp", **kw)
    with pytest.raises(ValueError, match="tokens_per_batch"):
        to_batches("3tok", **kw)
    with pytest.raises(ValueError, match="sec"):
        to_batches("1h", **kw)
    with pytest.raises(ValueError, match="iter"):
        to_batches("1iter", **kw)
