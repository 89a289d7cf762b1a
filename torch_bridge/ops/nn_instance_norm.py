"""``aten.instance_norm``, including the running statistics torch's export loses.

``nn.InstanceNorm*d(track_running_stats=True)`` updates ``running_mean``/``running_var`` in training, but the ATen
schema of ``instance_norm`` does not mark them as written (torch's composite implementation copies into them
behind the schema's back), so ``torch.export`` records no ``BUFFER_MUTATION`` for them and a plain lowering would
train with statistics that never move. :func:`track_instance_norm_stats` repairs the exported graph: each
training-mode ``instance_norm`` that tracks statistics becomes :func:`instance_norm_with_stats`, which also returns
the new statistics, written back as buffer mutations as torch writes them.

torch's definition (``aten/src/ATen/native/Normalization.cpp``): the input is viewed as ``(1, N*C, ...)`` and batch
normalized with the running statistics repeated ``N`` times, so each (example, channel) plane is normalized by its
own mean and biased variance, and each running statistic moves by ``momentum`` towards the mean over the batch of
the per-plane means and *unbiased* variances. Evaluation (``use_input_stats=False``) normalizes with the running
statistics.
"""
from __future__ import annotations

import operator

import jax.numpy as jnp
from jax import lax

import torch
from torch.export.graph_signature import InputKind, OutputKind, OutputSpec, TensorArgument

from .registry import lower

A = torch.ops.aten


def _affine(y, weight, bias):
    shape = (1, -1) + (1,) * (y.ndim - 2)
    if weight is not None:
        y = y * weight.reshape(shape)
    if bias is not None:
        y = y + bias.reshape(shape)
    return y


def _plane_stats(x):
    axes = tuple(range(2, x.ndim))
    x32 = x.astype(jnp.float32)
    mean = x32.mean(axes, keepdims=True)
    var = jnp.square(x32 - mean).mean(axes, keepdims=True)
    return mean, var


def instance_norm_with_stats(input, weight, bias, running_mean, running_var, use_input_stats, momentum, eps,
                             cudnn_enabled):
    """Training-mode ``instance_norm`` that returns ``(out, new_running_mean, new_running_var)``: the graph target
    :func:`track_instance_norm_stats` puts in place of ``aten.instance_norm`` (a plain function, lowered by itself)."""
    mean, var = _plane_stats(input)
    out = ((input.astype(jnp.float32) - mean) * lax.rsqrt(var + eps)).astype(input.dtype)
    n = 1
    for d in input.shape[2:]:
        n *= d
    unbiased = var * (n / max(n - 1, 1))
    batch_mean = mean.reshape(input.shape[:2]).mean(0)
    batch_var = unbiased.reshape(input.shape[:2]).mean(0)
    new_mean = ((1 - momentum) * running_mean + momentum * batch_mean).astype(running_mean.dtype)
    new_var = ((1 - momentum) * running_var + momentum * batch_var).astype(running_var.dtype)
    return _affine(out, weight, bias), new_mean, new_var


lower(instance_norm_with_stats)(instance_norm_with_stats)


@lower(A.instance_norm.default)
def instance_norm(input, weight, bias, running_mean, running_var, use_input_stats, momentum, eps, cudnn_enabled):
    """Per-plane statistics (``use_input_stats``), else the running ones; the statistics' update, when there is one,
    is :func:`instance_norm_with_stats`'s (see the module docstring)."""
    x = input  # (N, C, ...): torch's module adds the batch axis to unbatched inputs before calling the op
    if use_input_stats:
        mean, var = _plane_stats(x)
    else:
        if running_mean is None or running_var is None:
            raise ValueError("torch_bridge: instance_norm without input statistics needs running_mean and "
                             "running_var (torch raises the same)")
        shape = (1, -1) + (1,) * (x.ndim - 2)
        mean, var = running_mean.reshape(shape).astype(jnp.float32), running_var.reshape(shape).astype(jnp.float32)
    return _affine(((x.astype(jnp.float32) - mean) * lax.rsqrt(var + eps)).astype(x.dtype), weight, bias)


def track_instance_norm_stats(ep) -> None:
    """Rewrite ``ep`` (a functional export) so training-mode ``instance_norm`` nodes that track statistics write
    them back: each becomes :func:`instance_norm_with_stats`, its new statistics ``BUFFER_MUTATION`` outputs."""
    graph, sig = ep.graph, ep.graph_signature
    placeholders = [n for n in graph.nodes if n.op == "placeholder"]
    buffer_of = {n: s.target for n, s in zip(placeholders, sig.input_specs) if s.kind == InputKind.BUFFER}
    already = {s.target for s in sig.output_specs if s.kind == OutputKind.BUFFER_MUTATION}
    updates = []
    for node in list(graph.nodes):
        if node.op != "call_function" or node.target is not A.instance_norm.default:
            continue
        args = list(node.args)
        if node.kwargs or len(args) != 9:  # export passes all nine positionally
            raise NotImplementedError(f"torch_bridge: instance_norm node {node.name} with keyword arguments "
                                      f"{sorted(node.kwargs)} is not supported")
        running_mean, running_var, use_input_stats = args[3], args[4], args[5]
        if running_mean is None or not use_input_stats:
            continue  # no statistics, or evaluation: nothing is written
        stats = (running_mean, running_var)
        if any(s not in buffer_of or buffer_of[s] in already for s in stats):
            raise NotImplementedError(
                f"torch_bridge: instance_norm node {node.name} updates running statistics that are not plain "
                "buffers of the module (or that another op also writes); convert the module with "
                "track_running_stats=False, or report this model")
        with graph.inserting_before(node):
            fused = graph.call_function(instance_norm_with_stats, tuple(args))
            fused.meta.update({k: node.meta[k] for k in ("nn_module_stack", "stack_trace") if k in node.meta})
            out = graph.call_function(operator.getitem, (fused, 0))
            new_stats = [graph.call_function(operator.getitem, (fused, i)) for i in (1, 2)]
        node.replace_all_uses_with(out)
        graph.erase_node(node)
        updates += [(buffer_of[s], new) for s, new in zip(stats, new_stats)]
        already.update(buffer_of[s] for s in stats)
    if not updates:
        return
    output = next(n for n in graph.nodes if n.op == "output")
    # buffer mutations come first, as torch orders a functional export's outputs
    n_mutations = sum(s.kind == OutputKind.BUFFER_MUTATION for s in sig.output_specs)
    values = list(output.args[0])
    output.args = ((*values[:n_mutations], *(new for _, new in updates), *values[n_mutations:]),)
    sig.output_specs[n_mutations:n_mutations] = [
        OutputSpec(kind=OutputKind.BUFFER_MUTATION, arg=TensorArgument(name=new.name), target=target)
        for target, new in updates]
    graph.lint()
