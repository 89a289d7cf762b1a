"""Plain PyTorch mirrors of jaxcomposer's native Flax NNX models (``jaxcomposer.models``).

Each mirror computes exactly the same function as its native counterpart, with the same module attribute names,
so :mod:`torch_bridge.weights` can move weights between them with a short, explicit rename table:

- :class:`TorchMLP` <-> :class:`jaxcomposer.models.mlp.MLP`
- :class:`TorchResNetCIFAR` <-> :class:`jaxcomposer.models.resnet.ResNetCIFAR` (NCHW here, NHWC natively; the
  weights are the same up to the HWIO <-> OIHW conv-kernel transpose, activations differ in layout only)
- :class:`TorchConvNet` <-> :class:`jaxcomposer.models.convnet.ConvNet` (likewise; its flatten head reads the final
  map in H, W, C order, as the NHWC native model does)
- :class:`TorchGPT` <-> :class:`jaxcomposer.models.gpt.GPT`

Initialisation follows the native models' distributions (not their random streams), so a freshly built mirror is
a sensible starting point for training too. ``bn_momentum`` uses the flax convention (weight of the *old* running
average, 0.9 by default); torch's ``momentum`` is ``1 - bn_momentum``. Note torch updates ``running_var`` with
the unbiased batch variance while flax uses the biased one, so BN running statistics drift very slightly apart
when the *same* model is trained in both frameworks; weights themselves convert exactly.
"""
from __future__ import annotations

import math
from typing import Sequence

import torch
import torch.nn.functional as F
from torch import nn

__all__ = ["TorchMLP", "TorchResNetCIFAR", "TorchBasicBlock", "TorchConvNet", "TorchGPT", "TorchBlock", "TorchCausalSelfAttention"]


def _lecun_normal_(weight: torch.Tensor) -> None:
    """flax's default ``lecun_normal``: truncated normal (+-2 std) with variance 1 / fan_in."""
    fan_in = weight.shape[1] if weight.ndim == 2 else weight[0].numel()
    std = math.sqrt(1.0 / fan_in) / 0.87962566103423978  # stddev of a standard normal truncated to [-2, 2]
    nn.init.trunc_normal_(weight, std=std, a=-2 * std, b=2 * std)


def _linear(cin: int, cout: int, bias: bool = True, std: float | None = None) -> nn.Linear:
    layer = nn.Linear(cin, cout, bias=bias)
    with torch.no_grad():
        if std is None:
            _lecun_normal_(layer.weight)
        else:
            nn.init.normal_(layer.weight, std=std)
        if bias:
            nn.init.zeros_(layer.bias)
    return layer


