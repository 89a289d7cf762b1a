"""Composer's notion of time: units, ``Time`` quantities, the ``Timestamp`` of a run, and batch conversion.

Composer lets every duration (``max_duration``, scheduler milestones, eval/save intervals) be written in the unit
that is natural for it ('90ep', '500ba', '0.5dur', '1h20m40s'). The semantics below follow
``composer/core/time.py`` so that configs written for Composer mean the same thing here.
"""
from __future__ import annotations

import dataclasses
import datetime
import math
import re
from enum import Enum
from typing import Any, Union

from jaxcomposer.errors import MissingTimeUnitError, TimeInputError, TimeInputTypeError  # noqa: F401 (re-exported)

__all__ = [
    "TimeUnit", "Time", "Timestamp", "Count", "to_batches", "TimeInputError", "MissingTimeUnitError", "TimeInputTypeError",
]


class TimeUnit(str, Enum):
    """Units of training time. ``str`` subclass so that ``TimeUnit('ep') == 'ep'`` as in Composer.

    As Composer's ``StringEnum``, a unit is looked up case-insensitively by value or name (``TimeUnit('EP')``,
    ``TimeUnit('epoch')``); an unknown string raises ``ValueError`` and a value that is not a string ``TypeError``.
    """

    ITERATION = "iter"
    EPOCH = "ep"
    BATCH = "ba"
    SAMPLE = "sp"
    TOKEN = "tok"
    DURATION = "dur"
    SECOND = "sec"

    @classmethod
    def _missing_(cls, value: object):
        if isinstance(value, str):
            for unit in cls:
                if value.lower() in (unit.value, unit.name.lower()):
                    return unit
            return None  # Enum raises ValueError
        raise TypeError(f"A time unit must be a str or TimeUnit, got {value!r} of type {type(value).__name__}.")


_VALID_UNITS = ", ".join(f"'{u.value}'" for u in TimeUnit)
_EXAMPLES = "'10ep', '500ba', '0.5dur', '3e4tok' or '1h20m40s'"
# Longest units first so that 'sec' is not read as 's' and 'sp' is not cut short.
_UNIT_PATTERN = "|".join(sorted((re.escape(u.value) for u in TimeUnit), key=len, reverse=True))
_DIGITS = r"[0-9](?:_?[0-9])*"  # underscores only between digits, as Python's int() and float() take them
_NUMBER = rf"[-+]?(?:{_DIGITS}(?:\.(?:{_DIGITS})?)?|\.{_DIGITS})(?:e[-+]?{_DIGITS})?"
_TIME_RE = re.compile(rf"^({_NUMBER})({_UNIT_PATTERN})$", re.IGNORECASE)
_WALL_CLOCK_RE = re.compile(r"^(?:([0-9]+)h)?(?:([0-9]+)m)?(?:([0-9]+)s)?$", re.IGNORECASE)


def _coerce_value(value: Any, unit: TimeUnit) -> Union[int, float]:
    """Composer's rule: a ``dur`` value is ``float(value)`` (and fails as ``float()`` fails: ``ValueError`` for a
    bad string, ``TypeError`` for a non-number); every other unit counts whole things and takes an ``int`` only, so
    ``Time(3.0, 'ba')`` is a ``TypeError``, as in Composer."""
    if isinstance(value, bool):  # deliberate: Composer takes True as 1; a bool here is always a mistake
        raise TypeError(f"Time value must be a number, got the bool {value!r}.")
    if unit == TimeUnit.DURATION:
        try:
            return float(value)
        except (TypeError, ValueError) as e:  # same type as Composer's float(value)
            raise type(e)(
                f"Time value {value!r} of type {type(value).__name__} with unit 'dur' must be a number, the fraction "
                f"of the run (e.g. 0.5)."
            ) from None
    if not isinstance(value, int):
        whole = isinstance(value, float) and value.is_integer()
        hint = f"; write {int(value)}" if whole else "; only 'dur' allows fractions (e.g. '0.5dur')"
        raise TypeError(
            f"Time value {value!r} of type {type(value).__name__} with unit '{unit.value}' must be an int{hint}."
        )
    return int(value)


