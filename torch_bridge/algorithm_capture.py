"""A user's Composer ``Algorithm`` whose in-step ``apply`` is torch code, captured with ``torch.export`` and lowered
to JAX, so it runs inside the compiled step of a torch model as the model itself does.

The engine (``jaxcomposer/core/algorithm_engine.py``) first traces ``apply`` as JAX; when that fails on a torch
model it calls :func:`capture`. The ``apply`` then runs inside ``torch.export`` on tensors of the fields' shapes,
with Composer's view of them: ``state.batch`` (a pair stays a pair), ``state.outputs``, ``state.loss`` and, at the
gradient events, ``state.model.parameters()`` whose ``.grad`` are the step's gradients, so Composer's idiom
``for p in state.model.parameters(): p.grad.mul_(0.5)`` is captured as it is written. The exported graph is lowered
with the bridge's op table (``interpreter.run_graph``) into the step.

A captured ``apply`` is exported once per input shape. Its Python runs again before every matched batch on fake
tensors (``replay``), so counters on ``self`` count batches as under Composer. Tensors it keeps on ``self`` (drawn
at an earlier event, as Composer's MixUp keeps its permutation from ``AFTER_DATALOADER`` for ``AFTER_LOSS``) are
read anew for every batch; values it draws on the host inside the captured event itself are fixed at export (the
bridge warns when an export draws from the host generators).
"""
from __future__ import annotations

import dataclasses
import warnings
from typing import Any, Callable

import jax
import jax.numpy as jnp
import numpy as np
import torch
from torch._subclasses.fake_tensor import FakeTensorMode
from torch.export.graph_signature import OutputKind

from jaxcomposer.core.algorithm_engine import FieldsView, as_batch_dict
from jaxcomposer.errors import ConfigurationError

from .export import export_module, to_program
from .interpreter import run_graph


def _torch_dtype(dtype) -> torch.dtype:
    # JAX holds torch's int64 labels as int32 (x64 off): torch code gets the int64 it was written for
    if np.dtype(dtype) == np.int32:
        return torch.int64
    return torch.from_numpy(np.zeros((), dtype)).dtype


class _ModelView:
    """``state.model`` at the gradient events: the user's module, except that ``parameters()`` and
    ``named_parameters()`` give the step's weights with ``.grad`` set to the step's gradients."""

    def __init__(self, module: torch.nn.Module, named: dict[str, torch.Tensor]):
        self._module, self._named = module, named

    def parameters(self, recurse: bool = True):
        return iter(self._named.values())

    def named_parameters(self, *args, **kwargs):
        return iter(self._named.items())

    def __getattr__(self, name: str):
        return getattr(self._module, name)


class _TorchState(FieldsView):
    """``state`` for a captured ``apply``: the event's fields as tensors (``state.model`` at the gradient events is
    the :class:`_ModelView`), the rest from the run's state."""

    def __init__(self, fields: dict, host: Any, pair: bool, model: Any):
        super().__init__(fields, host, pair)
        object.__setattr__(self, "_model", model)

    def __getattr__(self, name: str):
        if name in object.__getattribute__(self, "_fields"):
            return self._field(name)
        if name == "model" and self._model is not None:
            return self._model
        return getattr(self._host, name)

    def __setattr__(self, name: str, value: Any):
        self._fields[name] = as_batch_dict(value) if name == "batch" else value


class _CaptureLogger:
    """The ``logger`` of a captured ``apply``: its values would be export-time tensors, so logging is refused
    (and with it the capture, which the engine then reports)."""

    def log_metrics(self, metrics: dict, step: int | None = None) -> None:
        raise ConfigurationError("logger.log_metrics in an apply captured from torch code: the values are not the "
                                 "step's; log them from JAX code (jax.numpy on state.loss) or at a host event")

    def __getattr__(self, name: str):
        return lambda *args, **kwargs: None


def _run_apply(alg, event, fields: dict, written: tuple, host, pair: bool, module, user_names: dict) -> dict:
    """``apply`` on torch ``fields``; returns the written fields (gradients read back from ``.grad``)."""
    model = None
    if "grads" in fields and module is not None:
        named = {}
        for key, weight in fields["params"].items():
            weight.grad = fields["grads"][key]
            named[user_names.get(key, key)] = weight
        model = _ModelView(module, named)
    state = _TorchState(dict(fields), host, pair, model)
    alg.apply(event, state, _CaptureLogger())
    out = {f: state._fields[f] for f in written}
    if model is not None and out["grads"] is fields["grads"]:  # edited through p.grad, not state.grads
        out["grads"] = {key: fields["params"][key].grad for key in fields["grads"]}
    return out


