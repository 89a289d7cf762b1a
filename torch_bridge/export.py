"""torch.export of a module into the two graphs we lower (train and eval), and the checks done at conversion time.

Why two graphs: the mode is baked into an export (dropout disappears in eval, BatchNorm picks
``_native_batch_norm_legit_no_training``), so both are exported once and share one params/buffers pytree.
Why functional graphs: in-place buffer updates (BatchNorm's running statistics) must become ``BUFFER_MUTATION``
outputs. ``functionalize.functionalize_in_place`` does that for graphs made of ops we lower; anything else goes
through ``run_decompositions({})``, which functionalizes and decomposes composite ops without decomposing
conv2d/linear/layer_norm/SDPA/embedding, so SDPA still maps to ``jax.nn.dot_product_attention`` (a full
decomposition would turn it into matmul + softmax).
"""
from __future__ import annotations

import contextlib
import dataclasses
import inspect
import random
import warnings
from collections import defaultdict
from typing import Any

import numpy as np
import torch
from torch.export.graph_signature import InputKind, OutputKind

from jaxcomposer.errors import UnsupportedOpError  # re-exported as torch_bridge.UnsupportedOpError

from . import functionalize, interpreter
from .ops import nn_instance_norm


@dataclasses.dataclass(frozen=True)
class Program:
    """One exported graph plus how its placeholders and outputs bind to our flat dicts.

    ``inputs`` lists, per placeholder, ("state", name) for params/buffers/constants or ("user", i) for the i-th user
    input; ``outputs`` lists, per flat output, ("buffer", name) or ("user", None).
    """

    graph: torch.fx.Graph
    inputs: tuple[tuple[str, Any], ...]
    outputs: tuple[tuple[str, str | None], ...]
    out_spec: Any
    user_shapes: tuple[tuple, ...]


@contextlib.contextmanager
def _mode(module: torch.nn.Module, train: bool):
    was = module.training
    module.train(train)
    try:
        yield
    finally:
        module.train(was)


def _batched(example_inputs: tuple) -> list[bool]:
    """Which inputs carry the batch: tensors whose dim 0 is the first tensor input's (a shared ``(1, T)`` mask or a
    lookup table with another leading size stays static)."""
    tensors = [x for x in example_inputs if isinstance(x, torch.Tensor) and x.ndim > 0]
    size = tensors[0].shape[0] if tensors else None
    return [isinstance(x, torch.Tensor) and x.ndim > 0 and x.shape[0] == size for x in example_inputs]


def _dynamic_shapes(example_inputs: tuple, module: torch.nn.Module | None = None):
    """The ``dynamic_shapes`` spec that marks dim 0 of every batched input, laid out as ``forward``'s signature:
    ``torch.export`` groups the arguments a ``*args`` parameter takes into one tuple, and the spec must match."""
    batch = torch.export.Dim("batch")
    specs = [{0: batch} if b else None for b in _batched(example_inputs)]
    try:
        params = list(inspect.signature(module.forward).parameters.values()) if module is not None else []
    except (TypeError, ValueError):  # a forward without a readable signature: flat, as the inputs are
        params = []
    out, i = [], 0
    for p in params:
        if p.kind == p.VAR_POSITIONAL:
            out.append(tuple(specs[i:]))
            i = len(specs)
            break
        if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD) and i < len(specs):
            out.append(specs[i])
            i += 1
    return tuple(out) + tuple(specs[i:])


def _widen_batch(example_inputs: tuple) -> tuple:
    """Examples with a batch of 1 repeated to 2: torch.export specializes a dimension of size 0 or 1 to that size
    (its "0/1 specialization"), so a batch-1 example (Composer's default DataLoader) could not export a graph for
    other batch sizes. The values do not matter to the graph, only the shapes."""
    batched = _batched(example_inputs)
    if not any(batched) or next(x for x, b in zip(example_inputs, batched) if b).shape[0] > 1:
        return example_inputs
    return tuple(torch.cat([x, x]) if b else x for x, b in zip(example_inputs, batched))


