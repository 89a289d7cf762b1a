"""Run an exported fx graph on jax arrays, node by node, through the op table.

The walk happens at trace time only: under ``jax.jit`` it emits one jaxpr and costs nothing per step. Python-level
nodes that are not ATen ops (``operator.getitem`` on multi-output ops, symbolic-size arithmetic from dynamic batch,
shape assertions) are handled here rather than in the op table.
"""
from __future__ import annotations

import operator
from typing import Any, Callable

import jax
import torch

from . import channels_last
from .ops.registry import lookup

A = torch.ops.aten

# shape/metadata assertions torch.export leaves in the graph; they have no value to compute
_NO_OPS = {getattr(getattr(A, name, None), "default", None)
           for name in ("_assert_tensor_metadata", "_assert_scalar", "sym_constrain_range_for_size")} - {None}


def _python_op(target) -> Callable | None:
    """Plain Python callables the graph may hold: operator.* (getitem, symbolic-int math) and sym_size."""
    if getattr(target, "__module__", None) in ("_operator", "operator"):
        return target
    if target in (A.sym_size.int,):
        return lambda x, dim: x.shape[dim]
    if target in _NO_OPS:
        return lambda *a, **k: None
    return None


def can_run(target) -> bool:
    return lookup(target) is not None or _python_op(target) is not None


def _resolve(arg, env: dict):
    if isinstance(arg, torch.fx.Node):
        return env[arg]
    if isinstance(arg, (list, tuple)):
        return type(arg)(_resolve(a, env) for a in arg)
    if isinstance(arg, dict):
        return {k: _resolve(v, env) for k, v in arg.items()}
    return arg


def _with_note(node: torch.fx.Node, fn: Callable, *args, **kwargs):
    """``fn(*args, **kwargs)``; an error says which node and module it came from."""
    try:
        return fn(*args, **kwargs)
    except Exception as e:
        stack = list((node.meta.get("nn_module_stack") or {}).values())
        where = repr(stack[-1][0]) if stack else "<root>"
        e.add_note(f"torch_bridge: while running node {node.name} = {node.target} (from {where})")
        raise


def run_graph(graph: torch.fx.Graph, placeholders: list, key, *, conv_layout: str = "NCHW") -> list:
    """Evaluate ``graph`` with the given placeholder values (in order); returns the flat output list.

    Random ops get ``key=jax.random.fold_in(key, node_index)``: a pure function of the caller's key and the node,
    so two dropout layers draw different masks and the same key replays the same masks. With ``key=None`` random
    ops receive ``None`` and raise only if they actually need randomness (dropout with p > 0 in train mode).
    ``conv_layout="NHWC"`` runs 2-D convolution nets channels-last: activations stay NHWC from a convolution to
    the first op that needs NCHW (:mod:`torch_bridge.channels_last`); other convolutions transpose around the call.
    """
    env: dict[torch.fx.Node, Any] = {}
    values = iter(placeholders)
    for index, node in enumerate(graph.nodes):
        if node.op == "placeholder":
            env[node] = next(values)
        elif node.op == "call_function":
            args, kwargs = _resolve(node.args, env), _resolve(node.kwargs, env)
            if conv_layout == "NHWC":
                out = _with_note(node, channels_last.run, node.target, args, kwargs)
                if out is not channels_last.DECLINED:
                    env[node] = out
                    continue
                args, kwargs = channels_last.to_nchw(args), channels_last.to_nchw(kwargs)
            lowering = lookup(node.target)
            if lowering is None:
                fn = _python_op(node.target)
                if fn is None:  # from_torch checks this up front; reaching here means a graph was swapped
                    raise NotImplementedError(f"torch_bridge: no lowering for {node.target}")
                env[node] = fn(*args, **kwargs)
                continue
            if lowering.random:
                if "key" in kwargs:
                    raise TypeError(f"torch_bridge: {node.target} has an argument named 'key' in kwargs, which "
                                    "clashes with the PRNG key keyword; its lowering must take it positionally")
                kwargs["key"] = None if key is None else jax.random.fold_in(key, index)
            if lowering.conv_layout:
                kwargs["conv_layout"] = conv_layout
            env[node] = _with_note(node, lowering.fn, *args, **kwargs)
        elif node.op == "output":
            return list(channels_last.to_nchw(_resolve(node.args[0], env)))
        else:
            raise NotImplementedError(f"torch_bridge: fx node kind {node.op!r} ({node.target}) is not supported")
    raise ValueError("torch_bridge: graph has no output node")
