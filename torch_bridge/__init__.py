"""torch_bridge: run a PyTorch ``nn.Module`` as a pure JAX model (docs/design.md, section 'The torch bridge').

``from_torch(module, example_inputs)`` exports the module's train and eval graphs with ``torch.export``, lowers
every ATen op through the table in ``torch_bridge/ops`` and returns a :class:`BridgedModel` with flat
``params``/``buffers`` dicts and ``apply(params, buffers, key, *inputs, train=True) -> (outputs, new_buffers)``.
"""
try:
    import torch  # noqa: F401
except ImportError as error:  # the package ships with jaxcomposer; PyTorch comes with its extra
    raise ImportError("torch_bridge needs PyTorch; install it with `pip install jaxcomposer[torch]`") from error

from .export import HostRandomnessWarning, UnsupportedOpError  # noqa: E402
from .module import BridgedModel, from_torch
from .composer_model import ComposerModel, HuggingFaceModel, TorchComposerTask

from . import ops  # noqa: E402,F401  (importing the package registers every family's lowerings)

__all__ = ["from_torch", "BridgedModel", "ComposerModel", "HuggingFaceModel", "TorchComposerTask", "UnsupportedOpError",
           "HostRandomnessWarning"]