def _layerdrop(module: torch.nn.Module) -> bool:
    """Whether a Hugging Face model in ``module`` trains with LayerDrop (Wav2Vec2, HuBERT, Whisper, BART, ...)."""
    return any(getattr(getattr(m, "config", None), "layerdrop", 0) or 0 for m in module.modules())


def _data_dependent(error: BaseException) -> bool:
    """Whether an export failure (or what caused it) is a guard on a tensor's value, e.g. ``if x.sum() > 0``."""
    from torch.fx.experimental.symbolic_shapes import GuardOnDataDependentSymNode

    while error is not None:
        if isinstance(error, GuardOnDataDependentSymNode) or "data-dependent" in str(error):
            return True
        error = error.__cause__ or error.__context__
    return False


class HostRandomnessWarning(UserWarning):
    """A module's forward drew from numpy's or Python's global random generator while it was exported: the draw is
    frozen into the graph, so every bridged step reuses it (``warnings.simplefilter('error', ...)`` to refuse)."""


def _host_rng_state():
    state = np.random.get_state()
    return state[1].tobytes(), state[2], random.getstate()


def _warn_host_randomness(ep, train: bool) -> None:
    """Name the modules whose forward-time constants (``lifted_tensor``: made in forward, not held by the module)
    hold the frozen draw; without any, the draw steered Python control flow, which no constant records."""
    lifted = [s.target for s in ep.graph_signature.input_specs
              if s.kind == InputKind.CONSTANT_TENSOR and "lifted_tensor" in s.target.rsplit(".", 1)[-1]]
    owners = sorted({t.rsplit(".", 1)[0] if "." in t else "<root>" for t in lifted})
    where = (f"the tensors it made in forward became constants of the graph (in module(s) {', '.join(owners)})"
             if owners else "it steered Python control flow, which the graph records as the branch taken")
    warnings.warn(HostRandomnessWarning(
        f"torch_bridge: the module's forward drew from numpy's or Python's global random generator during the "
        f"{'train' if train else 'eval'}-mode export; {where}, so every step reuses that one draw instead of "
        "drawing anew (e.g. a SpecAugment mask made with np.random). Draw with torch instead (torch.rand, "
        "torch.bernoulli, F.dropout): the bridge gives torch's random ops a fresh key every step."), stacklevel=3)


def export_module(module: torch.nn.Module, example_inputs: tuple, *, train: bool, dynamic_batch: bool):
    with _mode(module, train), warnings.catch_warnings():
        # torch 2.13's own export internals deep-copy pytree specs and trip its LeafSpec deprecation warning
        warnings.filterwarnings("ignore", message=".*LeafSpec.*", category=FutureWarning)
        try:
            if dynamic_batch:
                example_inputs = _widen_batch(tuple(example_inputs))
            rng_before = _host_rng_state()  # export runs forward's Python: a host draw moves these generators
            ep = torch.export.export(module, tuple(example_inputs),
                                     dynamic_shapes=_dynamic_shapes(example_inputs, module) if dynamic_batch else None)
            host_random = _host_rng_state() != rng_before
        except Exception as e:
            note = f"torch_bridge: torch.export failed in {'train' if train else 'eval'} mode."
            if _data_dependent(e):  # the hint only where it applies: a guard on a tensor's value
                note += " Value-dependent Python control flow (`if x.sum() > 0`) needs torch.cond."
                if train and _layerdrop(module):
                    note += (" This model uses LayerDrop (config.layerdrop > 0), which skips layers on a "
                             "torch.rand draw in a Python `if`: set model.config.layerdrop = 0 to convert it.")
            e.add_note(note)
            raise
        if host_random:
            _warn_host_randomness(ep, train)
        if not functionalize.functionalize_in_place(ep):
            ep = ep.run_decompositions({})
        nn_instance_norm.track_instance_norm_stats(ep)  # a buffer update the export itself does not record
        return ep


