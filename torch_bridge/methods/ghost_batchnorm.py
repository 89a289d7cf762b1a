"""GhostBatchNorm's torch layers and surgery (Composer's ``composer/algorithms/ghost_batchnorm``).

``nn.BatchNorm1d/2d/3d`` -> ``GhostBatchNorm1d/2d/3d`` wrapping the original BatchNorm (its ``weight``, ``bias``
and running buffers become ``<name>.batchnorm.*``). In training the batch is split with ``torch.chunk(x,
ceil(B / g), 0)`` and the wrapped BatchNorm runs on each chunk with its momentum divided by ``ceil(B / g)``; the
running variance is torch's unbiased one. See :mod:`jaxcomposer.algorithms.ghost_batchnorm` for the method card.

Export: the bridge exports with a symbolic batch size, but the chunking depends on its value. So while
``torch.export`` traces, the layer emits one opaque op, ``jaxcomposer::ghost_batch_norm`` (its fake kernel only
needs shapes), and the lowering registered below does the chunking in JAX, where the batch size is concrete at
trace time; it runs the bridge's own BatchNorm lowering on each chunk, so the bridged layer computes what the
eager torch layer does. Eagerly (not exporting) the layer is Composer's Python loop, differentiable by autograd.
"""
from __future__ import annotations

from typing import Optional

import torch
from torch import nn
from torch.nn.modules.batchnorm import _BatchNorm

from torch_bridge.ops.nn import batch_norm_functional
from torch_bridge.ops.registry import lower
from torch_bridge.surgery import count_module_instances, replace_module_classes

__all__ = ["GhostBatchNorm1d", "GhostBatchNorm2d", "GhostBatchNorm3d", "apply_ghost_batchnorm_torch"]


def _n_chunks(batch_size, ghost_batch_size: int):
    return (batch_size + ghost_batch_size - 1) // ghost_batch_size  # ceil, also on export's symbolic sizes


def _check_batch(batch_size: int, ghost_batch_size: int) -> None:
    if batch_size < ghost_batch_size:
        raise ValueError(f"Worker batch size {batch_size} < ghost_batch_size {ghost_batch_size}")


@torch.library.custom_op("jaxcomposer::ghost_batch_norm", mutates_args=())
def _ghost_batch_norm_op(x: torch.Tensor, weight: Optional[torch.Tensor], bias: Optional[torch.Tensor],
                         running_mean: torch.Tensor, running_var: torch.Tensor, ghost_batch_size: int,
                         momentum: float, eps: float) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Training-mode ghost BatchNorm: ``(output, new running mean, new running var)`` (for export only);
    ``momentum`` is the BatchNorm's own, divided here by the number of chunks."""
    _check_batch(x.shape[0], ghost_batch_size)
    n_chunks = _n_chunks(x.shape[0], ghost_batch_size)
    mean, var = running_mean.clone(), running_var.clone()
    chunks = [torch.nn.functional.batch_norm(c, mean, var, weight, bias, True, momentum / n_chunks, eps)
              for c in x.chunk(n_chunks, 0)]
    return torch.cat(chunks, 0), mean, var


@_ghost_batch_norm_op.register_fake
def _(x, weight, bias, running_mean, running_var, ghost_batch_size, momentum, eps):
    return torch.empty_like(x), torch.empty_like(running_mean), torch.empty_like(running_var)


