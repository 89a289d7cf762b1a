"""interop: conversion between torch ``state_dict``s and jaxcomposer's native NNX models, and torch mirrors of them.

- :mod:`interop.torch_weights`: exact, shape-checked ``state_dict`` <-> NNX weight tables for the native
  ``MLP``, ``ResNetCIFAR`` and ``GPT`` (``nnx_to_torch_state_dict``, ``torch_state_dict_to_nnx``).
- :mod:`interop.torch_mirrors`: plain PyTorch modules that compute the same functions as those native models,
  with the same module names (``TorchMLP``, ``TorchResNetCIFAR``, ``TorchGPT``).

This is separate from :mod:`torch_bridge`, which runs an arbitrary torch ``nn.Module`` as JAX; ``jaxcomposer``
itself never imports this package.
"""
