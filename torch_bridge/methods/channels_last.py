"""ChannelsLast's torch surgery (Composer's ``model.to(memory_format=torch.channels_last)``), run on the
``nn.Module`` before export; the method card is :mod:`jaxcomposer.algorithms.channels_last`."""
from __future__ import annotations

import torch
from torch import nn

from torch_bridge.module import CHANNELS_LAST_ATTR

__all__ = ["apply_channels_last_torch", "SURGERY"]


def apply_channels_last_torch(model: nn.Module):
    """In place: Composer's ``model.to(memory_format=torch.channels_last)`` (the module's 4-D parameters and
    buffers become channels-last strided; torch eager uses that layout), and the bridge's marker, so that
    ``from_torch`` lowers this module's convolutions channels-last on XLA's path. ``(model, convolutions in it)``:
    a module without convolutions is left unmarked (count 0)."""
    model.to(memory_format=torch.channels_last)
    n_convs = sum(isinstance(m, nn.modules.conv._ConvNd) for m in model.modules())
    if n_convs:
        setattr(model, CHANNELS_LAST_ATTR, True)
    return model, n_convs


SURGERY = {"ChannelsLast": apply_channels_last_torch}
