"""WeightStandardization's torch surgery (Composer's ``composer/algorithms/weight_standardization``).

Conv1d/2d/3d weights are parametrized with ``torch.nn.utils.parametrize.register_parametrization``: the forward
uses ``(W - mean) / sqrt(var + 1e-10)`` per output channel (``var_mean`` over dims 1.., biased), the stored
``weight`` stays raw (``<conv>.parametrizations.weight.original``). torch.export inlines the parametrization, so a
bridged model computes it in its graph. See :mod:`jaxcomposer.algorithms.weight_standardization`.
"""
from __future__ import annotations

import logging

import torch
import torch.nn.utils.parametrize as parametrize
from torch import nn

from torch_bridge.surgery import count_module_instances

__all__ = ["WeightStandardizer", "apply_weight_standardization_torch"]

log = logging.getLogger(__name__)

_CONVS = (nn.Conv1d, nn.Conv2d, nn.Conv3d)


def _standardize_weights(weight: torch.Tensor) -> torch.Tensor:
    var, mean = torch.var_mean(weight, dim=list(range(1, weight.dim())), keepdim=True, unbiased=False)
    return (weight - mean) / torch.sqrt(var + 1e-10)


class WeightStandardizer(nn.Module):
    """The parametrization: a conv weight standardized per output channel."""

    def forward(self, weight: torch.Tensor) -> torch.Tensor:
        return _standardize_weights(weight)


def apply_weight_standardization_torch(module: nn.Module, n_last_layers_ignore: int = 0) -> int:
    """Parametrizes the first ``count - n_last_layers_ignore`` convs in ``torch.fx`` trace order (Composer's); the
    number parametrized."""
    try:  # a traced GraphModule lists its submodules in the order the forward first calls them
        ordered = torch.fx.symbolic_trace(module)
    except Exception:
        if n_last_layers_ignore > 0:
            log.warning(f"Model could not be symbolically traced. Modules ignored due to "
                        f"n_last_layers={n_last_layers_ignore} may not be the actual last layers of the network.")
        ordered = module
    target = max(count_module_instances(ordered, _CONVS) - n_last_layers_ignore, 0)
    done = 0
    for m in ordered.modules():  # the GraphModule holds the original conv objects, so this edits ``module``
        if done == target:
            break
        if isinstance(m, _CONVS):
            parametrize.register_parametrization(m, "weight", WeightStandardizer())
            done += 1
    return done


def _surgery(module: nn.Module, *, n_last_layers_ignore: int) -> tuple[nn.Module, int]:
    """The ``"WeightStandardization"`` surgery: ``(module, the number of convs standardized)``."""
    return module, apply_weight_standardization_torch(module, n_last_layers_ignore)


SURGERY = {"WeightStandardization": _surgery}