def _where(node: torch.fx.Node) -> str:
    stack = node.meta.get("nn_module_stack") or {}
    path, cls = list(stack.values())[-1] if stack else ("", "?")
    cls = cls.rsplit(".", 1)[-1] if isinstance(cls, str) else getattr(cls, "__name__", str(cls))
    trace = (node.meta.get("stack_trace") or "").strip().splitlines()
    src = f": {trace[-1].strip()}" if trace else ""
    return f"{path or '<root>'} ({cls}){src}"


def check_supported(graphs) -> None:
    """Every call_function target must have a lowering; report all misses at once, with where they come from."""
    missing: dict[str, list[str]] = defaultdict(list)
    for graph in graphs:
        for node in graph.nodes:
            if node.op == "call_function" and not interpreter.can_run(node.target):
                where = _where(node)
                if where not in missing[str(node.target)]:
                    missing[str(node.target)].append(where)
    if missing:
        raise UnsupportedOpError(dict(missing))


def _user_shape(node: torch.fx.Node) -> tuple:
    val = node.meta.get("val")
    shape = getattr(val, "shape", None)
    if shape is None:
        return None
    return tuple(int(d) if isinstance(d, int) else None for d in shape)  # symbolic dims -> None


def to_program(ep) -> Program:
    sig = ep.graph_signature
    placeholders = [n for n in ep.graph.nodes if n.op == "placeholder"]
    inputs, shapes, n_user = [], [], 0
    for node, spec in zip(placeholders, sig.input_specs):
        if spec.kind == InputKind.USER_INPUT:
            inputs.append(("user", n_user))
            shapes.append(_user_shape(node))
            n_user += 1
        elif spec.kind in (InputKind.PARAMETER, InputKind.BUFFER, InputKind.CONSTANT_TENSOR):
            inputs.append(("state", spec.target))
        else:
            raise NotImplementedError(f"torch_bridge: graph input kind {spec.kind.name} ({spec.target}) "
                                      "is not supported")
    outputs = []
    for spec in sig.output_specs:
        if spec.kind == OutputKind.BUFFER_MUTATION:
            outputs.append(("buffer", spec.target))
        elif spec.kind == OutputKind.USER_OUTPUT:
            outputs.append(("user", None))
        else:
            raise NotImplementedError(f"torch_bridge: graph output kind {spec.kind.name} ({spec.target}) is not "
                                      "supported (in-place mutation of a forward input?)")
    return Program(ep.graph, tuple(inputs), tuple(outputs), ep.call_spec.out_spec, tuple(shapes))


def tensor_sources(eps) -> dict[str, tuple[torch.Tensor, str]]:
    """name -> (tensor, kind) for every non-user placeholder of the given programs, kind in param/buffer/constant.

    Non-persistent buffers and lifted constants live in ``ep.constants``; they become ``constant`` unless some
    graph mutates them (then they must be carried as buffers).
    """
    found: dict[str, tuple[torch.Tensor, str]] = {}
    mutated = {s.target for ep in eps for s in ep.graph_signature.output_specs if s.kind == OutputKind.BUFFER_MUTATION}
    for ep in eps:
        for spec in ep.graph_signature.input_specs:
            if spec.target in found or spec.kind == InputKind.USER_INPUT:
                continue
            if spec.kind == InputKind.PARAMETER:
                found[spec.target] = (ep.state_dict[spec.target], "param")
            elif spec.kind == InputKind.BUFFER and spec.persistent:
                found[spec.target] = (ep.state_dict[spec.target], "buffer")
            elif spec.kind in (InputKind.BUFFER, InputKind.CONSTANT_TENSOR):
                kind = "buffer" if spec.target in mutated else "constant"
                found[spec.target] = (ep.constants[spec.target], kind)
    return found


def storage_key(t: torch.Tensor):
    """Two names with the same key are one tensor (tied weights)."""
    return (t.untyped_storage().data_ptr(), t.storage_offset(), tuple(t.shape), t.stride(), t.dtype)
