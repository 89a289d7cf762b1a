"""ChannelsLast.

Method card
-----------
**What it does.** Makes convolutions compute on channels-last (NHWC) activations. On a torch module it does what
Composer does, ``model.to(memory_format=torch.channels_last)``, and marks the module. The torch bridge already
runs 2-D convolution nets channels-last by default (``from_torch(conv_layout='NHWC')``,
:mod:`torch_bridge.channels_last`: activations stay NHWC from a convolution to the first op that needs NCHW), so
for training here the method changes nothing beyond the torch module's memory format, which matters to whoever
runs that module eagerly afterwards. Native NNX models are NHWC already: there it changes nothing and warns.

**When it helps.** In torch eager on GPUs with tensor cores, where cuDNN's NHWC kernels skip the layout
conversions NCHW needs (Composer's v0.10 README lists 1.5x time-to-train for ResNet-101 on 8xA100). Here the
bridge's default gives that layout to every bridged CNN, faster on the CPU than ``conv_layout='NCHW'`` (torch's
layout, with a transpose into and out of every convolution; ``benchmarks/channels_last.py``).

**Hyperparameters.** None.

**Exact Composer semantics.** As ``composer/algorithms/channels_last``: the torch module's 4-D parameters and
buffers are made channels-last (in place) once, at the start of training; the functional
``apply_channels_last(model)`` does the same (and returns the model, where Composer returns ``None``). Additions:
the bridge marker (see above), and a :class:`~jaxcomposer.errors.NoEffectWarning` when the model has
nothing to change: a native NNX model (always NHWC), or a torch module without ``nn.Conv*`` modules (Composer
converts silently). Composer does not declare ``required_on_load``, and neither does this: the parameters and their
names are unchanged, so a checkpoint loads with or without the method.

**How it plugs in.** ``model`` slot, ``model(task, ctx) -> task`` (host, once, before the optimizer is built). A
torch-sourced task is edited on its ``nn.Module`` before the bridge exports it, by the surgery torch_bridge registers
under ``"ChannelsLast"`` (:func:`jaxcomposer.core.adapters.surgery`, :mod:`torch_bridge.methods.channels_last`), so
this module never imports torch. That surgery sets ``torch_bridge.module.CHANNELS_LAST_ATTR`` on the module; the
bridge convolves channels-last with or without it (``conv_layout='NCHW'`` asks for torch's layout).

**Reference.** PyTorch, "(beta) Channels Last Memory Format in PyTorch" tutorial; NVIDIA, "Tensor Layouts In
Memory: NCHW vs NHWC" (cuDNN developer guide). Composer: ``composer/algorithms/channels_last``.
"""
from __future__ import annotations

import warnings
from typing import Any

from flax import nnx

from jaxcomposer.errors import NoEffectWarning
from jaxcomposer.algorithms.nnx_surgery import apply_surgery
from jaxcomposer.core.method import Method, MethodEntry

__all__ = ["ChannelsLast", "apply_channels_last"]


def apply_channels_last(model: Any, *, inplace: bool | None = None):
    """Composer's ``apply_channels_last(model)``.

    A torch module is converted to ``torch.channels_last`` and marked for the bridge, in place, and returned. A
    Flax NNX module is returned as it is (a clone unless ``inplace=True``, as other surgeries) with a
    :class:`NoEffectWarning`: its convolutions are NHWC already. A torch module without convolutions warns too.
    """
    new, n_convs = apply_surgery("ChannelsLast", model, lambda m: (m if inplace else nnx.clone(m), None),
                                 who="apply_channels_last")
    if n_convs is None:  # the NNX branch counts nothing: it changes nothing
        warnings.warn(NoEffectWarning(
            f"ChannelsLast did not change {type(model).__name__}: Flax NNX convolutions compute in NHWC "
            "(channels-last) already."), stacklevel=2)
    elif n_convs == 0:
        warnings.warn(NoEffectWarning(
            f"ChannelsLast did not change any convolution of {type(model).__name__}: it has no nn.Conv module."),
            stacklevel=2)
    return new


def ChannelsLast() -> Method:
    """Composer's ``ChannelsLast()`` as a :class:`Method` (``model`` slot)."""

    def model_fn(task, ctx):  # in place, as Composer: the module the user passed is the trained one
        return task.with_model(apply_channels_last(task.source, inplace=True))

    return Method(name="ChannelsLast", model=model_fn, description="ChannelsLast()")


ENTRY = MethodEntry(registry_name="channels_last", factory=ChannelsLast, functional=(apply_channels_last,))