@lower(torch.ops.jaxcomposer.ghost_batch_norm.default)
def _lower_ghost_batch_norm(x, weight, bias, running_mean, running_var, ghost_batch_size, momentum, eps):
    """The bridge's BatchNorm lowering chunk by chunk (``torch.chunk``'s sizes), running stats threaded through."""
    import jax.numpy as jnp

    _check_batch(x.shape[0], ghost_batch_size)
    n_chunks = _n_chunks(x.shape[0], ghost_batch_size)
    size = -(-x.shape[0] // n_chunks)
    outs = []
    for start in range(0, x.shape[0], size):
        out, _, _, running_mean, running_var = batch_norm_functional(
            x[start:start + size], weight, bias, running_mean, running_var, True, momentum / n_chunks, eps)
        outs.append(out)
    return jnp.concatenate(outs, axis=0), running_mean, running_var


class _GhostBatchNorm(nn.Module):
    """A BatchNorm applied to ghost batches of ``ghost_batch_size`` examples (axis 0) in training."""

    def __init__(self, base_batchnorm: _BatchNorm, ghost_batch_size: int = 32):
        super().__init__()
        self.ghost_batch_size = int(ghost_batch_size)
        self.batchnorm = base_batchnorm
        self.batchnorm._already_ghost_batchnormed = True  # as Composer: a second surgery does not wrap it again

    def forward(self, input: torch.Tensor) -> torch.Tensor:
        if not self.training:  # running statistics: chunking changes nothing (the method card's deviation)
            return self.batchnorm(input)
        momentum = self.batchnorm.momentum
        if momentum is None:
            raise ValueError("GhostBatchNorm: a BatchNorm with momentum=None (a cumulative average) cannot be "
                             "scaled per ghost batch.")
        n_chunks = _n_chunks(input.shape[0], self.ghost_batch_size)
        if torch.compiler.is_exporting():  # the batch size is symbolic: the op's lowering checks it
            return self._exported_forward(input, n_chunks)
        _check_batch(input.shape[0], self.ghost_batch_size)
        # applying the BatchNorm once per chunk would move the running statistics n_chunks times as far
        self.batchnorm.momentum = float(momentum) / n_chunks
        try:
            chunks = [self.batchnorm(chunk) for chunk in input.chunk(n_chunks, 0)]
        finally:
            self.batchnorm.momentum = momentum
        return torch.cat(chunks, dim=0)

    def _exported_forward(self, input: torch.Tensor, n_chunks) -> torch.Tensor:
        bn = self.batchnorm
        if not bn.track_running_stats or bn.running_mean is None:
            raise ValueError("GhostBatchNorm: exporting needs a BatchNorm with running statistics "
                             "(track_running_stats=True).")
        out, mean, var = _ghost_batch_norm_op(input, bn.weight, bn.bias, bn.running_mean, bn.running_var,
                                              self.ghost_batch_size, float(bn.momentum), bn.eps)
        with torch.no_grad():
            bn.running_mean.copy_(mean)
            bn.running_var.copy_(var)
            bn.num_batches_tracked.add_(n_chunks)
        return out


class GhostBatchNorm1d(_GhostBatchNorm):
    pass


class GhostBatchNorm2d(_GhostBatchNorm):
    pass


class GhostBatchNorm3d(_GhostBatchNorm):
    pass


_GHOST_TYPE = {nn.BatchNorm1d: GhostBatchNorm1d, nn.BatchNorm2d: GhostBatchNorm2d, nn.BatchNorm3d: GhostBatchNorm3d}


def apply_ghost_batchnorm_torch(model: nn.Module, ghost_batch_size: int = 32, *, inplace: bool = True):
    """Wraps every ``BatchNorm1d/2d/3d`` of ``model`` (in place, as Composer) not wrapped before:
    ``(model or the copy, replaced)``."""

    def policy_for(ghost_type):
        def maybe_replace(module: nn.Module, index: int) -> Optional[nn.Module]:
            if getattr(module, "_already_ghost_batchnormed", False):
                return None
            return ghost_type(module, ghost_batch_size=ghost_batch_size)
        return maybe_replace

    return replace_module_classes(model, {cls: policy_for(g) for cls, g in _GHOST_TYPE.items()}, inplace=inplace)


def _surgery(model: nn.Module, *, ghost_batch_size: int):
    """The ``"GhostBatchNorm"`` surgery: ``(the module, ghost BatchNorm layers in it)``."""
    new, _ = apply_ghost_batchnorm_torch(model, ghost_batch_size)
    return new, count_module_instances(new, _GhostBatchNorm)


SURGERY = {"GhostBatchNorm": _surgery}
