"""Factorize's torch layers and surgery (Composer's ``composer/algorithms/factorize``).

``nn.Conv2d`` -> :class:`FactorizedConv2d` (``k x k`` conv to the latent channels without bias, then a ``1 x 1``
conv with bias) and ``nn.Linear`` -> :class:`FactorizedLinear` (``in -> latent`` without bias, then ``latent ->
out``), only where ``min(in, out) >= min_*`` and factorizing lowers the multiply-adds; the new layers are freshly
initialized (``reset_parameters``), as Composer's ``from_conv2d`` / ``from_linear``. The rule and the latent sizes
are :mod:`jaxcomposer.algorithms.factorize`'s (``clean_latent_size``, ``max_rank_with_possible_speedup``).
"""
from __future__ import annotations

from typing import Optional

import torch
from torch import nn

from jaxcomposer.algorithms.factorize import clean_latent_size, latent_could_speedup, max_rank_with_possible_speedup
from torch_bridge.surgery import count_module_instances, replace_module_classes

__all__ = ["FactorizedConv2d", "FactorizedLinear", "factorizing_could_speedup_torch", "apply_factorization_torch"]


class FactorizedConv2d(nn.Module):
    """Composer's ``FactorizedConv2d``: ``module1(module0(x))``, freshly initialized."""

    def __init__(self, in_channels: int, out_channels: int, kernel_size, latent_channels: float = 0.25,
                 **conv_kwargs):
        super().__init__()
        if conv_kwargs.get("groups", 1) > 1:
            raise NotImplementedError("Factorizing grouped convolutions is not supported.")
        self.in_size, self.out_size = in_channels, out_channels
        self.latent_size = clean_latent_size(latent_channels, in_channels, out_channels)
        self.kernel_size = kernel_size
        kernel = tuple(nn.modules.utils._pair(kernel_size))
        max_rank = max_rank_with_possible_speedup(in_channels, out_channels, kernel)
        if self.latent_size > max_rank:
            raise ValueError(f"latent_channels {self.latent_size} is not small enough to merit factorization! "
                             f"Must be <= {max_rank}")
        kwargs = {k: v for k, v in conv_kwargs.items() if k != "bias"}  # the first conv never has a bias
        self.module0 = nn.Conv2d(in_channels, self.latent_size, kernel_size, bias=False, **kwargs)
        self.module1 = nn.Conv2d(self.latent_size, out_channels, kernel_size=1, bias=True)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.module1(self.module0(x))

    @staticmethod
    def from_conv2d(module: nn.Conv2d, latent_channels: float) -> "FactorizedConv2d":
        conv = FactorizedConv2d(module.in_channels, module.out_channels, module.kernel_size,
                                latent_channels=latent_channels, stride=module.stride, padding=module.padding,
                                dilation=module.dilation, groups=module.groups, bias=module.bias is not None)
        conv.module0.reset_parameters()
        conv.module1.reset_parameters()
        return conv


class FactorizedLinear(nn.Module):
    """Composer's ``FactorizedLinear``: ``module1(module0(x))``, freshly initialized."""

    def __init__(self, in_features: int, out_features: int, bias: bool = True, latent_features: float = 0.25):
        super().__init__()
        self.in_size, self.out_size = in_features, out_features
        self.latent_size = clean_latent_size(latent_features, in_features, out_features)
        max_rank = max_rank_with_possible_speedup(in_features, out_features)
        if self.latent_size > max_rank:
            raise ValueError(f"latent_features {self.latent_size} is not small enough to merit factorization! "
                             f"Must be <= {max_rank}")
        self.module0 = nn.Linear(in_features, self.latent_size, bias=False)
        self.module1 = nn.Linear(self.latent_size, out_features, bias=bias)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.module1(self.module0(x))

    @staticmethod
    def from_linear(module: nn.Linear, latent_features: float) -> "FactorizedLinear":
        linear = FactorizedLinear(module.in_features, module.out_features, bias=module.bias is not None,
                                  latent_features=latent_features)
        linear.module0.reset_parameters()  # as Composer (the same draws from torch's global RNG)
        linear.module1.reset_parameters()
        return linear


def factorizing_could_speedup_torch(module: nn.Module, latent_size: float) -> bool:
    """Composer's ``factorizing_could_speedup`` on torch modules."""
    if isinstance(module, (FactorizedConv2d, FactorizedLinear)):  # already factorized: any reduction helps
        return clean_latent_size(latent_size, module.in_size, module.out_size) <= module.latent_size - 1
    if isinstance(module, nn.Conv2d):
        if module.groups > 1:
            return False
        return latent_could_speedup(latent_size, module.in_channels, module.out_channels, tuple(module.kernel_size))
    if isinstance(module, nn.Linear):
        return latent_could_speedup(latent_size, module.in_features, module.out_features)
    return False


def apply_factorization_torch(model: nn.Module, factorize_convs: bool = True, factorize_linears: bool = True,
                              min_channels: int = 512, latent_channels: float = 0.25, min_features: int = 512,
                              latent_features: float = 0.25) -> nn.Module:
    """Composer's ``apply_factorization`` on a torch module, in place: convs first, then linears."""
    if factorize_convs:
        _factorize_where_worthwhile(model, nn.Conv2d, lambda m: (m.in_channels, m.out_channels), min_channels,
                                    latent_channels, FactorizedConv2d.from_conv2d)
    if factorize_linears:
        _factorize_where_worthwhile(model, nn.Linear, lambda m: (m.in_features, m.out_features), min_features,
                                    latent_features, FactorizedLinear.from_linear)
    return model


def _factorize_where_worthwhile(model: nn.Module, layer_type: type, sizes, min_size: int, latent_size: float,
                                factorize) -> None:
    """Every ``layer_type`` module whose ``min(*sizes(module)) >= min_size`` and whose factorization at
    ``latent_size`` saves multiply-adds becomes ``factorize(module, latent_size)``, in place."""
    def maybe(module: nn.Module, index: int) -> Optional[nn.Module]:
        wide_enough = min(sizes(module)) >= min_size
        if factorizing_could_speedup_torch(module, latent_size) and wide_enough:
            return factorize(module, latent_size)
        return None
    replace_module_classes(model, {layer_type: maybe})


def _surgery(model: nn.Module, **kwargs):
    """The ``"Factorize"`` surgery: ``(the module, factorized layers in it)``."""
    apply_factorization_torch(model, **kwargs)
    return model, count_module_instances(model, (FactorizedConv2d, FactorizedLinear))


SURGERY = {"Factorize": _surgery}
