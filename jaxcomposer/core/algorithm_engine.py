"""Users' Composer ``Algorithm``s in a compiled step: host events on the host, in-step events traced into the step.

Composer calls ``apply`` on eager tensors at each in-step event. Here the step is one compiled program, so before
every step the engine asks ``match`` on the host for each in-step event, then **replays** each matched ``apply`` on
the host with abstract values (``jax.make_jaxpr``): Python in ``apply`` runs once per matched batch as under
Composer (counters on ``self``, shapes read, host random draws, ``logger`` calls), and what it computes is recorded
as a small program. The step evaluates those programs where the events fall (``AlgorithmEngine.method``'s slots):

========================================== ======================== ==========================================
events                                     slot                     ``state`` fields (writable ones starred)
========================================== ======================== ==========================================
AFTER_DATALOADER, BEFORE_FORWARD           ``batch``                batch*
AFTER_FORWARD, BEFORE_LOSS                 ``loss`` (before it)     batch*, outputs*
AFTER_LOSS, BEFORE_BACKWARD                ``loss`` (after it)      batch, outputs, loss* (the mean loss)
AFTER_BACKWARD, AFTER_TRAIN_BATCH          ``grad`` (after it)      loss, params, grads*
========================================== ======================== ==========================================

An algorithm whose ``apply`` is a pure function of its inputs and its hyperparameters may say so
(``trace_once = True``, an attribute Composer does not have): it is traced once per input shape and its program
reused, so its Python then runs once per compile and costs nothing per batch.

A step is compiled once per *variant*: the set of matched events, the structure of each recorded program and which
of its constants are compiled in. The arrays a program captures (a host-drawn permutation) and the scalars its own
equations use (``state.loss * scale``) are compiled in while they keep their first value, so XLA specializes on
them as on a built-in method's; once one changes it is passed into the step as an argument from then on, so an
``apply`` that draws new indices or a new scale every batch compiles twice, then never again. Numbers inside a
nested ``jax.jit`` it calls, and Python values that decide the program's shape or its operations, are part of the
structure: each new one compiles a new variant, and the engine warns when that keeps happening.

An ``apply`` at ``AFTER_DATALOADER`` that cannot be traced (it calls ``.numpy()`` on the batch, or torch ops) runs
on the host batch before the step instead, in the loader's own array types; those run before the traced ones. At
the other in-step events such an ``apply`` is refused at the first step, naming the line and the way out.
"""
from __future__ import annotations

import copy
import dataclasses
import inspect
import json
import sys
import traceback
import warnings
from typing import Any, Callable

import jax
import jax.extend.core as jax_core
import jax.numpy as jnp
import numpy as np
from flax import nnx

from jaxcomposer.core import adapters
from jaxcomposer.core.algorithm import as_passes, run_order
from jaxcomposer.core.events import IN_STEP_EVENTS, Event
from jaxcomposer.core.method import Method, StepCtx
from jaxcomposer.core.program_structure import digest, lift_literals, structure
from jaxcomposer.errors import ConfigurationError

NAME = "algorithms"  # the engine's Method: its stage is the variant, its host values the programs' captured arrays
BATCH_EVENTS = (Event.AFTER_DATALOADER, Event.BEFORE_FORWARD)
FORWARD_EVENTS = (Event.AFTER_FORWARD, Event.BEFORE_LOSS)
LOSS_EVENTS = (Event.AFTER_LOSS, Event.BEFORE_BACKWARD)
GRAD_EVENTS = (Event.AFTER_BACKWARD, Event.AFTER_TRAIN_BATCH)
_FIELDS = {**{e: (("batch",), ("batch",)) for e in BATCH_EVENTS},  # event -> (fields read, fields written)
           **{e: (("batch", "outputs"), ("batch", "outputs")) for e in FORWARD_EVENTS},
           **{e: (("batch", "outputs", "loss"), ("loss",)) for e in LOSS_EVENTS},
           **{e: (("loss", "params", "grads"), ("grads",)) for e in GRAD_EVENTS}}
