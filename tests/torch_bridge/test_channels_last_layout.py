"""``conv_layout='NHWC'``: activations stay channels-last between convolutions (``torch_bridge.channels_last``).

One table of small torch models, each exercising a handled op or a place where the layout must turn back to NCHW
(flatten, a transposed convolution) or could be tempted to (per-channel operands, ceil-mode and padded pooling); per
model, the NHWC graph equals torch and the NCHW graph (outputs, updated buffers, gradients), and conv chains, a
ConvNeXt block and concatenations transpose only the image (and the output).
"""
from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import torch
from torch import nn

from tests.jaxprs import equations
from torch_bridge import from_torch


class Residual(nn.Module):
    """torchvision's habits: in-place ReLU, max-pool, ``out += identity``, global average pool, linear head."""

    def __init__(self):
        super().__init__()
        self.stem, self.bn = nn.Conv2d(3, 8, 3, padding=1, bias=False), nn.BatchNorm2d(8)
        self.pool = nn.MaxPool2d(3, 2, 1)
        self.conv, self.bn2 = nn.Conv2d(8, 8, 3, padding=1, bias=False), nn.BatchNorm2d(8)
        self.head = nn.Linear(8, 5)

    def forward(self, x):
        identity = self.pool(torch.relu_(self.bn(self.stem(x))))
        out = self.bn2(self.conv(identity))
        out += identity
        out = nn.functional.avg_pool2d(torch.relu(out), 3, 1, 1)  # the padding counted in the divisor
        return self.head(nn.functional.adaptive_avg_pool2d(out, 1).flatten(1))


class Mixed(nn.Module):
    """A biased 'same' conv, a depthwise conv, a per-channel (C,1,1) scale, sigmoid gating, average and ceil-mode
    max pooling, then flatten into a linear (which needs NCHW again)."""

    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d(3, 6, 3, padding="same")
        self.dw = nn.Conv2d(6, 6, 3, padding=1, groups=6)
        self.scale = nn.Parameter(torch.linspace(0.5, 1.5, 6).reshape(6, 1, 1))
        self.pool = nn.MaxPool2d(2, ceil_mode=True)
        self.head = nn.Linear(6 * 5 * 5, 4)

    def forward(self, x):
        y = self.conv(x)
        y = y * torch.sigmoid(self.dw(y)) * self.scale
        y = nn.functional.avg_pool2d(y, 3, 1, 1, ceil_mode=True, count_include_pad=False)
        return self.head(self.pool(y).flatten(1))


class UpDown(nn.Module):
    """A strided conv, a transposed conv back up (declined: it runs NCHW), then a mean over H and W kept."""

    def __init__(self):
        super().__init__()
        self.down, self.bn = nn.Conv2d(3, 4, 3, 2, 1), nn.BatchNorm2d(4)
        self.up = nn.ConvTranspose2d(4, 3, 2, 2)

    def forward(self, x):
        return (self.up(torch.relu(self.bn(self.down(x)))) + x).mean((2, 3), keepdim=True)


class ConvNeXtBlock(nn.Module):
    """ConvNeXt's block: a depthwise conv, then ``permute(0, 2, 3, 1)`` to run LayerNorm and the MLP channels-last,
    ``permute(0, 3, 1, 2)`` back, and the residual add; after the stem, Hugging Face's channels-first LayerNorm
    (means over C kept as dims, a per-channel (C, 1, 1) scale and shift)."""

    def __init__(self, c: int = 8):
        super().__init__()
        self.stem = nn.Conv2d(3, c, 2, 2)
        self.stem_scale, self.stem_shift = nn.Parameter(torch.rand(c) + 0.5), nn.Parameter(torch.rand(c) - 0.5)
        self.dw, self.norm = nn.Conv2d(c, c, 7, padding=3, groups=c), nn.LayerNorm(c)
        self.fc1, self.fc2 = nn.Linear(c, 4 * c), nn.Linear(4 * c, c)

    def forward(self, x):
        x = self.stem(x)
        mean = x.mean(1, keepdim=True)
        x = (x - mean) / torch.sqrt((x - mean).pow(2).mean(1, keepdim=True) + 1e-6)
        x = self.stem_scale[:, None, None] * x + self.stem_shift[:, None, None]
        y = self.norm(self.dw(x).permute(0, 2, 3, 1))
        y = self.fc2(nn.functional.gelu(self.fc1(y))).permute(0, 3, 1, 2)
        return (x + y).mean((2, 3))


class InceptionLike(nn.Module):
    """Branches joined by ``torch.cat`` along channels (and once along width), the input itself among them."""

    def __init__(self):
        super().__init__()
        self.a, self.b = nn.Conv2d(3, 4, 1), nn.Conv2d(3, 6, 3, padding=1)
        self.head = nn.Conv2d(13, 2, 3, padding=1)

    def forward(self, x):
        y = self.head(torch.cat([self.a(x), torch.relu(self.b(x)), x], dim=1))
        return torch.cat([y, y * 2], dim=-1)


