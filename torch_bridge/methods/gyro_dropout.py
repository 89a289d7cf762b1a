"""GyroDropout's torch surgery: ``nn.Dropout`` -> :class:`GyroDropoutLayer`, edited in place (Composer's policy).

The layer keeps Composer's bookkeeping in buffers rather than Python attributes, so torch.export turns it into
``BUFFER_MUTATION`` outputs and the bridged model carries it in its (checkpointed) model state: the ``sigma``
masks (drawn at the first training call), the chosen ``tau`` indices and the call counter. The mask buffer's
width is the feature count, which a dropout layer does not know, so it is a lazy buffer materialized by the
first call (as Composer draws its masks at the first call).
"""
from __future__ import annotations

import numpy as np
import torch
from torch import nn
from torch.nn.modules.lazy import LazyModuleMixin

from jaxcomposer.algorithms.gyro_dropout import gyro_iter_num
from torch_bridge.surgery import replace_module_classes


class GyroDropoutLayer(LazyModuleMixin, nn.Module):
    """Composer's ``GyroDropoutLayer`` with its state in buffers; masks cover ``x.shape[1:]`` (Composer's 2-D
    ``(B, features)`` case, generalized as the native layer's)."""

    def __init__(self, iters_per_epoch: float, max_epoch: float, p: float, sigma: int, tau: int):
        super().__init__()
        self.p, self.sigma, self.tau = float(p), int(sigma), int(tau)
        self.iter_num = gyro_iter_num(iters_per_epoch * max_epoch, self.sigma, self.tau)
        self.preselect_masks = nn.UninitializedBuffer()
        self.register_buffer("selected_idx", torch.zeros(self.tau, dtype=torch.long))
        self.register_buffer("training_step", torch.zeros((), dtype=torch.long))

    def initialize_parameters(self, x: torch.Tensor) -> None:  # LazyModuleMixin: the first call knows the width
        if self.has_uninitialized_params():
            with torch.no_grad():
                self.preselect_masks.materialize((self.sigma, *x.shape[1:]), dtype=torch.float32, device=x.device)
                self.preselect_masks.zero_()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if not self.training:
            return x
        if x.ndim < 2:
            raise ValueError(f"GyroDropoutLayer: expects (batch, features, ...) inputs, got shape {tuple(x.shape)}.")
        batch = x.shape[0]
        if not torch.compiler.is_exporting() and batch % self.tau:  # the exported graph serves any batch size
            raise ValueError(f"GyroDropoutLayer: the batch ({batch}) must be a multiple of tau={self.tau}: it is "
                             f"split into tau equal chunks, one mask each.")
        first = self.training_step == 0
        masks = torch.where(first, (torch.rand(self.sigma, *x.shape[1:], device=x.device) > self.p).float(),
                            self.preselect_masks)
        fresh = torch.randint(0, self.sigma, (self.tau,), device=x.device)
        picked = torch.where(self.training_step % self.iter_num == 0, fresh, self.selected_idx)
        # row r uses mask r // (batch // tau): tau equal contiguous chunks (Composer's repeat_interleave), written
        # without a reshape so a symbolic batch size exports without a divisibility guard
        chunk = torch.div(torch.arange(batch, device=x.device) * self.tau, batch, rounding_mode="floor")
        mask = masks[picked][chunk]
        self.preselect_masks.copy_(masks)
        self.selected_idx.copy_(picked)
        self.training_step.add_(1)
        return x * mask.to(x.dtype) * (1 / (1 - self.p))


def materialize(model: nn.Module, example_inputs) -> None:
    """Give every GyroDropoutLayer its mask buffer's width with one eval-mode, no-grad call on ``example_inputs``
    (arrays, as the Trainer's first batch holds them): torch.export cannot fakify an uninitialized buffer. Eval
    mode changes no state (dropout off, BatchNorm reads its running statistics)."""
    if not any(isinstance(m, GyroDropoutLayer) and m.has_uninitialized_params() for m in model.modules()):
        return
    inputs = example_inputs if isinstance(example_inputs, tuple) else (example_inputs,)
    inputs = tuple(torch.from_numpy(np.array(x)) for x in inputs)
    was = model.training
    try:
        with torch.no_grad():
            model.eval()(*inputs)
    finally:
        model.train(was)


def apply_gyro_dropout_torch(model: nn.Module, *, total_iters: float, p: float, sigma: int, tau: int):
    """Every ``nn.Dropout`` becomes a :class:`GyroDropoutLayer`, in place (Composer's policy).

    Returns ``(model, number replaced, materialize)``: ``materialize(model, example_inputs)`` must run before the
    bridge exports the model (the method does it when the Trainer binds the task to its first batch)."""
    policy = {nn.Dropout: lambda module, index: GyroDropoutLayer(total_iters, 1, p, sigma, tau)}
    model, replaced = replace_module_classes(model, policy)
    return model, len(replaced), materialize


SURGERY = {"GyroDropout": apply_gyro_dropout_torch}
