"""interop: conversion between torch ``state_dict``s and jaxcomposer's native NNX models, and torch mirrors of them.

- :mod:`interop.torch_weights`: exact, shape-checked ``state_dict`` <-> NNX weight tables for the native models
  (``MLP``, ``ResNetCIFAR``, the torchvision ResNets, GPT/GPT-2, BERT, ViT): ``from_torch_state_dict`` (a name or
  module, and a state dict or a ``.pt``/``.safetensors`` file) and ``to_torch_state_dict``.
- :mod:`interop.torch_mirrors`: plain PyTorch modules that compute the same functions as those native models,
  with the same module names (``TorchMLP``, ``TorchResNetCIFAR``, ``TorchGPT``).

This is separate from :mod:`torch_bridge`, which runs an arbitrary torch ``nn.Module`` as JAX; ``jaxcomposer``
itself never imports this package.
"""