def _program(ep):
    """``export.to_program``, except that in-place edits of the inputs (``p.grad.mul_``) are allowed: the exported
    function returns every written field, so their final values are among its own outputs, and the graph's outputs
    for the edits themselves are marked ``("mutation", name)`` and dropped."""
    specs = ep.graph_signature.output_specs
    mutations = [spec for spec in specs if spec.kind == OutputKind.USER_INPUT_MUTATION]
    if not mutations:
        return to_program(ep)
    original = list(specs)
    specs[:] = [spec for spec in original if spec.kind != OutputKind.USER_INPUT_MUTATION]  # to_program checks these
    try:
        program = to_program(ep)
    finally:
        specs[:] = original
    outputs = tuple(("mutation", spec.target) if spec.kind == OutputKind.USER_INPUT_MUTATION else ("user", None)
                    for spec in original)
    return dataclasses.replace(program, outputs=outputs)


def capture(alg, event, fields: dict, written: tuple, *, host: Any, pair: bool, module: Any,
            user_names: dict[str, str]) -> tuple[Callable, Callable]:
    """``(jax_fn, replay)``: ``jax_fn(fields) -> written fields`` is ``apply`` exported with tensors of ``fields``'
    shapes (abstract values) and lowered to JAX; ``replay()`` runs ``apply``'s Python on fake tensors of the same
    shapes (for its side effects, before each matched batch)."""
    leaves, treedef = jax.tree.flatten(fields)
    out_tree: list = []

    class Capture(torch.nn.Module):
        def forward(self, *tensors):
            out = _run_apply(alg, event, jax.tree.unflatten(treedef, list(tensors)), written, host, pair, module,
                             user_names)
            flat, tree = jax.tree.flatten(out)
            out_tree.append(tree)
            return tuple(flat)

    examples = tuple(torch.zeros(x.shape, dtype=_torch_dtype(x.dtype)) for x in leaves)
    saved = dict(vars(alg))
    read: set = set()
    cls = type(alg)

    class Reading(cls):  # records which of its own attributes apply reads during the export
        def __getattribute__(self, name):
            if not name.startswith("__") and name in object.__getattribute__(self, "__dict__"):
                read.add(name)
            return super().__getattribute__(name)

    alg.__class__ = Reading
    try:
        ep = export_module(Capture(), examples, train=False, dynamic_batch=False)
    finally:  # the export ran apply's Python once; the step's replays count the batches
        alg.__class__ = cls
        vars(alg).clear()
        vars(alg).update(saved)
    program = _program(ep)
    constants = {**ep.constants, **ep.state_dict}
    out_treedef = out_tree[-1]
    # tensors the apply keeps on self (a permutation drawn at AFTER_DATALOADER, read at AFTER_LOSS) are read anew
    # for each batch, not fixed at export
    attributes = {name: attr for name, const in ep.constants.items() if isinstance(const, torch.Tensor)
                  for attr, value in saved.items() if value is const}

    def constant(name: str):
        value = getattr(alg, attributes[name]) if name in attributes else constants[name]
        return jnp.asarray(value.detach().cpu().numpy())

    def jax_fn(values: dict) -> dict:
        flat_in = jax.tree.leaves(values)
        placeholders = [flat_in[where] if kind == "user" else constant(where) for kind, where in program.inputs]
        flat = [v for v, (kind, _) in zip(run_graph(program.graph, placeholders, None), program.outputs)
                if kind == "user"]
        out = jax.tree.unflatten(out_treedef, flat)
        for f in out:  # back in the step's dtypes where the field keeps its structure (int64 labels -> int32)
            if f in values and jax.tree.structure(out[f]) == jax.tree.structure(values[f]):
                out[f] = jax.tree.map(lambda v, like: v.astype(like.dtype), out[f], values[f])
        return out

    def replay() -> None:
        # fake tensors: shapes only, and the real tensors the apply keeps on self mix with them
        with FakeTensorMode(allow_non_fake_inputs=True), warnings.catch_warnings():
            warnings.simplefilter("ignore")
            fake = jax.tree.unflatten(treedef, [torch.empty(x.shape, dtype=_torch_dtype(x.dtype)) for x in leaves])
            _run_apply(alg, event, fake, written, host, pair, module, user_names)

    jax_fn.reads_algorithm_state = bool(attributes)
    # the Python numbers of self the export read are compiled into the graph: the engine exports again when one
    # of them has changed (a tensor kept on self is read anew for each batch instead)
    numbers = {name: saved[name] for name in read if isinstance(saved.get(name), (bool, int, float, np.number))}
    jax_fn.compiled_numbers = lambda: {name: getattr(alg, name, None) for name in numbers} != numbers
    return jax_fn, replay