MODELS = {"residual": Residual, "mixed": Mixed, "up_down": UpDown, "convnext_block": ConvNeXtBlock,
          "inception_like": InceptionLike}


def _run(module: nn.Module, x: np.ndarray, layout: str, train: bool):
    bm = from_torch(module.train(train), (torch.from_numpy(x),), dynamic_batch=False, modes=(train,),
                    conv_layout=layout)

    def loss(params):
        out, buffers = bm.apply(params, bm.buffers, None, x, train=train)
        return jnp.sum(out * jnp.cos(out)), (out, buffers)

    (_, (out, buffers)), grads = jax.value_and_grad(loss, has_aux=True)(bm.params)
    return out, buffers, grads


@pytest.mark.parametrize("train", [True, False], ids=["train", "eval"])
@pytest.mark.parametrize("name", list(MODELS))
def test_nhwc_equals_nchw_and_torch(name, train):
    torch.manual_seed(0)
    module = MODELS[name]()
    x = np.random.default_rng(1).standard_normal((4, 3, 10, 10)).astype(np.float32)
    nchw, nhwc = (_run(module, x, layout, train) for layout in ("NCHW", "NHWC"))
    with torch.no_grad():
        expected = module.train(train)(torch.from_numpy(x)).numpy()
    np.testing.assert_allclose(np.asarray(nhwc[0]), expected, rtol=1e-4, atol=1e-4)
    np.testing.assert_allclose(np.asarray(nhwc[0]), np.asarray(nchw[0]), rtol=1e-5, atol=1e-5)
    for key in nchw[1]:
        np.testing.assert_allclose(np.asarray(nhwc[1][key]), np.asarray(nchw[1][key]), rtol=1e-5, atol=1e-5,
                                   err_msg=key)
    for key in nchw[2]:
        scale = float(jnp.max(jnp.abs(nchw[2][key]))) or 1.0
        np.testing.assert_allclose(np.asarray(nhwc[2][key]) / scale, np.asarray(nchw[2][key]) / scale,
                                   rtol=1e-5, atol=1e-5, err_msg=key)


def _activation_transposes(jaxpr, batch: int) -> list:
    """Transposes of 4-D batch-leading tensors with spatial extent (activations, not kernels or pooled vectors)."""
    shapes = [eqn.invars[0].aval.shape for eqn in equations(jaxpr) if eqn.primitive.name == "transpose"]
    return [s for s in shapes if len(s) == 4 and s[0] == batch and min(s[1:]) > 1]


@pytest.mark.parametrize("blocks", [1, 4])
def test_a_conv_chain_transposes_its_activations_once(blocks):
    """Only the image turns channels-last; every activation after it stays so up to the pooled output."""
    layers = [nn.Conv2d(3, 8, 3, padding=1), nn.BatchNorm2d(8), nn.ReLU(inplace=True)]
    for _ in range(blocks - 1):
        layers += [nn.Conv2d(8, 8, 3, padding=1, bias=False), nn.BatchNorm2d(8), nn.ReLU(), nn.MaxPool2d(3, 1, 1)]
    module = nn.Sequential(*layers, nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(8, 2)).train()
    x = np.ones((5, 3, 6, 6), np.float32)  # a batch no kernel dim equals
    bm = from_torch(module, (torch.from_numpy(x),), dynamic_batch=False, modes=(True,), conv_layout="NHWC")
    forward = jax.make_jaxpr(lambda p: bm.apply(p, bm.buffers, None, x)[0])(bm.params)
    assert _activation_transposes(forward.jaxpr, 5) == [(5, 3, 6, 6)]


def test_convnext_permutes_move_no_data():
    """Into channels-last and back around the LayerNorm and MLP: only the image is transposed."""
    module = ConvNeXtBlock().train()
    x = np.ones((5, 3, 8, 8), np.float32)  # a batch no kernel dim equals
    bm = from_torch(module, (torch.from_numpy(x),), dynamic_batch=False, modes=(True,))
    forward = jax.make_jaxpr(lambda p: bm.apply(p, bm.buffers, None, x)[0])(bm.params)
    assert _activation_transposes(forward.jaxpr, 5) == [(5, 3, 8, 8)]


def test_cat_joins_channels_last_data():
    """Branches joined along channels and along width: the image goes in (once per reader; XLA merges those) and
    the output comes out, nothing else."""
    module = InceptionLike().train()
    x = np.ones((5, 3, 8, 8), np.float32)  # a batch no kernel dim equals
    bm = from_torch(module, (torch.from_numpy(x),), dynamic_batch=False, modes=(True,))
    forward = jax.make_jaxpr(lambda p: bm.apply(p, bm.buffers, None, x)[0])(bm.params)
    assert set(_activation_transposes(forward.jaxpr, 5)) == {(5, 3, 8, 8), (5, 8, 16, 2)}