# fields an apply may set at an event although nothing after it reads them there (Composer's LabelSmoothing puts the
# original targets back at AFTER_LOSS): accepted and dropped
_DROPPED = {e: ("batch", "outputs") for e in LOSS_EVENTS}
_WAY_OUT = {**{e: "edit state.batch at AFTER_DATALOADER instead, where an apply that cannot be traced runs on the "
                  "host batch" for e in BATCH_EVENTS + FORWARD_EVENTS},
            **{e: "compute it with jax.numpy (jax.lax.cond in place of an `if` on a value), or act at a host event "
                  "(BATCH_END) on state.loss" for e in LOSS_EVENTS},
            **{e: "edit state.grads (a pytree shaped like the params, keyed as the model names them) with jax.numpy; "
                  "p.grad of state.model's parameters is not set inside the compiled step" for e in GRAD_EVENTS}}
_RECOMPILE_WARNING_AFTER = 8  # new variants in a row before the engine says why it keeps compiling


class FieldsView:
    """What every in-step view of the state shares: the event's fields, ``state.batch`` in the loader's structure
    (an ``(input, target)`` pair stays a pair) and Composer's ``batch_get_item``/``batch_set_item``; anything else
    is read from the run's :class:`~jaxcomposer.core.run_state.RunState`."""

    def __init__(self, fields: dict, host: Any, pair: bool):
        object.__setattr__(self, "_fields", dict(fields))
        object.__setattr__(self, "_host", host)
        object.__setattr__(self, "_pair", pair)

    def _field(self, name: str):
        """The field ``name`` (the batch in the loader's structure); AttributeError when the event has none."""
        fields = object.__getattribute__(self, "_fields")
        if name not in fields:
            raise AttributeError(name)
        if name == "batch":
            batch = fields["batch"]
            return (batch["input"], batch["target"]) if self._pair else batch
        return fields[name]

    def batch_get_item(self, key):
        """Composer's ``state.batch_get_item``: by index into a pair, or by key into a dict batch (0 and 1 name
        ``'input'`` and ``'target'`` there, the keys a pair's items get)."""
        batch = self.batch
        if isinstance(batch, dict) and isinstance(key, int) and key not in batch:
            key = ("input", "target")[key]
        return batch[key]

    def batch_set_item(self, key, value) -> None:
        batch = self.batch
        if isinstance(batch, dict) and isinstance(key, int) and key not in batch:
            key = ("input", "target")[key]
        if isinstance(batch, tuple):
            batch = tuple(value if i == key else v for i, v in enumerate(batch))
        else:
            batch = {**batch, key: value}
        self.batch = batch


class InStepState(FieldsView):
    """``state`` as an in-step ``apply`` sees it while it is traced: the event's fields as JAX values, everything
    else read from the run's state (timestamp, max_duration, ...: this batch's host values)."""

    def __init__(self, event: Event, fields: dict, host: Any, pair: bool):
        super().__init__(fields, host, pair)
        object.__setattr__(self, "_event", event)

    def __getattr__(self, name: str):
        if name in object.__getattribute__(self, "_fields"):
            return self._field(name)
        if name == "model" and self._event in GRAD_EVENTS:  # its parameters' .grad would be None: say so instead
            raise AttributeError(f"state.model at {self._event.name}: inside the compiled step the gradients are "
                                 "state.grads (shaped like the params), not .grad of the module's parameters")
        if name in ("batch", "outputs", "loss", "grads", "params"):
            raise AttributeError(f"state.{name} is not available at {self._event.name} inside the train step (there: "
                                 f"{', '.join('state.' + f for f in self._fields)})")
        return getattr(self._host, name)

    def __setattr__(self, name: str, value: Any):
        writable = _FIELDS[self._event][1]
        if name in _DROPPED.get(self._event, ()):
            return
        if name not in writable:
            raise AttributeError(f"state.{name} cannot be set at {self._event.name} inside the train step (writable "
                                 f"there: {', '.join('state.' + f for f in writable)})")
        if name == "batch":
            value = as_batch_dict(value)
        self._fields[name] = value


