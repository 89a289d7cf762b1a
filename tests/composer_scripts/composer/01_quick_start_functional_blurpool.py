"""Quick Start, first block (docs/source/getting_started/quick_start.rst): the functional API's BlurPool surgery.

The docs apply ``CF.apply_blurpool`` to torchvision's ``resnet50()`` and expect the log line
"Applied BlurPool to model ResNet. Model now has 1 BlurMaxPool2d and 6 BlurConv2D layers."
torchvision is not installed here, so a small CNN with the same kinds of layers stands in: one max-pool,
a stride-2 stem convolution on 3 channels (below ``min_channels=16``, left alone) and two strided convolutions
on 16+ channels (replaced).
"""
import logging

import torch
from composer import functional as CF
from composer.algorithms.blurpool import BlurConv2d, BlurMaxPool2d

logging.basicConfig(level=logging.INFO)
model = torch.nn.Sequential(
    torch.nn.Conv2d(3, 16, kernel_size=3, stride=2, padding=1),
    torch.nn.ReLU(),
    torch.nn.MaxPool2d(kernel_size=3, stride=2, padding=1),
    torch.nn.Conv2d(16, 32, kernel_size=3, stride=2, padding=1),
    torch.nn.ReLU(),
    torch.nn.Conv2d(32, 64, kernel_size=1, stride=2),
    torch.nn.AdaptiveAvgPool2d(1),
    torch.nn.Flatten(),
    torch.nn.Linear(64, 10),
)
x = torch.randn(2, 3, 64, 64)
out_before = model(x)

CF.apply_blurpool(model)

# What Composer gives: 1 BlurMaxPool2d and 2 BlurConv2d, the stem left as a plain Conv2d, same output shape
num_blur_maxpools = sum(isinstance(m, BlurMaxPool2d) for m in model.modules())
num_blur_convs = sum(isinstance(m, BlurConv2d) for m in model.modules())
print(f'Model now has {num_blur_maxpools} BlurMaxPool2d and {num_blur_convs} BlurConv2D layers.')
assert num_blur_maxpools == 1, num_blur_maxpools
assert num_blur_convs == 2, num_blur_convs
assert type(model[0]) is torch.nn.Conv2d
assert isinstance(model[2], BlurMaxPool2d) and isinstance(model[3], BlurConv2d) and isinstance(model[5], BlurConv2d)
out_after = model(x)
assert out_after.shape == out_before.shape == (2, 10)
assert torch.isfinite(out_after).all()
