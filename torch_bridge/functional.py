"""torch's side of ``jaxcomposer.functional``: tensors to and from JAX, and the functional forms that act on a torch
model in place.

A Composer user's own torch loop calls ``jaxcomposer.functional`` with tensors and ``nn.Module``s, as it called
``composer.functional``. jaxcomposer never imports torch (docs/design.md, "The torch bridge"), so it reaches this
module through the adapter (:mod:`torch_bridge.adapter`): ``to_array``/``from_array`` carry tensors across, and
``compute_ema``/``freeze_layers`` here are the model-level forms, which must mutate the caller's modules and
optimizers because that is what Composer's do and what a torch loop relies on; ``apply_gradient_clipping`` edits
the ``.grad`` of a module's parameters in place, as Composer's.
"""
from __future__ import annotations

import itertools
from typing import Any

import jax
import numpy as np
import torch

__all__ = ["to_array", "from_array", "compute_ema", "freeze_layers", "apply_gradient_clipping"]


def to_array(x: torch.Tensor) -> jax.Array:
    """A tensor as a ``jax.Array``: zero-copy through DLPack when JAX can address the tensor's device and dtype and
    the buffer is aligned as XLA needs (torch's allocator aligns; 64-bit dtypes are narrowed by JAX, which copies),
    else a copy. Detached first: DLPack
    refuses tensors that record gradients, and the functional forms never backpropagate into torch."""
    x = x.detach()
    try:
        return jax.dlpack.from_dlpack(x)
    except (BufferError, RuntimeError, TypeError, ValueError):
        # A device JAX does not run on (a CUDA tensor with CPU-only JAX), or strides DLPack cannot express.
        return jax.dlpack.from_dlpack(x.cpu().contiguous())


def from_array(like: Any, array: Any, dtype_like: torch.Tensor | None = None) -> torch.Tensor:
    """A ``jax.Array`` (or numpy array) as a tensor on ``like``'s device, zero-copy through DLPack where possible;
    in ``dtype_like``'s dtype when given (an int64 target JAX held as int32 comes back int64, as torch losses need).
    """
    try:
        out = torch.from_dlpack(array)
    except (BufferError, RuntimeError, TypeError):
        # read-only numpy arrays cannot be exported; one copy makes a writable tensor
        out = torch.from_numpy(np.array(array))
    if dtype_like is not None and out.dtype != dtype_like.dtype:
        out = out.to(dtype_like.dtype)
    device = getattr(like, "device", None)
    if device is not None and out.device != device:
        out = out.to(device)
    return out


def compute_ema(model: torch.nn.Module, ema_model: torch.nn.Module, smoothing: float = 0.99) -> torch.nn.Module:
    """Composer's ``compute_ema`` on torch modules: ``ema = ema * smoothing + model * (1 - smoothing)`` in place,
    over the parameters and buffers ``ema_model``'s ``state_dict`` shares a name with.

    Floating tensors are averaged with Composer's exact expression (so the bits match Composer's). Integer and bool
    buffers (BatchNorm's ``num_batches_tracked``) are copied from ``model``: Composer averages them too and
    ``copy_`` truncates the float result back to an integer, which leaves a counter that no longer counts; an
    average of counts means nothing, so the current count is kept (as the pure JAX form does). Returns
    ``ema_model``, so ``ema = compute_ema(model, ema)`` reads the same for torch modules and JAX pytrees.
    """
    with torch.no_grad():
        ema_state = ema_model.state_dict()
        for name, param in itertools.chain(model.named_parameters(), model.named_buffers()):
            if name not in ema_state:
                continue
            ema = ema_state[name]
            if ema.is_floating_point() or ema.is_complex():
                ema.copy_(ema * smoothing + param.data * (1. - smoothing))
            else:
                ema.copy_(param.data)
    return ema_model


def _leaf_layers(module: torch.nn.Module, out: list[torch.nn.Module]) -> list[torch.nn.Module]:
    """Composer's ``_get_layers``: modules without children that own parameters, depth first in definition order."""
    children = list(module.children())
    if not children and any(True for _ in module.parameters()):
        out.append(module)
    for child in children:
        _leaf_layers(child, out)
    return out


def freeze_layers(model: torch.nn.Module, optimizers: Any, current_duration: float, freeze_start: float = 0.5,
                  freeze_level: float = 1.0) -> tuple[int, float]:
    """Composer's ``freeze_layers`` on a torch module: freezes the first ``int(pct * (n - 1))`` of its ``n`` leaf
    layers (never the last) by setting ``requires_grad=False`` and removing their parameters from every param group
    of ``optimizers`` (one optimizer, a sequence of them, or None), so neither momentum nor weight decay moves
    them. Returns ``(freeze_depth, freeze_percentage)``, as Composer's."""
    # the schedule is jaxcomposer's (one definition, Composer's float64 arithmetic), so both forms freeze alike
    from jaxcomposer.algorithms.layer_freezing import check_freezing_args, freeze_schedule

    check_freezing_args(freeze_start, freeze_level)
    layers = _leaf_layers(model, [])
    pct = freeze_schedule(float(current_duration), freeze_start, freeze_level)
    depth = int(pct * len(layers[:-1]))
    if optimizers is None:
        optimizers = ()
    elif isinstance(optimizers, torch.optim.Optimizer):
        optimizers = (optimizers,)
    for layer in layers[:-1][:depth]:  # the last layer (the head) is never frozen
        for p in layer.parameters():
            for opt in optimizers:
                for group in opt.param_groups:
                    group["params"] = [q for q in group["params"] if q is not p]
            p.requires_grad = False
    return depth, pct


def _unitwise_norm(t: torch.Tensor) -> torch.Tensor:
    # Composer's: one norm for tensors of <= 1 dim, else one per output unit (axis 0, torch's layout)
    if t.ndim <= 1:
        return torch.linalg.vector_norm(t, ord=2, dim=0, keepdim=False)
    return torch.linalg.vector_norm(t, ord=2, dim=tuple(range(1, t.ndim)), keepdim=True)


def apply_gradient_clipping(model: torch.nn.Module, clipping_type: str, clipping_threshold: float,
                            fsdp_enabled: bool = False) -> None:
    """Composer's ``apply_gradient_clipping`` on a torch module: clips the ``.grad`` of its parameters in place,
    ``'norm'`` and ``'value'`` with torch's own ``clip_grad_norm_`` / ``clip_grad_value_``, ``'adaptive'`` with
    Composer's unit-wise rule ``g *= clamp(thr * ||W||_u / ||G||_u, max=1)`` (NaN -> 1, no ``eps`` floor)."""
    from jaxcomposer.algorithms.gradient_clipping import check_clipping_args

    check_clipping_args(clipping_type, clipping_threshold)
    if fsdp_enabled:
        raise ValueError("apply_gradient_clipping: fsdp_enabled=True needs torch FSDP modules, which jaxcomposer "
                         "does not run (its Trainer shards the JAX step instead); pass fsdp_enabled=False.")
    params = [p for p in model.parameters() if p.grad is not None]
    if clipping_type == "norm":
        torch.nn.utils.clip_grad_norm_(params, max_norm=clipping_threshold)
    elif clipping_type == "value":
        torch.nn.utils.clip_grad_value_(params, clip_value=clipping_threshold)
    else:
        with torch.no_grad():
            for p in params:
                coeff = (_unitwise_norm(p.detach()) * clipping_threshold).div_(_unitwise_norm(p.grad.detach()))
                p.grad.detach().mul_(coeff.nan_to_num_(nan=1.0).clamp_(max=1.0))