def as_batch_dict(batch) -> dict:
    if isinstance(batch, (tuple, list)):
        if len(batch) != 2:
            raise ConfigurationError(f"state.batch: a tuple batch is (input, target), got {len(batch)} items")
        return {"input": batch[0], "target": batch[1]}
    if not isinstance(batch, dict):
        raise ConfigurationError(f"state.batch: expected a dict or an (input, target) pair, got {type(batch).__name__}")
    return dict(batch)


class _CollectingLogger:
    """The ``logger`` an in-step ``apply`` gets: ``log_metrics`` records values the step returns (logged after the
    step with this batch's values); everything else is the run's logger."""

    def __init__(self, logger: Any, sink: dict, event: Event, name: str):
        self._logger, self._sink, self._event, self._name = logger, sink, event, name

    def log_metrics(self, metrics: dict, step: int | None = None) -> None:
        if self._event in FORWARD_EVENTS + LOSS_EVENTS:
            raise ConfigurationError(
                f"{self._name}.apply at {self._event.name}: logger.log_metrics inside the differentiated part of the "
                "step is not supported (its values live inside the gradient's trace); log at AFTER_BACKWARD or "
                "AFTER_TRAIN_BATCH (state.loss is there), or at a host event")
        self._sink.update({k: jnp.asarray(v) for k, v in metrics.items()})

    def __getattr__(self, name: str):
        return getattr(self._logger, name)


@dataclasses.dataclass(frozen=True)
class Program:
    """One matched ``apply`` recorded for a variant: ``fields -> (written fields, logged values)``. Its constants
    are compiled in (``static``: position -> value) or passed with each step (the positions not in ``static``)."""

    event: Event
    index: int  # the algorithm's position in the engine's list
    jaxpr: Any  # jax.extend.core.Jaxpr
    in_tree: Any
    out_tree: Any
    static: tuple = ()  # ((position, value), ...): constants that kept their value so far

    def with_static(self, static: dict) -> "Program":
        return dataclasses.replace(self, static=tuple(sorted(static.items())))

    def __call__(self, passed, fields: dict) -> tuple[dict, dict]:
        flat, tree = jax.tree.flatten(fields)
        if tree != self.in_tree:  # the step's values must have the structure the replay saw
            raise ConfigurationError(f"algorithms: {self.event.name} program expected {self.in_tree}, got {tree}")
        static, passed = dict(self.static), iter(passed)
        consts = [static[k] if k in static else next(passed) for k in range(len(self.jaxpr.constvars))]
        out = jax.core.eval_jaxpr(self.jaxpr, consts, *flat)
        return jax.tree.unflatten(self.out_tree, out)