class Time:
    """An immutable quantity of training time, ``value`` counted in ``unit``.

    Arithmetic mirrors Composer: ``+``, ``-``, ``%`` and comparisons need the same unit (plain numbers are taken
    in this unit); ``*`` takes a number or a ``dur`` Time; ``Time / Time`` gives a ``dur``.

    Invalid input raises Composer's exception types (``composer/core/time.py``):

    - ``Time(value, unit)``: an unknown unit string is a ``ValueError``, a unit that is not a string a ``TypeError``;
      a non-``int`` value for a counting unit (``Time(1.5, 'ep')``, also ``Time(3.0, 'ba')``) a ``TypeError``; a
      ``dur`` value goes through ``float()`` and raises what it raises (``Time('x', 'dur')``: ``ValueError``).
    - ``from_timestring``: a non-string is a ``TypeError``; an unparseable string a ``ValueError``; a fractional
      count (``'1.5ep'``) a ``TypeError``.
    - ``from_input``: a bare number without ``default_int_unit``, or a value of another type (``None``, a list), is
      a ``RuntimeError``. These are raised as :class:`TimeInputError`, a ``RuntimeError`` that is also the
      ``ValueError``/``TypeError`` this module raised before, so either ``except`` catches it.

    Deliberate differences, all on input Composer takes by accident: a ``bool`` is refused as a value (Composer
    reads ``True`` as 1); ``from_timestring`` strips surrounding whitespace, and refuses ``''`` (Composer reads it
    as ``0sec``) and numbers that overflow to infinity (``'1e400dur'``); integer counts are parsed exactly (Composer
    goes through ``float``, which rounds beyond 2**53).
    """

    __slots__ = ("_value", "_unit")

    def __init__(self, value: Union[int, float], unit: Union[TimeUnit, str]):
        try:
            unit = TimeUnit(unit)  # TypeError for a non-string, as Composer's StringEnum
        except ValueError:
            raise ValueError(f"Unknown time unit {unit!r}; valid units are {_VALID_UNITS}.") from None
        object.__setattr__(self, "_unit", unit)
        object.__setattr__(self, "_value", _coerce_value(value, unit))

    def __setattr__(self, name, value):
        raise AttributeError(f"Time is immutable; cannot set {name!r}. Build a new Time instead.")

    @property
    def value(self) -> Union[int, float]:
        return self._value

    @property
    def unit(self) -> TimeUnit:
        return self._unit

    # ----- constructors -------------------------------------------------------------------------------------
    @classmethod
    def from_iteration(cls, iteration: int) -> "Time":
        return cls(iteration, TimeUnit.ITERATION)

    @classmethod
    def from_epoch(cls, epoch: int) -> "Time":
        return cls(epoch, TimeUnit.EPOCH)

    @classmethod
    def from_batch(cls, batch: int) -> "Time":
        return cls(batch, TimeUnit.BATCH)

    @classmethod
    def from_sample(cls, sample: int) -> "Time":
        return cls(sample, TimeUnit.SAMPLE)

    @classmethod
    def from_token(cls, token: int) -> "Time":
        return cls(token, TimeUnit.TOKEN)

    @classmethod
    def from_duration(cls, duration: float) -> "Time":
        return cls(duration, TimeUnit.DURATION)

    @classmethod
    def from_second(cls, second: int) -> "Time":
        return cls(second, TimeUnit.SECOND)

    @classmethod
    def from_timedelta(cls, timestring: str) -> "Time":
        """Parse a wall-clock time 'XhYmZs' (any part may be left out: '2h', '5m', '1h30s') into seconds.

        As Composer, which reads it with ``strptime('%Hh%Mm%Ss')``: hours 0-23, minutes 0-59, seconds 0-59, at
        most two digits each; anything else is a ``ValueError`` (write longer times as seconds, '5400sec')."""
        if not isinstance(timestring, str):
            raise TypeError(f"timestring must be a str, got {timestring!r} of type {type(timestring).__name__}.")
        text = timestring.strip()
        wall = _WALL_CLOCK_RE.match(text)
        if not text or wall is None or not any(wall.groups()):
            raise ValueError(f"Cannot parse wall-clock time {timestring!r}: expected 'XhYmZs' such as '1h20m40s'.")
        parts = [g or "0" for g in wall.groups()]
        hours, minutes, seconds = (int(g) for g in parts)
        if any(len(g) > 2 for g in parts) or hours > 23 or minutes > 59 or seconds > 59:
            raise ValueError(
                f"Cannot parse wall-clock time {timestring!r}: Composer reads 'XhYmZs' with hours 0-23, minutes "
                f"0-59 and seconds 0-59 (at most 2 digits each); write it in seconds instead: "
                f"'{hours * 3600 + minutes * 60 + seconds}sec'."
            )
        return cls(hours * 3600 + minutes * 60 + seconds, TimeUnit.SECOND)

    @classmethod
    def from_timestring(cls, timestring: str) -> "Time":
        """Parse '10ep', '500ba', '0.5dur', '3_0e10sp' (underscores, scientific notation) or '1h20m40s'.

        A non-string is a ``TypeError``, an unparseable string a ``ValueError``, and a count with a fractional
        part ('1.5ep', '0.1sec') a ``TypeError``, as in Composer; an integral one ('2.0ep', '3e4tok') is an int."""
        if not isinstance(timestring, str):
            raise TypeError(f"timestring must be a str, got {timestring!r} of type {type(timestring).__name__}.")
        text = timestring.strip()
        wall = _WALL_CLOCK_RE.match(text)
        if text and wall is not None and any(wall.groups()):
            return cls.from_timedelta(text)
        match = _TIME_RE.match(text)
        if match is None:
            raise ValueError(
                f"Cannot parse time string {timestring!r}: expected a number followed by one of the units "
                f"{_VALID_UNITS} (e.g. {_EXAMPLES})."
            )
        number, unit = match.groups()
        unit = TimeUnit(unit.lower())
        try:
            value: Union[int, float] = int(number)  # exact for big counts, where float would round
        except ValueError:
            value = float(number)  # a fraction or an exponent
            if not math.isfinite(value):
                raise ValueError(f"Cannot parse time string {timestring!r}: {number} is not a finite number.")
        if unit != TimeUnit.DURATION and isinstance(value, float):
            if not value.is_integer():
                raise TypeError(
                    f"Time string {timestring!r}: the value {number} with unit '{unit.value}' must be an integer; "
                    f"only 'dur' allows fractions (e.g. '0.5dur')."
                )
            value = int(value)
        return cls(value, unit)

    @classmethod
    def from_input(
        cls, i: Union[str, int, float, "Time"], default_int_unit: Union[TimeUnit, str, None] = None
    ) -> "Time":
        """Accept what users write: a Time, a time string, or a bare number in ``default_int_unit``.

        As Composer, a bare number without ``default_int_unit`` and a value of any other type are a
        ``RuntimeError`` (:class:`TimeInputError`); a string or number that is not a valid time raises what
        ``from_timestring`` or ``Time(...)`` raise (``ValueError``/``TypeError``)."""
        if isinstance(i, Time):
            return i
        if isinstance(i, str):
            return cls.from_timestring(i)
        if isinstance(i, (int, float)) and not isinstance(i, bool):
            if default_int_unit is None:
                raise MissingTimeUnitError(
                    f"Got the bare number {i!r} as a time but no default_int_unit to interpret it; "
                    f"pass a time string such as {_EXAMPLES}."
                )
            return cls(i, default_int_unit)
        raise TimeInputTypeError(
            f"Cannot convert {i!r} of type {type(i).__name__} to Time; expected a Time, a time string such as "
            f"{_EXAMPLES}, or an int with default_int_unit."
        )

    def to_timestring(self) -> str:
        return f"{self.value}{self.unit.value}"

    # ----- helpers ------------------------------------------------------------------------------------------
    def _parse(self, other: Any, op: str) -> "Time":
        """Bring ``other`` into a Time of this unit, or raise: mixing units silently is the bug this prevents."""
        if isinstance(other, (int, float)) and not isinstance(other, bool):
            return Time(other, self.unit)
        if isinstance(other, str):
            other = Time.from_timestring(other)
        if not isinstance(other, Time):
            raise TypeError(f"Cannot apply '{op}' to {self!r} and {other!r} of type {type(other).__name__}.")
        if other.unit != self.unit:
            raise RuntimeError(
                f"Cannot apply '{op}' to {self!r} and {other!r}: the units differ ('{self.unit.value}' vs "
                f"'{other.unit.value}'). Convert one of them first."
            )
        return other

    def _compare_value(self, other: Any, op: str) -> Union[int, float]:
        # Plain numbers compare directly: building a Time would reject 2.5 for integer units.
        if isinstance(other, (int, float)) and not isinstance(other, bool):
            return other
        return self._parse(other, op).value

    # ----- arithmetic ---------------------------------------------------------------------------------------
    def __add__(self, other):
        return Time(self.value + self._parse(other, "+").value, self.unit)

    def __radd__(self, other):
        return Time(self._parse(other, "+").value + self.value, self.unit)

    def __sub__(self, other):
        return Time(self.value - self._parse(other, "-").value, self.unit)

    def __rsub__(self, other):
        return Time(self._parse(other, "-").value - self.value, self.unit)

    def __mod__(self, other):
        return Time(self.value % self._parse(other, "%").value, self.unit)

    def __mul__(self, other):
        if isinstance(other, (int, float)) and not isinstance(other, bool):
            # Composer keeps the value's type, so an integer count times 1.5 is truncated.
            return Time(type(self.value)(self.value * other), self.unit)
        if isinstance(other, str):
            other = Time.from_timestring(other)
        if not isinstance(other, Time):
            raise TypeError(f"Cannot multiply {self!r} by {other!r} of type {type(other).__name__}.")
        if TimeUnit.DURATION not in (self.unit, other.unit):
            raise RuntimeError(
                f"Cannot multiply {self!r} by {other!r}: one side must be a number or a 'dur' Time."
            )
        unit = self.unit if other.unit == TimeUnit.DURATION else other.unit
        kind = float if unit == TimeUnit.DURATION else int
        return Time(kind(self.value * other.value), unit)

    __rmul__ = __mul__

    def __truediv__(self, other):
        if isinstance(other, (int, float)) and not isinstance(other, bool):
            return Time(type(self.value)(self.value / other), self.unit)
        return Time(self.value / self._parse(other, "/").value, TimeUnit.DURATION)

    def __neg__(self):
        return Time(-self.value, self.unit)

    def __pos__(self):
        return self

    def __abs__(self):
        return Time(abs(self.value), self.unit)

    def __float__(self):
        return float(self.value)

    def __int__(self):
        return int(self.value)

    # ----- comparisons --------------------------------------------------------------------------------------
    def __eq__(self, other):
        if not isinstance(other, (Time, int, float, str)) or isinstance(other, bool):
            return NotImplemented
        return self.value == self._compare_value(other, "==")

    def __ne__(self, other):
        result = self.__eq__(other)
        return result if result is NotImplemented else not result

    def __lt__(self, other):
        return self.value < self._compare_value(other, "<")

    def __le__(self, other):
        return self.value <= self._compare_value(other, "<=")

    def __gt__(self, other):
        return self.value > self._compare_value(other, ">")

    def __ge__(self, other):
        return self.value >= self._compare_value(other, ">=")

    def __hash__(self):
        return hash((self.value, self.unit))

    def __repr__(self):
        return f"Time({self.value!r}, TimeUnit.{self.unit.name})"

    def __reduce__(self):
        # Needed because __setattr__ refuses writes; pickling/deepcopy rebuild through __init__.
        return (Time, (self.value, self.unit))


