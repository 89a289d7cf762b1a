"""torch_bridge: run a PyTorch ``nn.Module`` as a pure JAX model (reference/bridge.md §3).

``from_torch(module, example_inputs)`` exports the module's train and eval graphs with ``torch.export``, lowers
every ATen op through the table in ``torch_bridge/ops`` and returns a :class:`BridgedModel` with flat
``params``/``buffers`` dicts and ``apply(params, buffers, key, *inputs, train=True) -> (outputs, new_buffers)``.
"""
import importlib

from .export import UnsupportedOpError
from .module import BridgedModel, from_torch

# Importing an ops module registers its lowerings. The loop tolerates modules that do not exist yet; any other
# import error (a duplicate registration, a bug) is raised.
for _name in ("elementwise", "reduction", "shape", "creation", "nn"):
    try:
        importlib.import_module(f"{__name__}.ops.{_name}")
    except ModuleNotFoundError as _e:
        if _e.name != f"{__name__}.ops.{_name}":
            raise
del _name

__all__ = ["from_torch", "BridgedModel", "UnsupportedOpError"]