class AlgorithmEngine:
    """Runs a list of users' algorithms: :meth:`run_host` at host events, :meth:`prepare_step` before each train
    step (match, replay, variant), and :meth:`method`, the slots that evaluate the replayed programs in the step."""

    def __init__(self, algorithms: list, *, pair_batches: bool, passes=None, methods: tuple = (),
                 capture: Callable | None = None):
        self.algorithms = list(algorithms)
        # a torch model's: capture(alg, event, fields, written, host=, pair=) -> (jax_fn, replay), torch.export'ed
        self.capture = capture
        self._captured: dict = {}  # (event, algorithm) -> {input shapes: (replay, jax_fn)}: captured from torch
        self._traceable: set = set()  # (event, algorithm) whose apply traced as JAX at its first match
        self._trial_errors: dict = {}  # (event, algorithm) -> why its apply did not trace as JAX
        self._recaptures = 0  # torch-captured applies exported again because a number they read changed
        self.passes = as_passes(passes)
        self.methods = tuple(methods)  # the recipe's built-in methods, for reporting edits of the same field
        self._reported: set = set()
        self.pair_batches = pair_batches
        self.host_mode: set[int] = set()  # AFTER_DATALOADER applies that run on the host batch
        self.variants: dict[tuple, int] = {}  # programs' structures -> variant id
        self.programs: dict[int, tuple[Program, ...]] = {}  # variant id -> its programs, in step order
        self._new_variants_in_a_row = 0
        self._first_digests: dict = {}  # a program's structure -> its constants' first values (digests)
        self._changing: dict = {}  # a program's structure -> positions of constants that have changed
        self._traced_once: dict = {}  # (event, algorithm, input shapes) -> its program, for trace_once algorithms
        self._param_avals = None  # the params as plain nested dicts (pure_tree), abstract
        self._output_avals: dict = {}  # a microbatch's shapes -> the forward outputs' avals

    # ---- checkpoints ----
    def state_dicts(self) -> list[dict]:
        """Each algorithm's ``state_dict()`` with its class name, for the checkpoint's metadata (JSON): checked
        here, so a state that JSON cannot hold is named before anything is written."""
        states = [{"name": type(alg).__name__, "state": alg.state_dict()} for alg in self.algorithms]
        for entry in states:
            try:
                json.dumps(entry["state"])
            except (TypeError, ValueError) as e:
                raise ConfigurationError(
                    f"algorithms: {entry['name']}.state_dict() returned {entry['state']!r}, which a checkpoint "
                    f"cannot hold ({e}); return numbers, strings, lists and dicts (arrays as lists)") from e
        return states

    def load_state_dicts(self, states: list[dict]) -> None:
        """Give each algorithm the state saved for the algorithm of its class at its place among them (Composer
        matches algorithms by class too); algorithms without a saved state keep theirs."""
        saved: dict[str, list] = {}
        for entry in states:
            saved.setdefault(entry["name"], []).append(entry["state"])
        for alg in self.algorithms:
            queue = saved.get(type(alg).__name__)
            if queue:
                alg.load_state_dict(queue.pop(0))

    # ---- host events ----
    def run_host(self, event: Event, state: Any, logger: Any) -> None:
        for alg in run_order([a for a in self.algorithms if a.match(event, state)], event, self.passes):
            alg.apply(event, state, logger)

    # ---- before each train step ----
    def prepare_step(self, state: Any, batch: dict, logger: Any, *, host_batch: Callable, place: Callable,
                     step_batch_avals: Callable, loss_batch_avals: Callable, output_avals: Callable,
                     params) -> tuple[dict, Any, tuple]:
        """Ask ``match`` for every in-step event, run host-mode ``AFTER_DATALOADER`` applies on the host batch
        (``host_batch(batch)`` gives it in the loader's types, ``place`` puts the result back on the device) and
        replay the others on abstract values: the batch as the step's batch slots get it
        (``step_batch_avals(batch)``), as its loss gets it (``loss_batch_avals``: a microbatch), the forward's
        outputs (``output_avals(microbatch avals)``), the params. Returns ``(batch, variant, captured arrays)``;
        variant None when nothing matched."""
        matched = {e: self._in_step_order([i for i, a in enumerate(self.algorithms) if a.match(e, state)], e)
                   for e in IN_STEP_EVENTS}
        if not any(matched.values()):
            return batch, None, ()
        loading = matched[Event.AFTER_DATALOADER]
        for i in [i for i in loading if i in self.host_mode]:  # those that cannot be traced run first, on the host
            batch = self._apply_on_host(i, batch, state, logger, host_batch, place)
        fields = {"batch": step_batch_avals(batch)}
        recorded = []  # (program, consts, structure key)
        for i in [i for i in loading if i not in self.host_mode]:
            alg = self.algorithms[i]
            replayed = self._replay(Event.AFTER_DATALOADER, [i], fields, state, logger, recorded, or_host=True)
            if replayed is not None:
                fields = replayed
            else:
                self.host_mode.add(i)
                self._say_host_mode(i)
                before = step_batch_avals(batch)
                batch = self._apply_on_host(i, batch, state, logger, host_batch, place)
                if recorded and step_batch_avals(batch) != before:
                    raise ConfigurationError(
                        f"algorithms: {type(alg).__name__}.apply at AFTER_DATALOADER runs on the host batch (it does "
                        "not trace as JAX) and changes its shapes, after algorithms that run in the step; list it "
                        "before them") from None
                if not recorded:
                    fields = {"batch": step_batch_avals(batch)}
        matched[Event.AFTER_DATALOADER] = []
        for event in BATCH_EVENTS:
            fields = self._replay(event, matched[event], fields, state, logger, recorded)
        if any(matched[e] for e in FORWARD_EVENTS + LOSS_EVENTS):
            micro = loss_batch_avals(fields["batch"])
            shapes = (jax.tree.structure(micro), tuple((x.shape, x.dtype) for x in jax.tree.leaves(micro)))
            if shapes not in self._output_avals:  # the forward is traced once per batch shape, not per step
                self._output_avals[shapes] = output_avals(micro)
            fields = {"batch": micro, "outputs": self._output_avals[shapes]}
            for event in FORWARD_EVENTS:
                fields = self._replay(event, matched[event], fields, state, logger, recorded)
            fields = {**fields, "loss": jax.ShapeDtypeStruct((), jnp.float32)}
            for event in LOSS_EVENTS:
                fields = self._replay(event, matched[event], fields, state, logger, recorded)
        if self._param_avals is None:  # the params' shapes never change during a run
            self._param_avals = _avals(pure_tree(params))
        grad_fields = {"loss": jax.ShapeDtypeStruct((), jnp.float32), "params": self._param_avals,
                       "grads": self._param_avals}
        for event in GRAD_EVENTS:
            grad_fields = self._replay(event, matched[event], grad_fields, state, logger, recorded)
        if not recorded:
            return batch, None, ()
        variant, passed = self._variant(recorded)
        return batch, variant, passed

    def _variant(self, recorded: list) -> tuple[int, tuple]:
        """The variant of the step for these recorded programs, and the constants passed into it. Constants are
        compiled in while they keep their first value (XLA specializes on them, as on a built-in method's); one
        that changes is passed with each step from then on (one more compile, then none)."""
        key, passed = [], []
        for _, consts, part in recorded:
            digests = tuple(digest(c) for c in consts)
            first = self._first_digests.setdefault(part, digests)
            changed = self._changing.get(part, frozenset()) | {k for k, (a, b) in enumerate(zip(first, digests))
                                                               if a != b}
            self._changing[part] = changed
            key.append((part, changed, tuple(d for k, d in enumerate(digests) if k not in changed)))
            passed.append(tuple(c for k, c in enumerate(consts) if k in changed))
        key = tuple(key)
        variant = self.variants.get(key)
        if variant is None:
            self._report_shared_edits(p for p, _, _ in recorded)
            variant = self.variants[key] = len(self.variants)
            self.programs[variant] = tuple(
                p.with_static({k: c for k, c in enumerate(consts) if k not in changed})
                for (p, consts, _), (_, changed, _) in zip(recorded, key))
            self._new_variants_in_a_row += 1
            if self._new_variants_in_a_row == _RECOMPILE_WARNING_AFTER:
                warnings.warn(self._recompiling_message(), RuntimeWarning, stacklevel=3)
        else:
            self._new_variants_in_a_row = 0
        return variant, tuple(passed)

    def _report_shared_edits(self, programs) -> None:
        """Say (once, before the step compiles) where a user's algorithm changes a field at an event where a
        built-in method of the recipe changes it too: both run, in the recipe's order, and may not compose as meant
        (Composer's engine warns likewise when two algorithms interpolate the loss)."""
        for p in programs:
            for field in _changed_fields(p):
                holders = [m.name for m in self.methods for slot in _SLOTS_EDITING.get((p.event, field), ())
                           if getattr(m, slot, None) is not None]
                key = (p.index, p.event, field)
                if holders and key not in self._reported:
                    self._reported.add(key)
                    warnings.warn(
                        f"algorithms: {type(self.algorithms[p.index]).__name__}.apply at {p.event.name} changes "
                        f"state.{field}, which {holders} also change there; both run, in the order algorithms lists "
                        "them: check that they compose as you mean", RuntimeWarning, stacklevel=4)

    def _in_step_order(self, indices: list[int], event: Event) -> list[int]:
        """``run_order`` (with the user's passes) of the matched algorithms, as positions in the engine's list."""
        position = {id(a): i for i, a in enumerate(self.algorithms)}
        return [position[id(a)] for a in run_order([self.algorithms[i] for i in indices], event, self.passes)]

    def _replay(self, event: Event, indices: list[int], fields: dict, state, logger, recorded: list,
                or_host: bool = False) -> dict | None:
        """Each matched ``apply`` of ``event`` traced on abstract ``fields``, in run order; returns the fields as
        the last one left them (abstract) and appends ``(program, captured arrays, key)`` to ``recorded``. An
        apply that does not trace is refused, or with ``or_host`` returns None (it will run on the host batch)."""
        for i in indices:
            alg = self.algorithms[i]
            written = _FIELDS[event][1]
            once_key = (event, i, jax.tree.structure(fields),
                        tuple((x.shape, x.dtype) for x in jax.tree.leaves(fields)))
            entry = self._captured.get((event, i), {}).get(once_key)
            if entry is not None and entry[1].compiled_numbers():  # a number it compiled in changed: export again
                self._recaptures += 1
                if self._recaptures == _RECOMPILE_WARNING_AFTER:
                    warnings.warn(f"algorithms: {type(alg).__name__}.apply at {event.name} is torch code that reads "
                                  "a Python number of self which changes from batch to batch, so it is exported and "
                                  "compiled again each time; keep it on self as a tensor (torch.tensor(x)), which "
                                  "is passed into the step", RuntimeWarning, stacklevel=4)
                del self._captured[event, i][once_key]
                self._traced_once.pop(once_key, None)
                entry = None
                closed, out_shapes = self._capture(i, event, fields, state, once_key)
                fields = self._record(event, i, closed, out_shapes, fields, recorded, once_key, True)
                continue
            captured, cached = entry is not None, once_key in self._traced_once
            if captured:  # torch code: its Python (counters on self) runs once per matched batch, on fake tensors
                replay, jax_fn = entry
                replay()
            if cached and (getattr(alg, "trace_once", False) or captured and not jax_fn.reads_algorithm_state):
                program_and_consts, out_fields = self._traced_once[once_key]
                recorded.append(program_and_consts)
                fields = {**fields, **out_fields}
                continue

            def program(values, alg=alg):
                view = InStepState(event, values, state, self.pair_batches)
                logged: dict = {}
                alg.apply(event, view, _CollectingLogger(logger, logged, event, type(alg).__name__))
                return {f: view._fields[f] for f in written}, logged

            first = None if captured or (event, i) in self._traceable else self._first_trace(event, i, program,
                                                                                              fields)
            if captured:  # it reads tensors kept on self: traced again with this batch's
                closed, out_shapes = jax.make_jaxpr(lambda v: (jax_fn(v), {}), return_shape=True)(fields)
            elif first is not None:
                closed, out_shapes = first
                self._traceable.add((event, i))
            elif (event, i) not in self._traceable:
                if or_host:
                    return None
                if self.capture is None:
                    raise self._untraceable(i, event, self._trial_errors[event, i])
                closed, out_shapes = self._capture(i, event, fields, state, once_key)
                captured = True
            else:
                try:
                    closed, out_shapes = jax.make_jaxpr(program, return_shape=True)(fields)
                except ConfigurationError:
                    raise
                except Exception as e:  # noqa: BLE001 (it traced before: say where and why it stopped)
                    raise self._untraceable(i, event, e) from e
                self._traceable.add((event, i))
            fields = self._record(event, i, closed, out_shapes, fields, recorded, once_key,
                                  captured or getattr(alg, "trace_once", False))
        return fields

    def _record(self, event: Event, i: int, closed, out_shapes, fields: dict, recorded: list, once_key,
                keep: bool) -> dict:
        """Append the traced apply's program (constants lifted) to ``recorded``, keep it for later batches when
        ``keep``; returns the fields as it left them (abstract)."""
        jaxpr, consts = lift_literals(closed.jaxpr, closed.consts)
        program = Program(event, i, jaxpr, jax.tree.structure(fields), jax.tree.structure(out_shapes))
        # what makes this program the same as another one (its variant's key), without its arrays' values
        part = (event, i, structure(jaxpr), program.in_tree, program.out_tree,
                tuple((np.shape(c), np.result_type(c)) for c in consts))
        recorded.append((program, consts, part))
        if keep:
            self._traced_once[once_key] = recorded[-1], out_shapes[0]
        return {**fields, **out_shapes[0]}

    def _first_trace(self, event: Event, i: int, program: Callable, fields: dict):
        """Algorithm ``i``'s apply at ``event``, at its first match, traced as JAX: ``(closed jaxpr, shapes)``, or
        None when it does not trace. A try that fails leaves no trace: the algorithm's attributes (deep-copied
        first) and the host's random generators are put back, and the real run follows on the host batch or
        captured from torch. One that succeeds is this batch's run: its Python ran once."""
        alg = self.algorithms[i]
        try:
            saved = copy.deepcopy(vars(alg))
        except Exception:  # noqa: BLE001 (what cannot be copied is put back as it is)
            saved = copy.copy(vars(alg))
        generators = adapters.generator_states()
        try:
            return jax.make_jaxpr(program, return_shape=True)(fields)
        except ConfigurationError:
            raise
        except Exception as e:  # noqa: BLE001 (why it did not trace is said if nothing else runs it either)
            vars(alg).clear()
            vars(alg).update(saved)
            adapters.restore_generator_states(generators)
            self._trial_errors[event, i] = e
            return None

    def _capture(self, i: int, event: Event, fields: dict, state, once_key) -> tuple:
        """A torch model's ``apply`` that did not trace as JAX, exported with torch and lowered (``self.capture``:
        the torch adapter's ``capture_algorithm``); its Python then replays on fake tensors before each batch."""
        alg = self.algorithms[i]
        try:
            jax_fn, replay = self.capture(alg, event, fields, _FIELDS[event][1], host=state, pair=self.pair_batches)
            closed, out_shapes = jax.make_jaxpr(lambda values: (jax_fn(values), {}), return_shape=True)(fields)
        except Exception as torch_error:  # noqa: BLE001 (both failures are reported)
            refusal = self._untraceable(i, event, self._trial_errors[event, i])
            raise ConfigurationError(f"{refusal} Captured with torch.export instead, it failed too: "
                                     f"{type(torch_error).__name__}: {str(torch_error)[:2000]}") from torch_error
        self._captured.setdefault((event, i), {})[once_key] = replay, jax_fn
        replay()  # this batch's run of its Python (the export's own run was undone)
        return closed, out_shapes

    def _apply_on_host(self, i: int, batch: dict, state, logger, host_batch: Callable, place: Callable) -> dict:
        alg, saved = self.algorithms[i], state.batch
        state.batch = host_batch(batch)
        try:
            alg.apply(Event.AFTER_DATALOADER, state, logger)
            return place(state.batch)
        finally:
            state.batch = saved

    def _say_host_mode(self, i: int) -> None:
        name = type(self.algorithms[i]).__name__
        print(f"jaxcomposer: {name}.apply at AFTER_DATALOADER does not trace as JAX; it runs on the host batch "
              "before each step (in the loader's array types)", file=sys.stderr, flush=True)

    def _untraceable(self, i: int, event: Event, error: Exception) -> ConfigurationError:
        alg = self.algorithms[i]
        name = type(alg).__name__
        source = inspect.getsourcefile(type(alg))
        frames = [f for f in traceback.extract_tb(error.__traceback__) if f.filename == source]
        where = f" ({frames[-1].filename}:{frames[-1].lineno}: {frames[-1].line})" if frames else ""
        return ConfigurationError(
            f"algorithms: {name}.apply at {event.name} cannot run inside the compiled train step{where}: "
            f"{type(error).__name__}: {error}. In-step applies are traced as JAX; {_WAY_OUT[event]}")

    def _recompiling_message(self) -> str:
        return (f"algorithms: the in-step applies compiled a new step for {_RECOMPILE_WARNING_AFTER} batches in a "
                "row: a Python number that changes every batch is compiled into the step; pass it as an array "
                "(jnp.asarray(x)) so that it enters the step as a value")

    # ---- inside the step ----
    def method(self) -> Method:
        """The engine as a built-in :class:`Method`: its slots evaluate the variant's programs (``ctx.stage`` is the
        variant, ``ctx.host`` the captured arrays)."""

        def programs(ctx: StepCtx, events) -> list:
            if ctx.stage is None:
                return []
            return [(p, consts) for p, consts in zip(self.programs[ctx.stage], ctx.host) if p.event in events]

        def emit(ctx: StepCtx, logged: dict) -> None:
            for k, v in logged.items():
                ctx.emit(k, v)

        def batch_slot(batch: dict, ctx: StepCtx) -> dict:
            fields = {"batch": batch}
            for p, consts in programs(ctx, BATCH_EVENTS):
                written, logged = p(consts, fields)
                fields = {**fields, **written}
                emit(ctx, logged)
            return fields["batch"]

        def loss_slot(loss_fn: Callable, ctx: StepCtx) -> Callable:
            before, after = programs(ctx, FORWARD_EVENTS), programs(ctx, LOSS_EVENTS)
            if not before and not after:
                return loss_fn

            def wrapped(outputs, batch):
                fields = {"batch": batch, "outputs": outputs}
                for p, consts in before:
                    fields = {**fields, **p(consts, fields)[0]}
                losses = loss_fn(fields["outputs"], fields["batch"])
                if not after:
                    return losses
                mean = losses.mean()
                fields = {**fields, "loss": mean}
                for p, consts in after:
                    fields = {**fields, **p(consts, fields)[0]}
                # per-example losses whose mean is the new loss and whose gradient is the new loss's
                return losses + (fields["loss"] - mean).astype(losses.dtype)

            return wrapped

        def grad_slot(grad_fn: Callable, ctx: StepCtx) -> Callable:
            after = programs(ctx, GRAD_EVENTS)
            if not after:
                return grad_fn

            def wrapped(params, model_state, batch, key):
                (loss, new_state), grads = grad_fn(params, model_state, batch, key)
                fields = {"loss": loss, "params": pure_tree(params), "grads": pure_tree(grads)}
                for p, consts in after:
                    written, logged = p(consts, fields)
                    fields = {**fields, **written}
                    emit(ctx, logged)
                return (loss, new_state), like_tree(fields["grads"], grads)

            return wrapped

        return Method(name=NAME, batch=batch_slot, loss=loss_slot, grad=grad_slot,
                      description="users' Composer algorithms at the in-step events")


