"""Turn an export's graph into the functional graph we lower, without ``run_decompositions`` when we can.

``torch.export.export`` returns a graph that may write in place: buffers (``num_batches_tracked.add_(1)``,
``aten.batch_norm`` updating its running statistics) and intermediates (``nn.ReLU(inplace=True)``, ``out += identity``).
``run_decompositions({})`` functionalizes it (a buffer update becomes a ``BUFFER_MUTATION`` output), but it re-traces
the whole model and costs more than the export itself. Most graphs need far less: every op is one we lower and every
in-place write is of a buffer or of a fresh intermediate. :func:`functionalize_in_place` rewrites exactly those graphs,
in place, into the form ``run_decompositions({})`` would give them (BatchNorm as ``_native_batch_norm_legit_functional``
/ ``_no_training`` / ``.no_stats``, in-place ops as their functional twins in the written tensor's dtype, buffer updates
as ``BUFFER_MUTATION`` outputs ahead of the user outputs, eval-mode dropout gone), and declines anything else, which
then takes the ``run_decompositions`` path as before: an op without a lowering (it may be a composite that decomposes
into lowered ones), a write to a parameter, an input or a view, a view taken before a write to its tensor, a
higher-order op. On the bridge's model zoo (CNN, ResNet-18/50, GPT, HF GPT-2 and BERT) every graph takes the fast path,
which makes ``from_torch`` several times faster (benchmarks/README.md, "Measurements behind code choices").
"""
from __future__ import annotations

import operator

import torch
from torch.export.graph_signature import InputKind, OutputKind, OutputSpec, TensorArgument

from . import interpreter
from .ops.registry import lookup

A = torch.ops.aten


def _batch_norm_rewrite(node):
    """``aten.batch_norm(x, w, b, running_mean, running_var, training, momentum, eps, cudnn)`` as
    ``(functional op, its args, {index of an updated running statistic in both its args and its outputs})``."""
    x, w, b, rm, rv, training, momentum, eps = node.args[:8]
    if not training:
        return A._native_batch_norm_legit_no_training.default, (x, w, b, rm, rv, momentum, eps), ()
    if rm is None:  # track_running_stats=False: batch statistics, no state
        return A._native_batch_norm_legit.no_stats, (x, w, b, True, momentum, eps), ()
    # (out, save_mean, save_rstd, new_running_mean, new_running_var)
    return A._native_batch_norm_legit_functional.default, (x, w, b, rm, rv, True, momentum, eps), (3, 4)


def _dropout_trains(node) -> bool:
    return bool(node.kwargs["train"] if "train" in node.kwargs else node.args[2])


def _functional_twin(op):
    """``aten.add_.Tensor`` -> ``aten.add.Tensor`` when that overload exists and is lowered, else None."""
    packet = op.overloadpacket.__name__
    if not packet.endswith("_") or packet.startswith("_"):
        return None
    twin = getattr(getattr(A, packet[:-1], None), op._overloadname, None)
    return twin if twin is not None and lookup(twin) is not None else None


def _writes_only_self(op) -> bool:
    args = op._schema.arguments
    return bool(args) and args[0].alias_info is not None and args[0].alias_info.is_write and not any(
        a.alias_info is not None and a.alias_info.is_write for a in args[1:])


def _returns_alias(target) -> bool:
    schema = getattr(target, "_schema", None)
    return schema is not None and any(r.alias_info is not None for r in schema.returns)


def _converts(node) -> bool:
    """``x.to(...)`` that changes the dtype (or asks for a copy): a new tensor, although the schema may alias."""
    if getattr(node.target, "overloadpacket", None) is not A.to:
        return False
    out, src = node.meta.get("val"), getattr(node.args[0], "meta", {}).get("val")
    return node.kwargs.get("copy", False) or (out is not None and src is not None and out.dtype != src.dtype)