def time_arg(value: Any, where: str, examples: str = "'100ba' or '1ep'", error: type = ValueError) -> "Time":
    """An argument that must be a :class:`Time` or a time string, as a ``Time``; anything else raises ``error``
    naming ``where`` (``'EMA: half_life'``) and showing ``examples``. A malformed string raises Composer's error."""
    if isinstance(value, Time):
        return value
    if isinstance(value, str):
        return Time.from_timestring(value)
    raise error(f"{where} must be a Time or a time string such as {examples}, got {value!r}.")


def _td(x: Any, name: str) -> datetime.timedelta:
    if isinstance(x, datetime.timedelta):
        return x
    if isinstance(x, (int, float)) and not isinstance(x, bool):
        return datetime.timedelta(seconds=x)
    raise TypeError(f"Timestamp.{name} must be a datetime.timedelta or seconds, got {x!r}.")


_ZERO = datetime.timedelta(0)
_COUNTERS = (
    "iteration", "epoch", "batch", "sample", "token", "epoch_in_iteration", "token_in_iteration",
    "batch_in_epoch", "sample_in_epoch", "token_in_epoch",
)
_WCT = ("total_wct", "iteration_wct", "epoch_wct", "batch_wct")
_COUNTER_UNITS = {
    "iteration": TimeUnit.ITERATION, "epoch": TimeUnit.EPOCH, "batch": TimeUnit.BATCH, "sample": TimeUnit.SAMPLE,
    "token": TimeUnit.TOKEN, "epoch_in_iteration": TimeUnit.EPOCH, "token_in_iteration": TimeUnit.TOKEN,
    "batch_in_epoch": TimeUnit.BATCH, "sample_in_epoch": TimeUnit.SAMPLE, "token_in_epoch": TimeUnit.TOKEN,
}


