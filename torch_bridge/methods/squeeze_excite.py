"""SqueezeExcite's torch surgery (Composer's ``SqueezeExcite2d`` / ``SqueezeExciteConv2d``), run on the
``nn.Module`` before export; the method card is :mod:`jaxcomposer.algorithms.squeeze_excite`."""
from __future__ import annotations

from typing import Optional

import torch
from torch import nn

from torch_bridge.surgery import count_module_instances, replace_module_classes

__all__ = ["SqueezeExcite2d", "SqueezeExciteConv2d", "apply_squeeze_excite_torch", "SURGERY"]


class SqueezeExcite2d(nn.Module):
    """``x * sigmoid(W2 relu(W1 avgpool(x)))`` on NCHW ``x`` (Hu et al. 2018), Composer's layout: ``pool_and_mlp``
    is ``AdaptiveAvgPool2d(1), Flatten, Linear(C, latent, bias=False), ReLU, Linear(latent, C, bias=False),
    Sigmoid``, so state-dict keys match Composer's."""

    def __init__(self, num_features: int, latent_channels: float = 0.125):
        super().__init__()
        self.latent_channels = int(latent_channels if latent_channels >= 1 else latent_channels * num_features)
        if self.latent_channels < 1:
            raise ValueError(f"SqueezeExcite: latent_channels={latent_channels} gives a hidden width of 0 for a "
                             f"layer with {num_features} channels; use latent_channels >= 1 or a larger fraction.")
        self.pool_and_mlp = nn.Sequential(nn.AdaptiveAvgPool2d(1), nn.Flatten(),
                                          nn.Linear(num_features, self.latent_channels, bias=False), nn.ReLU(),
                                          nn.Linear(self.latent_channels, num_features, bias=False), nn.Sigmoid())

    def forward(self, input: torch.Tensor) -> torch.Tensor:
        n, c, _, _ = input.shape
        return input * self.pool_and_mlp(input).reshape(n, c, 1, 1)


class SqueezeExciteConv2d(nn.Module):
    """A ``Conv2d`` followed by a :class:`SqueezeExcite2d` on its output."""

    def __init__(self, *args, latent_channels: float = 0.125, conv: Optional[nn.Conv2d] = None, **kwargs):
        super().__init__()
        self.conv = nn.Conv2d(*args, **kwargs) if conv is None else conv
        self.se = SqueezeExcite2d(num_features=self.conv.out_channels, latent_channels=latent_channels)

    def forward(self, input: torch.Tensor) -> torch.Tensor:
        return self.se(self.conv(input))

    @staticmethod
    def from_conv2d(module: nn.Conv2d, module_index: int, latent_channels: float) -> "SqueezeExciteConv2d":
        return SqueezeExciteConv2d(conv=module, latent_channels=latent_channels)


def apply_squeeze_excite_torch(model: nn.Module, latent_channels: float = 64, min_channels: int = 128):
    """Composer's surgery, in place: every ``Conv2d`` with ``min(in, out) >= min_channels`` becomes a
    :class:`SqueezeExciteConv2d` around it. ``(model, SE convs in the result)``."""

    def convert(module: nn.Conv2d, module_index: int):
        if min(module.in_channels, module.out_channels) < min_channels:
            return None
        return SqueezeExciteConv2d.from_conv2d(module, module_index, latent_channels=latent_channels)

    replace_module_classes(model, {nn.Conv2d: convert})
    return model, count_module_instances(model, SqueezeExciteConv2d)


SURGERY = {"SqueezeExcite": apply_squeeze_excite_torch}