# ---------------------------------------------------------------------------------------------------------------
# MLP
class TorchMLP(nn.Module):
    """``Linear -> ReLU -> Dropout`` per hidden width, then a linear head; inputs are flattened to ``(B, -1)``."""

    def __init__(self, in_features: int, hidden: Sequence[int] = (256,), num_classes: int = 10,
                 dropout: float = 0.0):
        super().__init__()
        if not 0.0 <= dropout < 1.0:
            raise ValueError(f"TorchMLP: dropout must be in [0, 1), got {dropout}.")
        self.in_features, self.num_classes = in_features, num_classes
        widths = [in_features, *hidden]
        self.hidden = nn.ModuleList([_linear(a, b) for a, b in zip(widths[:-1], widths[1:])])
        self.drop = nn.Dropout(dropout)
        self.head = _linear(widths[-1], num_classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x.reshape(x.shape[0], -1)
        if x.shape[1] != self.in_features:
            raise ValueError(f"TorchMLP: inputs flatten to {x.shape[1]} features, "
                             f"expected in_features={self.in_features}.")
        for layer in self.hidden:
            x = self.drop(F.relu(layer(x)))
        return self.head(x)


# ---------------------------------------------------------------------------------------------------------------
# ResNetCIFAR
def _conv(cin: int, cout: int, kernel: int, stride: int) -> nn.Conv2d:
    conv = nn.Conv2d(cin, cout, kernel, stride=stride, padding=kernel // 2, bias=False)
    nn.init.kaiming_normal_(conv.weight, mode="fan_out", nonlinearity="relu")
    return conv


def _bn(c: int, bn_momentum: float, zero: bool = False) -> nn.BatchNorm2d:
    bn = nn.BatchNorm2d(c, eps=1e-5, momentum=1.0 - bn_momentum)
    with torch.no_grad():
        (nn.init.zeros_ if zero else nn.init.ones_)(bn.weight)
        nn.init.zeros_(bn.bias)
    return bn


class TorchBasicBlock(nn.Module):
    """``relu(bn2(conv2(relu(bn1(conv1(x))))) + shortcut(x))``; projection ``proj_bn(proj_conv(x))`` on shape change."""

    def __init__(self, cin: int, cout: int, stride: int, bn_momentum: float, zero_init_residual: bool):
        super().__init__()
        self.conv1 = _conv(cin, cout, 3, stride)
        self.bn1 = _bn(cout, bn_momentum)
        self.conv2 = _conv(cout, cout, 3, 1)
        self.bn2 = _bn(cout, bn_momentum, zero=zero_init_residual)
        if stride != 1 or cin != cout:
            self.proj_conv = _conv(cin, cout, 1, stride)
            self.proj_bn = _bn(cout, bn_momentum)
        else:
            self.proj_conv = self.proj_bn = None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = F.relu(self.bn1(self.conv1(x)))
        y = self.bn2(self.conv2(y))
        shortcut = x if self.proj_conv is None else self.proj_bn(self.proj_conv(x))
        return F.relu(y + shortcut)


class TorchResNetCIFAR(nn.Module):
    """CIFAR ResNet (depth 6n+2) on NCHW images, mirroring the native NHWC ``ResNetCIFAR``."""

    def __init__(self, depth: int = 20, width: int = 16, num_classes: int = 10, in_channels: int = 3,
                 stem_stride: int = 1, widen: Sequence[int] = (1, 2, 4), bn_momentum: float = 0.9,
                 zero_init_residual: bool = False):
        super().__init__()
        if not isinstance(depth, int) or depth < 8 or (depth - 2) % 6 != 0:
            raise ValueError(f"TorchResNetCIFAR: depth must be 6n+2 with n >= 1, got depth={depth!r}.")
        n = (depth - 2) // 6
        self.depth, self.num_classes = depth, num_classes
        self.stem_conv = _conv(in_channels, width, 3, stem_stride)
        self.stem_bn = _bn(width, bn_momentum)
        blocks, cin = [], width
        for stage, mult in enumerate(widen):
            cout = width * mult
            for i in range(n):
                stride = 2 if (stage > 0 and i == 0) else 1
                blocks.append(TorchBasicBlock(cin, cout, stride, bn_momentum, zero_init_residual))
                cin = cout
        self.blocks = nn.ModuleList(blocks)
        self.head = _linear(cin, num_classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if x.ndim != 4:
            raise ValueError(f"TorchResNetCIFAR: expected NCHW images (B, C, H, W), got shape {tuple(x.shape)}.")
        x = F.relu(self.stem_bn(self.stem_conv(x)))
        for block in self.blocks:
            x = block(x)
        return self.head(x.mean(dim=(2, 3)))


# ---------------------------------------------------------------------------------------------------------------
# ConvNet
class TorchConvNet(nn.Module):
    """``conv -> BN -> ReLU`` stages and a linear head on NCHW images, mirroring the native NHWC ``ConvNet``."""

    def __init__(self, channels: Sequence[int] = (32, 64, 128), strides: Sequence[int] = (2, 2, 2),
                 kernel_size: int = 3, num_classes: int = 10, in_channels: int = 1, image_size: int = 28,
                 head: str = "flatten", bn_momentum: float = 0.9):
        super().__init__()
        if head not in ("flatten", "avg"):
            raise ValueError(f"TorchConvNet: head must be 'flatten' or 'avg', got {head!r}.")
        cins = (in_channels, *channels[:-1])
        self.convs = nn.ModuleList([_conv(a, b, kernel_size, s) for a, b, s in zip(cins, channels, strides)])
        self.bns = nn.ModuleList([_bn(c, bn_momentum) for c in channels])
        size = image_size
        for s in strides:
            size = (size + 2 * (kernel_size // 2) - kernel_size) // s + 1
        self.head_kind = head
        self.head = _linear(channels[-1] * (size * size if head == "flatten" else 1), num_classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for conv, bn in zip(self.convs, self.bns):
            x = F.relu(bn(conv(x)))
        if self.head_kind == "avg":
            return self.head(x.mean(dim=(2, 3)))
        # flattened in (H, W, C) order, as the NHWC native model does, so the head's weights map one to one
        return self.head(x.permute(0, 2, 3, 1).flatten(1))


# ---------------------------------------------------------------------------------------------------------------
# GPT
class TorchCausalSelfAttention(nn.Module):
    def __init__(self, d_model: int, n_heads: int, resid_std: float):
        super().__init__()
        if d_model % n_heads != 0:
            raise ValueError(f"TorchGPT: d_model={d_model} must be divisible by n_heads={n_heads}.")
        self.n_heads = n_heads
        self.qkv = _linear(d_model, 3 * d_model, std=0.02)
        self.proj = _linear(d_model, d_model, std=resid_std)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, t, d = x.shape
        q, k, v = self.qkv(x).split(d, dim=-1)
        q, k, v = (z.view(b, t, self.n_heads, d // self.n_heads).transpose(1, 2) for z in (q, k, v))
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        return self.proj(y.transpose(1, 2).reshape(b, t, d))


class TorchBlock(nn.Module):
    """``x + drop(attn(ln1(x)))`` then ``x + drop(fc_proj(gelu_tanh(fc(ln2(x)))))``."""

    def __init__(self, d_model: int, n_heads: int, mlp_ratio: int, dropout: float, resid_std: float):
        super().__init__()
        self.ln1 = nn.LayerNorm(d_model, eps=1e-5)
        self.attn = TorchCausalSelfAttention(d_model, n_heads, resid_std)
        self.ln2 = nn.LayerNorm(d_model, eps=1e-5)
        self.fc = _linear(d_model, mlp_ratio * d_model, std=0.02)
        self.fc_proj = _linear(mlp_ratio * d_model, d_model, std=resid_std)
        self.drop = nn.Dropout(dropout)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.drop(self.attn(self.ln1(x)))
        h = self.fc_proj(F.gelu(self.fc(self.ln2(x)), approximate="tanh"))
        return x + self.drop(h)


class TorchGPT(nn.Module):
    """Tokens ``(B, T)`` long -> logits ``(B, T, vocab_size)``; pre-LN nanoGPT layout like the native ``GPT``.

    With ``tie_embeddings`` there is no ``lm_head`` module: logits are ``x @ wte.weight.T``, so the state dict
    holds the shared matrix once, as ``wte.weight``.
    """

    def __init__(self, vocab_size: int = 256, seq_len: int = 128, d_model: int = 128, n_layers: int = 4,
                 n_heads: int = 4, mlp_ratio: int = 4, dropout: float = 0.0, tie_embeddings: bool = True):
        super().__init__()
        if not 0.0 <= dropout < 1.0:
            raise ValueError(f"TorchGPT: dropout must be in [0, 1), got {dropout}.")
        self.vocab_size, self.seq_len, self.n_layers = vocab_size, seq_len, n_layers
        resid_std = 0.02 / math.sqrt(2 * n_layers)
        self.wte = nn.Embedding(vocab_size, d_model)
        self.wpe = nn.Embedding(seq_len, d_model)
        with torch.no_grad():
            nn.init.normal_(self.wte.weight, std=0.02)
            nn.init.normal_(self.wpe.weight, std=0.02)
        self.drop = nn.Dropout(dropout)
        self.blocks = nn.ModuleList([TorchBlock(d_model, n_heads, mlp_ratio, dropout, resid_std)
                                     for _ in range(n_layers)])
        self.ln_f = nn.LayerNorm(d_model, eps=1e-5)
        self.lm_head = None if tie_embeddings else _linear(d_model, vocab_size, bias=False, std=0.02)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        if tokens.ndim != 2 or tokens.dtype.is_floating_point:
            raise ValueError(f"TorchGPT: expected int tokens (B, T), got {tokens.dtype} {tuple(tokens.shape)}.")
        b, t = tokens.shape
        if t > self.seq_len:
            raise ValueError(f"TorchGPT: sequence length {t} exceeds seq_len={self.seq_len}.")
        x = self.drop(self.wte(tokens) + self.wpe(torch.arange(t, device=tokens.device))[None])
        for block in self.blocks:
            x = block(x)
        x = self.ln_f(x)
        return F.linear(x, self.wte.weight) if self.lm_head is None else self.lm_head(x)