class Count(int):
    """A Timestamp counter: an ``int`` (for arithmetic, comparisons, indexing and JSON) that also reads as the
    :class:`Time` Composer's ``Timestamp`` fields are: ``.value`` and ``.unit``, and every other Time attribute
    (``to_timestring()``, ...). So a Composer user's ``state.timestamp.epoch.value`` works unchanged, and our own
    code keeps plain integer arithmetic (whose results are plain ints)."""

    def __new__(cls, value: int, unit: Union[TimeUnit, str]):
        obj = super().__new__(cls, value)
        obj._unit = TimeUnit(unit)
        return obj

    @property
    def value(self) -> int:
        return int(self)

    @property
    def unit(self) -> TimeUnit:
        return self._unit

    def as_time(self) -> "Time":
        return Time(int(self), self._unit)

    def __getattr__(self, name: str):
        if name.startswith("__") or name == "_unit":
            raise AttributeError(name)
        return getattr(self.as_time(), name)

    def __reduce__(self):
        return Count, (int(self), self._unit.value)

    def __repr__(self) -> str:
        return int.__repr__(self)


def _counter(value: Any, name: str) -> Count:
    """A Timestamp counter given as Composer takes it (``Time.from_input(value, unit)``: an int, a Time or a time
    string in the counter's unit), stored as a :class:`Count`. A Time in another unit is Composer's ``ValueError``."""
    unit = _COUNTER_UNITS[name]
    if type(value) is int or type(value) is Count:  # the common case (every to_next_batch), without building a Time
        return Count(value, unit)
    if isinstance(value, bool):  # deliberate, as Time: Composer would count True as 1
        raise TypeError(f"Timestamp.{name} must be an int or a Time in '{unit.value}', got the bool {value!r}.")
    try:
        t = Time.from_input(value, unit)
    except (TypeError, ValueError, RuntimeError) as e:  # keep the type Composer raises; name the field
        raise type(e)(f"Timestamp.{name}: {e}") from None
    if t.unit != unit:
        raise ValueError(
            f"Timestamp.{name}: the `{name}` argument has units of '{t.unit.value}' ({t.to_timestring()!r}); "
            f"not '{unit.value}'. Pass an int or a Time in '{unit.value}'."
        )
    return Count(int(t.value), unit)


