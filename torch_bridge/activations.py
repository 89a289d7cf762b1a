"""Every submodule's inputs and outputs in one run of a bridged model (``ActivationMonitor``'s torch side).

The compiled step has no forward hooks. Instead the exported graph tells where each module's values are: torch.export
marks every node with ``nn_module_stack``, the modules whose ``forward`` was running when the node was made. A
module's *outputs* are the nodes made inside it that are used outside it (by a node outside its stack, or as a user
output of the graph); its *inputs* are the tensors made outside it (a user input or another module's node, not a
parameter, buffer or constant) that nodes inside it use. Both are in graph order. The graph is copied with those
nodes added to its outputs and run by the same interpreter the training runs, so the values are the ones the model
computes (dropout masks included, in train mode with the same key).

A module called more than once (``fc@1`` in the stack) reports its last call, as Composer's hooks, which log every
call under one name, leave the last value. Reached through the torch adapter as
``adapters.model_adapter(model).functional["module_activations"]``.
"""
from __future__ import annotations

import dataclasses
import weakref
from typing import Any

import jax
import torch

from .interpreter import run_graph

__all__ = ["ModuleActivations", "module_activations"]


@dataclasses.dataclass
class ModuleActivations:
    """One module's values: ``module_type`` is its class (the module object's, looked up by path), ``inputs`` and
    ``outputs`` lists of arrays in graph order."""

    module_type: type | str
    inputs: list
    outputs: list


@dataclasses.dataclass(frozen=True)
class _Plan:
    graph: torch.fx.Graph  # the program's graph, with the recorded nodes appended to its outputs
    n_outputs: int  # the program's own flat outputs, first
    modules: dict  # path -> (module type, [input slots], [output slots]); a slot indexes the appended outputs


_PLANS: "weakref.WeakKeyDictionary[torch.fx.Graph, _Plan]" = weakref.WeakKeyDictionary()


def _is_tensor(node: torch.fx.Node) -> bool:
    return isinstance(node.meta.get("val"), torch.Tensor)


def _module_type(root: torch.nn.Module, path: str, recorded: Any):
    try:
        return type(root.get_submodule(path)) if path else type(root)
    except AttributeError:  # a module surgery replaced since the export: the class name torch.export recorded
        return recorded if isinstance(recorded, (type, str)) else str(recorded)


def _plan(prog, root: torch.nn.Module) -> _Plan:
    graph = prog.graph
    if graph in _PLANS:
        return _PLANS[graph]
    nodes = list(graph.nodes)
    user_inputs = {node for node, (kind, _) in zip([n for n in nodes if n.op == "placeholder"], prog.inputs)
                   if kind == "user"}
    out_node = next(n for n in nodes if n.op == "output")
    flat_out = list(out_node.args[0])
    user_outputs = {node for node, (kind, _) in zip(flat_out, prog.outputs)
                    if kind == "user" and isinstance(node, torch.fx.Node)}
    stacks = {n: dict(n.meta.get("nn_module_stack") or {}) for n in nodes if n.op == "call_function"}

    calls: dict[str, dict] = {}  # stack key (one call of a module) -> its path, type, inputs and outputs
    for node, stack in stacks.items():
        for key, (path, cls) in stack.items():
            calls.setdefault(key, {"path": path, "type": cls, "inputs": [], "outputs": []})
        if not _is_tensor(node):
            continue
        for user in node.users:  # the modules this node's value leaves
            left = set(stack) if user.op == "output" and node in user_outputs else \
                set(stack) - set(stacks.get(user, {})) if user.op == "call_function" else set()
            for key in left:
                if node not in calls[key]["outputs"]:
                    calls[key]["outputs"].append(node)
        for arg in node.all_input_nodes:  # the values entering the modules this node is in
            if not _is_tensor(arg) or (arg.op == "placeholder" and arg not in user_inputs):
                continue
            entered = set(stack) - set(stacks.get(arg, {}))
            for key in entered:
                if arg not in calls[key]["inputs"]:
                    calls[key]["inputs"].append(arg)
    order = {n: i for i, n in enumerate(nodes)}
    recorded: list[torch.fx.Node] = []
    slot: dict[torch.fx.Node, int] = {}
    modules: dict[str, tuple] = {}
    for call in calls.values():  # a later call of the same module replaces an earlier one
        slots = []
        for group in ("inputs", "outputs"):
            group_slots = []
            for n in sorted(call[group], key=order.__getitem__):
                if n not in slot:
                    slot[n] = len(recorded)
                    recorded.append(n)
                group_slots.append(slot[n])
            slots.append(group_slots)
        modules[call["path"]] = (_module_type(root, call["path"], call["type"]), *slots)

    copy = torch.fx.Graph()
    env: dict[torch.fx.Node, torch.fx.Node] = {}
    out = copy.graph_copy(graph, env)
    out = tuple(out) if isinstance(out, (tuple, list)) else (out,)
    copy.output(out + tuple(env[n] for n in recorded))
    _PLANS[graph] = plan = _Plan(copy, len(out), modules)
    return plan


def module_activations(bridged, params, buffers, *inputs, train: bool = False,
                       key=None) -> dict[str, ModuleActivations]:
    """``{module path: ModuleActivations}`` for every module of ``bridged`` (a ``BridgedModel``) that the forward
    runs, the root included (path ``''``), paths as ``bridged.module.named_modules()`` names them.

    ``params``/``buffers`` as :meth:`BridgedModel.apply` takes them (the Trainer's ``train_state.params`` and
    ``.model_state``); ``inputs`` the module's positional inputs. ``train`` picks the train or eval graph; ``key``
    feeds dropout as in ``apply`` (each node folds in its index in the graph, the same in the copy). Pure and
    traceable: under ``jax.jit`` the graph walk happens once, at trace time.
    """
    prog = bridged._programs.get(bool(train))
    if prog is None:
        raise ValueError(f"torch_bridge: the {'train' if train else 'eval'} graph was not exported")
    from .module import to_jax
    inputs = [to_jax(x) for x in jax.tree_util.tree_leaves(inputs)]
    prog, constants = bridged._program_for(prog, inputs, bool(train))
    inputs = bridged._check_inputs(prog, inputs, train)
    state = {**bridged.constants, **constants, **params, **{a: params[leaf] for a, leaf in bridged.aliases.items()},
             **buffers}
    placeholders = [state[ref] if kind == "state" else inputs[ref] for kind, ref in prog.inputs]
    plan = _plan(prog, bridged.module)
    values = run_graph(plan.graph, placeholders, key, conv_layout=bridged.conv_layout)[plan.n_outputs:]
    return {path: ModuleActivations(cls, [values[i] for i in ins], [values[i] for i in outs])
            for path, (cls, ins, outs) in plan.modules.items()}