# (event, field) -> the built-in Method slots that change that field there (docs/design.md, "The train step")
_SLOTS_EDITING = {**{(e, "batch"): ("batch", "data") for e in BATCH_EVENTS},
                  **{(e, f): ("loss",) for e in FORWARD_EVENTS + LOSS_EVENTS for f in ("batch", "outputs", "loss")},
                  (Event.AFTER_BACKWARD, "grads"): ("grad",), (Event.AFTER_TRAIN_BATCH, "grads"): ("tx",)}


def _changed_fields(program: Program) -> list[str]:
    """The written fields whose values the program changes (not all passed through from its inputs)."""
    written_tree = jax.tree.unflatten(program.out_tree, list(program.jaxpr.outvars))[0]
    inputs = set(program.jaxpr.invars)
    return [f for f, leaves in written_tree.items()
            if any(not isinstance(v, jax_core.Var) or v not in inputs for v in jax.tree.leaves(leaves))]


def pure_tree(tree):
    """``tree`` as plain nested dicts of arrays (an ``nnx.State`` without its ``Variable`` nodes): what ``apply``
    sees as ``state.params`` and ``state.grads``, and cheaper to trace every batch."""
    return nnx.to_pure_dict(tree) if isinstance(tree, nnx.State) else tree


def like_tree(pure, like):
    """``pure`` (from :func:`pure_tree`, maybe edited) back in ``like``'s structure: both flatten in key order."""
    leaves, treedef = jax.tree.flatten(pure)
    like_def = jax.tree.structure(like)
    if like_def.num_leaves != len(leaves):
        raise ConfigurationError(f"algorithms: state.grads came back with {len(leaves)} arrays, expected "
                                 f"{like_def.num_leaves} (one per parameter, in the params' structure)")
    return jax.tree.unflatten(like_def, leaves)


def _avals(tree):
    return jax.tree.map(lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype), tree)