@dataclasses.dataclass(frozen=True)
class Timestamp:
    """Progress of a run. Immutable, as Composer's: the trainer swaps in the result of ``to_next_batch`` etc.
    (``state.timestamp`` is assignable, the fields are not), so callbacks that keep a reference see a consistent
    snapshot rather than counters that move under them. Composer's two exceptions hold here too: the
    ``epoch_in_iteration`` setter and the in-place :meth:`load_state_dict`; the trainer uses neither.

    The constructor and :meth:`copy` take each counter as Composer's do: an ``int``, a :class:`Time` in the
    counter's unit (``timestamp.copy(epoch=Time(0, 'ep'))``) or a time string (``'3ep'``). A Time in another unit
    is a ``ValueError`` and a fractional value a ``TypeError``, as in Composer. Wall-clock fields take a
    ``datetime.timedelta`` or seconds; ``None`` is zero in the constructor and "keep" in :meth:`copy`.

    Where we differ from Composer, deliberately:

    - counters are stored and read as plain ``int`` (Composer's properties return ``Time[int]``); ``get(unit)``
      gives the Time, and ``timestamp.epoch == 1`` holds in both;
    - ``load_state_dict`` also returns the Timestamp it loaded into (Composer's returns None);
    - a ``bool`` counter is refused (Composer counts ``True`` as 1).
    """

    iteration: int = 0
    epoch: int = 0
    batch: int = 0
    sample: int = 0
    token: int = 0
    epoch_in_iteration: int = 0
    token_in_iteration: int = 0
    batch_in_epoch: int = 0
    sample_in_epoch: int = 0
    token_in_epoch: int = 0
    total_wct: datetime.timedelta = _ZERO
    iteration_wct: datetime.timedelta = _ZERO
    epoch_wct: datetime.timedelta = _ZERO
    batch_wct: datetime.timedelta = _ZERO

    def __post_init__(self):
        for name in _COUNTERS:
            object.__setattr__(self, name, _counter(getattr(self, name), name))
        for name in _WCT:
            v = getattr(self, name)
            object.__setattr__(self, name, _ZERO if v is None else _td(v, name))

    def get(self, unit: Union[TimeUnit, str, Time]) -> Time:
        """The counter for ``unit`` as a Time. ``dur`` needs ``max_duration``, which a Timestamp does not know."""
        if isinstance(unit, Time):
            unit = unit.unit
        unit = TimeUnit(unit)
        if unit == TimeUnit.DURATION:
            raise ValueError(
                "Timestamp.get('dur') is undefined: the elapsed fraction needs max_duration; use "
                "timestamp.get(max_duration.unit) / max_duration instead."
            )
        if unit == TimeUnit.SECOND:
            return Time(int(self.total_wct.total_seconds()), TimeUnit.SECOND)
        field = {
            TimeUnit.ITERATION: self.iteration, TimeUnit.EPOCH: self.epoch, TimeUnit.BATCH: self.batch,
            TimeUnit.SAMPLE: self.sample, TimeUnit.TOKEN: self.token,
        }[unit]
        return Time(field, unit)

    # Comparisons against a Time or a time string, as Composer's ``state.timestamp < t_warmup``; anything else
    # (a bare int) is unordered, a TypeError, as in Composer.
    def _as(self, other: Any) -> tuple[Time, Time] | None:
        if not isinstance(other, (Time, str)):
            return None
        other = Time.from_timestring(other) if isinstance(other, str) else other
        return self.get(other.unit), other

    def __eq__(self, other):
        """Against a Time or a time string: that unit's counter, as Composer's (``timestamp == '5ba'``); against a
        Timestamp: every field."""
        if isinstance(other, Timestamp):
            return all(getattr(self, f.name) == getattr(other, f.name) for f in dataclasses.fields(self))
        pair = self._as(other)
        return NotImplemented if pair is None else pair[0] == pair[1]

    def __ne__(self, other):
        result = self.__eq__(other)
        return result if result is NotImplemented else not result

    def __lt__(self, other):
        pair = self._as(other)
        return NotImplemented if pair is None else pair[0] < pair[1]

    def __le__(self, other):
        pair = self._as(other)
        return NotImplemented if pair is None else pair[0] <= pair[1]

    def __gt__(self, other):
        pair = self._as(other)
        return NotImplemented if pair is None else pair[0] > pair[1]

    def __ge__(self, other):
        pair = self._as(other)
        return NotImplemented if pair is None else pair[0] >= pair[1]

    def copy(self, **changes: Any) -> "Timestamp":
        """A new Timestamp with ``changes`` applied; as Composer's ``copy``, a field given as ``None`` keeps its
        value, and counters take an ``int``, a Time in their unit or a time string."""
        unknown = set(changes) - set(_COUNTERS) - set(_WCT)
        if unknown:
            raise TypeError(
                f"Timestamp.copy() got unknown field(s) {sorted(unknown)}; expected names from {_COUNTERS + _WCT}."
            )
        return dataclasses.replace(self, **{k: v for k, v in changes.items() if v is not None})

    def to_next_batch(
        self, samples: int = 0, tokens: int = 0, duration: datetime.timedelta | None = None
    ) -> "Timestamp":
        duration = _td(duration if duration is not None else _ZERO, "duration")
        return self.copy(
            batch=self.batch + 1,
            batch_in_epoch=self.batch_in_epoch + 1,
            sample=self.sample + samples,
            sample_in_epoch=self.sample_in_epoch + samples,
            token=self.token + tokens,
            token_in_iteration=self.token_in_iteration + tokens,
            token_in_epoch=self.token_in_epoch + tokens,
            total_wct=self.total_wct + duration,
            iteration_wct=self.iteration_wct + duration,
            epoch_wct=self.epoch_wct + duration,
            batch_wct=duration,  # the last batch's time, as in Composer, not a running sum
        )

    def to_next_epoch(self, duration: datetime.timedelta | None = None) -> "Timestamp":
        duration = _td(duration if duration is not None else _ZERO, "duration")
        return self.copy(
            epoch=self.epoch + 1,
            epoch_in_iteration=self.epoch_in_iteration + 1,
            batch_in_epoch=0,
            sample_in_epoch=0,
            token_in_epoch=0,
            total_wct=self.total_wct + duration,
            iteration_wct=self.iteration_wct + duration,
            epoch_wct=_ZERO,
            batch_wct=_ZERO,
        )

    def to_next_iteration(self, duration: datetime.timedelta | None = None) -> "Timestamp":
        duration = _td(duration if duration is not None else _ZERO, "duration")
        return self.copy(
            iteration=self.iteration + 1,
            epoch_in_iteration=0,
            token_in_iteration=0,
            batch_in_epoch=0,
            sample_in_epoch=0,
            token_in_epoch=0,
            total_wct=self.total_wct + duration,
            iteration_wct=_ZERO,
            epoch_wct=_ZERO,
            batch_wct=_ZERO,
        )

    def state_dict(self) -> dict[str, int]:
        """JSON-able: wall-clock fields as integer microseconds so a save/load round trip is exact."""
        d = {name: getattr(self, name) for name in _COUNTERS}
        for name in _WCT:
            d[name + "_us"] = getattr(self, name) // datetime.timedelta(microseconds=1)
        return d

    @classmethod
    def from_state_dict(cls, state: dict[str, Any]) -> "Timestamp":
        unknown = set(state) - set(_COUNTERS) - {n + "_us" for n in _WCT}
        if unknown:
            raise ValueError(f"Unknown Timestamp state_dict keys {sorted(unknown)}; expected keys from state_dict().")
        kwargs: dict[str, Any] = {n: state[n] for n in _COUNTERS if n in state}
        for n in _WCT:
            if n + "_us" in state:
                kwargs[n] = datetime.timedelta(microseconds=state[n + "_us"])
        return cls(**kwargs)

    def load_state_dict(self, state: dict[str, Any]) -> "Timestamp":
        """Loads ``state`` into this Timestamp in place, as Composer's (``state.timestamp.load_state_dict(d)``, its
        return value ignored, must not be a silent no-op), and returns it."""
        loaded = Timestamp.from_state_dict(state)
        for f in dataclasses.fields(self):
            object.__setattr__(self, f.name, getattr(loaded, f.name))
        return self