def _plan(graph, buffer_of) -> tuple[dict, dict] | None:
    """``(plan, alias_of)``, or None when this graph needs ``run_decompositions``.

    ``plan``: ``{node: ("batch_norm" | functional twin, {arg index: root it writes})}`` for every in-place node.
    A root is a buffer placeholder or the result of an op that returns a new tensor (``nn.ReLU(inplace=True)``
    writes one); ``alias_of`` maps each root, and each in-place node's result (which is its root again), to the
    root. Parameters, inputs and views are never written here, and a view of a root written later declines.
    """
    plan, alias_of, written_at, views = {}, {ph: ph for ph in buffer_of}, {}, []
    for index, node in enumerate(graph.nodes):
        if node.op != "call_function":
            continue
        target = node.target
        if target is A.batch_norm.default:
            if node.kwargs:
                return None
            _, _, updated = _batch_norm_rewrite(node)
            writes = {i: alias_of.get(node.args[i]) for i in updated}
            alias_of[node] = node  # its output is a new tensor
        elif isinstance(target, torch._ops.OpOverload) and target._schema.is_mutable:
            twin = _functional_twin(target)
            if twin is None or not _writes_only_self(target):
                return None
            writes = {0: alias_of.get(node.args[0])}
            alias_of[node] = writes[0]
        elif not interpreter.can_run(target):
            return None
        else:
            if _returns_alias(target) and not _converts(node):
                views.append((index, node))
            elif isinstance(target, torch._ops.OpOverload) or target is operator.getitem:  # a new tensor
                alias_of[node] = node
            continue
        roots = set(writes.values())
        if None in roots or any(r.op == "placeholder" and r not in buffer_of for r in roots):
            return None
        plan[node] = ("batch_norm" if target is A.batch_norm.default else twin, writes)
        written_at.update({r: index for r in roots})  # the last write so far
    # a view taken before a write would see it in torch, not here
    for index, view in views:
        for source in view.all_input_nodes:
            root = alias_of.get(source)
            if root in written_at and written_at[root] > index:
                return None
    return plan, alias_of


def functionalize_in_place(ep) -> bool:
    """Rewrite ``ep``'s graph and signature into functional form; False (``ep`` untouched) if it needs
    ``run_decompositions``."""
    graph, sig = ep.graph, ep.graph_signature
    if any(s.kind != OutputKind.USER_OUTPUT for s in sig.output_specs):
        return False
    placeholders = [n for n in graph.nodes if n.op == "placeholder"]
    buffer_of = {n: s.target for n, s in zip(placeholders, sig.input_specs) if s.kind == InputKind.BUFFER}
    planned = _plan(graph, buffer_of)
    if planned is None:
        return False
    plan, alias_of = planned
    latest = {}  # root -> the node holding its value so far
    for node in list(graph.nodes):
        if node.op in ("call_function", "output"):
            for source in list(node.all_input_nodes):  # a read after a write sees the written value, as in torch
                value = latest.get(alias_of.get(source))
                if value is not None and value is not source:
                    node.replace_input_with(source, value)
        if node.op == "call_function" and node.target is A.dropout.default and not _dropout_trains(node):
            node.replace_all_uses_with(node.args[0])  # eval-mode dropout is the identity: gone, as decomposed
            graph.erase_node(node)
            continue
        if node not in plan:
            continue
        kind, writes = plan[node]
        if kind == "batch_norm":
            op, args, updated = _batch_norm_rewrite(node)
            with graph.inserting_before(node):
                fused = graph.call_function(op, args)
                fused.meta.update({k: node.meta[k] for k in ("nn_module_stack", "stack_trace") if k in node.meta})
                out = graph.call_function(operator.getitem, (fused, 0))
                alias_of[out] = node
                for i in updated:
                    latest[writes[i]] = graph.call_function(operator.getitem, (fused, i))
            node.replace_all_uses_with(out)
            graph.erase_node(node)
        else:  # h.add_(y) -> h' = h.add(y), in h's dtype: an in-place op never changes it, a functional one promotes
            node.target = kind
            latest[writes[0]] = node
            if node.meta.get("val") is not None:
                # h's dtype when the step runs, not the one recorded at export: under AMP (bf16 params and
                # inputs) a cast to the export's float32 would turn every activation after an
                # nn.ReLU(inplace=True) back into float32
                with graph.inserting_after(node):
                    latest[writes[0]] = graph.call_function(A.type_as.default, (node, node.args[0]))
    output = next(n for n in graph.nodes if n.op == "output")
    updated = [ph for ph in placeholders if ph in latest]
    output.args = ((*(latest[ph] for ph in updated), *output.args[0]),)
    sig.output_specs[:0] = [OutputSpec(kind=OutputKind.BUFFER_MUTATION, arg=TensorArgument(name=latest[ph].name),
                                       target=buffer_of[ph]) for ph in updated]
    graph.lint()
    return True
