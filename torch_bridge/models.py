"""Composer's small model zoo for torch users (``composer.models.mnist_model``, ``composer_resnet_cifar``), as
torch ``ComposerClassifier``s: what Composer's getting-started guides train. Reached as ``jaxcomposer.models.<name>``
through the torch adapter."""
from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from torch_bridge.mirrors import TorchResNetCIFAR

from .classifier import ComposerClassifier

__all__ = ["mnist_model", "composer_resnet_cifar"]


class MNISTNet(nn.Module):
    """Composer's MNIST network: two 3x3 convolutions (16, 32 channels; BatchNorm after the second), a 4x4 adaptive
    average pool and two linear layers (512 -> 32 -> classes)."""

    def __init__(self, num_classes: int = 10):
        super().__init__()
        self.num_classes = num_classes
        self.conv1 = nn.Conv2d(1, 16, (3, 3), padding=0)
        self.conv2 = nn.Conv2d(16, 32, (3, 3), padding=0)
        self.bn = nn.BatchNorm2d(32)
        self.fc1 = nn.Linear(32 * 16, 32)
        self.fc2 = nn.Linear(32, num_classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = F.relu(self.conv1(x))
        out = F.relu(self.bn(self.conv2(out)))
        out = torch.flatten(F.adaptive_avg_pool2d(out, (4, 4)), 1)
        return self.fc2(F.relu(self.fc1(out)))


def mnist_model(num_classes: int = 10, initializers=()) -> ComposerClassifier:
    """Composer's ``mnist_model(num_classes=10, initializers=())``: :class:`MNISTNet` as a ComposerClassifier.
    ``initializers`` are callables applied to every submodule (``module.apply``), as Composer's."""
    net = MNISTNet(num_classes)
    for initializer in initializers:
        net.apply(initializer)
    return ComposerClassifier(net, num_classes=num_classes)


def composer_resnet_cifar(model_name: str, num_classes: int = 10, width_multiplier: int = 1,
                          initializers=()) -> ComposerClassifier:
    """Composer's ``composer_resnet_cifar(model_name, num_classes=10, width_multiplier=1, initializers=None)``:
    the CIFAR ResNet ``'resnet_<depth>'`` (depth 6n+2: 20, 56, ...; 16/32/64 channels times
    ``width_multiplier``) as a ComposerClassifier."""
    prefix = "resnet_"
    depth = model_name[len(prefix):] if isinstance(model_name, str) and model_name.startswith(prefix) else ""
    if not depth.isdigit() or (int(depth) - 2) % 6 or int(depth) < 8:
        raise ValueError(f"composer_resnet_cifar: model_name={model_name!r}, expected 'resnet_<depth>' with depth "
                         "6n+2 (resnet_20, resnet_56, ...)")
    net = TorchResNetCIFAR(depth=int(depth), width=16 * int(width_multiplier), num_classes=num_classes)
    for initializer in initializers or ():
        net.apply(initializer)
    return ComposerClassifier(net, num_classes=num_classes)