def _timestamp_setattr(self: Timestamp, name: str, value: Any) -> None:
    # Composer's Timestamp has a setter for this one field; a frozen dataclass may not define __setattr__ in its
    # body, hence the assignment after the class
    if name == "epoch_in_iteration":
        object.__setattr__(self, name, _counter(value, name))
    else:
        _frozen_setattr(self, name, value)


_frozen_setattr = Timestamp.__setattr__
Timestamp.__setattr__ = _timestamp_setattr


def to_batches(
    t: Union[Time, str],
    *,
    steps_per_epoch: int | None,
    max_batches: int | None,
    batch_size: int | None = None,
    tokens_per_batch: int | None = None,
) -> int:
    """Number of optimizer steps that ``t`` spans.

    ``dur`` is floored (Composer's ``int(value * max_duration)``); samples and tokens round up because a partial
    batch still costs a step. Wall-clock and iteration times have no fixed batch count and are rejected.
    """
    t = Time.from_input(t)

    def need(value: int | None, name: str) -> int:
        if value is None:
            raise ValueError(f"Cannot convert {t.to_timestring()!r} to batches: {name} is None; pass {name}.")
        if value <= 0:
            raise ValueError(f"Cannot convert {t.to_timestring()!r} to batches: {name}={value!r}, expected > 0.")
        return value

    if t.unit == TimeUnit.BATCH:
        return int(t.value)
    if t.unit == TimeUnit.EPOCH:
        return int(t.value) * need(steps_per_epoch, "steps_per_epoch")
    if t.unit == TimeUnit.DURATION:
        if max_batches is None:
            raise ValueError(f"Cannot convert {t.to_timestring()!r} to batches: max_batches is None; pass max_batches.")
        return int(math.floor(t.value * max_batches))
    if t.unit == TimeUnit.SAMPLE:
        return -(-int(t.value) // need(batch_size, "batch_size"))
    if t.unit == TimeUnit.TOKEN:
        return -(-int(t.value) // need(tokens_per_batch, "tokens_per_batch"))
    raise ValueError(
        f"Cannot convert {t.to_timestring()!r} to batches: '{t.unit.value}' has no fixed number of batches; "
        f"use 'ba', 'ep', 'dur', 'sp' or 'tok'."
    )
