"""``Algorithm``: Composer's interface for a speedup method a user writes, ``match(event, state)`` and
``apply(event, state, logger)``, and the order Composer's engine runs matched algorithms in.

A subclass written for Composer runs with only its imports changed. At host events (``FIT_START``, ``EPOCH_END``,
...) ``apply`` runs on the host with the run's :class:`~jaxcomposer.core.run_state.RunState`, as in Composer. At the
events inside a train step (``AFTER_DATALOADER`` ... ``AFTER_TRAIN_BATCH``) it is traced into the compiled step:
``state.batch``, ``state.outputs``, ``state.loss`` and ``state.grads`` are JAX values there, and what ``apply``
assigns to them becomes the step's dataflow (``jaxcomposer/core/algorithm_engine.py``; docs/design.md, "Users'
Composer algorithms").

Differences from Composer, each for a reason given where it is implemented:

- gradients are ``state.grads``, a pytree shaped like the params (NNX models have no ``p.grad``);
- ``state.loss`` at ``AFTER_LOSS``/``BEFORE_BACKWARD`` is the (micro)batch's mean loss, as Composer's, and a
  new value changes the loss that is differentiated; at the gradient events it is read-only;
- with gradient accumulation, ``AFTER_BACKWARD`` runs once on the accumulated gradient (Composer: after every
  microbatch, on the sum so far); with one microbatch the two agree.
"""
from __future__ import annotations

from typing import Any

from jaxcomposer.core.events import Event
from jaxcomposer.errors import ConfigurationError


class Algorithm:
    """Composer's ``Algorithm``: override :meth:`match` and :meth:`apply`.

    ``match(event, state) -> bool`` is asked on the host at every event, the in-step ones once per batch before the
    step runs (with the host's state: timestamp, max_duration, ...). ``apply(event, state, logger)`` edits
    ``state`` in place; its return value is Composer's exit code and is ignored.

    ``trace_once`` (not Composer's): at in-step events ``apply`` is replayed on the host before every matched
    batch, so its Python runs once per batch as under Composer. A class whose ``apply`` is a pure function of the
    state's arrays and its own hyperparameters (no counters, no host random draws, no per-batch host values) sets
    ``trace_once = True``: it is then traced once per input shape and costs nothing on the host per batch.
    """

    trace_once: bool = False

    @property
    def find_unused_parameters(self) -> bool:
        """Composer's DDP hint; kept for interface compatibility (gradients of unused parameters are zeros here)."""
        return False

    @property
    def backwards_create_graph(self) -> bool:
        """Composer's request for a differentiable backward (``create_graph=True``); every JAX gradient is one."""
        return False

    @staticmethod
    def required_on_load() -> bool:
        """Whether a checkpoint must be loaded with this algorithm present (Composer re-creates those from
        ``repr``)."""
        return False

    def match(self, event: Event, state: Any) -> bool:
        raise NotImplementedError(f"{type(self).__name__}.match(event, state) is not implemented")

    def apply(self, event: Event, state: Any, logger: Any) -> int | None:
        raise NotImplementedError(f"{type(self).__name__}.apply(event, state, logger) is not implemented")

    def state_dict(self) -> dict[str, Any]:
        """What a checkpoint keeps of this algorithm (Composer's default: its ``repr``)."""
        return {"repr": repr(self)}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        pass

    def __repr__(self) -> str:
        return f"{type(self).__name__}()"


def is_algorithm(obj: Any) -> bool:
    """A user's algorithm: an :class:`Algorithm`, or any object with Composer's ``match`` and ``apply`` (so a
    class written against Composer's base and handed over as is counts too)."""
    return isinstance(obj, Algorithm) or (callable(getattr(obj, "match", None))
                                          and callable(getattr(obj, "apply", None)))


def set_filo_order(algorithms: list, event: Event) -> list:
    """Composer's default pass: list order, reversed for ``AFTER_*`` events, so that what ``BEFORE_LOSS`` A, B did
    is undone at ``AFTER_LOSS`` as B, A."""
    return list(reversed(algorithms)) if event.value.startswith("after") else list(algorithms)


def as_passes(passes) -> tuple:
    """``algorithm_passes`` (one pass or a sequence of them) as a tuple, checked: each is ``fn(algorithms, event)
    -> algorithms``."""
    passes = () if passes is None else tuple(passes) if isinstance(passes, (list, tuple)) else (passes,)
    for i, p in enumerate(passes):
        if not callable(p):
            raise ConfigurationError(f"algorithm_passes[{i}]: got {p!r}, expected a function (algorithms, event) -> "
                                     "algorithms, as Composer's engine passes")
    return passes


def run_order(algorithms: list, event: Event, passes: tuple = ()) -> list:
    """Composer's engine order for the algorithms that matched ``event``: the default pass, then the user's."""
    ordered = set_filo_order(algorithms, event)
    for p in passes:
        ordered = list(p(ordered, event))
    return ordered
