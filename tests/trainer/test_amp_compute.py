"""``precision='amp_bf16'`` computes in bf16: every convolution and matmul of the forward takes bf16 operands, for
native NNX models (whose flax layers would otherwise promote back to float32: BatchNorm to its running statistics,
Embed to the dtype it fixed at construction) and for bridged torch models (whose in-place ops, such as
``nn.ReLU(inplace=True)``, keep the dtype their tensor has when the step runs). One table, one test per property."""
from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import torch
from flax import nnx
from torch import nn

import torch_bridge
from jaxcomposer.models import (BERT, GPT, MLP, ComposerCausalLM, ComposerClassifier, ComposerMaskedLM, ConvNet,
                                ResNetCIFAR, ViT, resnet50)
from jaxcomposer.trainer.step import make_forward
from tests.jaxprs import equations

MATMULS = ("conv_general_dilated", "dot_general")


class TorchInPlaceCNN(nn.Module):
    """torchvision's habits: ``nn.ReLU(inplace=True)``, a max-pool after it, ``out += identity``."""

    def __init__(self):
        super().__init__()
        self.stem, self.bn, self.relu = nn.Conv2d(3, 8, 3, padding=1, bias=False), nn.BatchNorm2d(8), nn.ReLU(True)
        self.pool, self.conv = nn.MaxPool2d(3, 2, 1), nn.Conv2d(8, 8, 3, padding=1, bias=False)
        self.head = nn.Linear(8, 10)

    def forward(self, x):
        identity = self.pool(self.relu(self.bn(self.stem(x))))
        out = self.conv(identity)
        out += identity
        return self.head(self.relu(out).mean((2, 3)))


def _images(layout: str):
    rng = np.random.default_rng(0)
    shape = (2, 3, 16, 16) if layout == "nchw" else (2, 16, 16, 3)
    return {"input": rng.standard_normal(shape, np.float32), "target": rng.integers(0, 10, (2,), np.int32)}


def _tokens(length: int = 17):
    return {"input_ids": np.random.default_rng(0).integers(1, 64, (2, length), np.int32)}


def _bridged():
    torch.manual_seed(0)
    module = TorchInPlaceCNN().train()
    return torch_bridge.from_torch(module, (torch.zeros(2, 3, 16, 16),), dynamic_batch=False, modes=(True,))


def _masked_lm():
    batch = _tokens(16)
    batch["labels"] = np.where(np.arange(16) % 4 == 0, batch["input_ids"], -100).astype(np.int32)
    model = BERT(vocab_size=64, max_position_embeddings=16, d_model=32, n_layers=1, n_heads=2, d_ff=64,
                 dropout=0.0, attention_dropout=0.0, rngs=nnx.Rngs(0))
    return ComposerMaskedLM(model), batch


CASES = {
    "resnet50_layout": lambda: (ComposerClassifier(resnet50(num_classes=10, layers=(1, 1), width=8), num_classes=10),
                                _images("nhwc")),
    "resnet_cifar": lambda: (ComposerClassifier(ResNetCIFAR(depth=8, width=8, rngs=nnx.Rngs(0))), _images("nhwc")),
    # oneDNN's convolutions (CPU custom calls) take the bf16 operands as they are
    "convnet_onednn": lambda: (ComposerClassifier(ConvNet((8, 16), (2, 2), in_channels=3, image_size=16,
                                                          conv_impl="onednn", rngs=nnx.Rngs(0))), _images("nhwc")),
    "mlp": lambda: (ComposerClassifier(MLP(16 * 16 * 3, (32,), rngs=nnx.Rngs(0))), _images("nhwc")),
    "vit": lambda: (ComposerClassifier(ViT(16, 8, 10, d_model=32, n_layers=1, n_heads=2, mlp_dim=64,
                                           rngs=nnx.Rngs(0))), _images("nhwc")),
    "gpt": lambda: (ComposerCausalLM(GPT(vocab_size=64, seq_len=16, d_model=32, n_layers=1, n_heads=2,
                                         rngs=nnx.Rngs(0))), _tokens()),
    "bert_mlm": _masked_lm,
    "bridged_in_place_cnn": lambda: (ComposerClassifier(_bridged(), num_classes=10), _images("nchw")),
}


@pytest.fixture(scope="module", params=list(CASES))
def case(request):
    task, batch = CASES[request.param]()
    task = task.bind(batch) if not task.is_bound else task
    return request.param, task, batch


def _matmuls(jaxpr) -> list:
    return [(eqn.primitive.name, tuple(v.aval.dtype for v in eqn.invars)) for eqn in equations(jaxpr)
            if eqn.primitive.name in MATMULS]


def test_every_forward_matmul_and_conv_runs_in_bf16(case):
    name, task, batch = case
    forward = make_forward(task, "amp_bf16")
    closed = jax.make_jaxpr(lambda p, s, b: forward(p, s, b, train=True, key=jax.random.key(0)))(
        task.params, task.state, batch)
    found = _matmuls(closed.jaxpr)
    assert found, name
    wide = [(prim, dtypes) for prim, dtypes in found if any(d != jnp.bfloat16 for d in dtypes)]
    assert not wide, f"{name}: {len(wide)} of {len(found)} not in bf16, e.g. {wide[:3]}"


def test_amp_outputs_are_float32_and_close_to_fp32(case):
    """The bf16 forward computes the same function: float32 outputs within bf16's rounding of the fp32 ones, and
    the running statistics stay float32."""
    name, task, batch = case
    outs = {}
    for precision in ("fp32", "amp_bf16"):
        out, state = make_forward(task, precision)(task.params, task.state, batch, train=True,
                                                   key=jax.random.key(0))
        assert all(x.dtype == y.dtype for x, y in zip(jax.tree.leaves(state), jax.tree.leaves(task.state))), name
        outs[precision] = jax.tree.leaves(out)
    for full, low in zip(outs["fp32"], outs["amp_bf16"]):
        assert low.dtype == jnp.float32, name
        rel = float(jnp.linalg.norm(low - full) / jnp.linalg.norm(full))
        assert rel < 3e-2, f"{name}: relative error {rel:.3g} against fp32"


def test_the_users_module_keeps_its_layer_dtypes():
    """Only the copy each step builds computes in bf16: the module the user passed keeps float32 layers."""
    model = GPT(vocab_size=64, seq_len=16, d_model=32, n_layers=1, n_heads=2, rngs=nnx.Rngs(0))
    task = ComposerCausalLM(model).bind(_tokens())
    make_forward(task, "amp_bf16")(task.params, task.state, _tokens(), train=True, key=None)
    assert model.wte.dtype == jnp.float32 and model.blocks[0].attn.qkv.dtype is None


def test_a_dtype_the_user_gave_a_layer_stays():
    """``compute_in`` changes only layers left at their default dtype: a head built with ``dtype=float32`` (to keep
    the logits matmul in float32 under AMP) keeps it, the default layer before it computes in bf16."""
    class TwoLayers(nnx.Module):
        def __init__(self, rngs):
            self.body = nnx.Linear(8, 16, rngs=rngs)
            self.head = nnx.Linear(16, 10, dtype=jnp.float32, rngs=rngs)

        def __call__(self, x, *, train=False, key=None):
            return self.head(jax.nn.relu(self.body(x.reshape(x.shape[0], -1))))

    task = ComposerClassifier(TwoLayers(nnx.Rngs(0)), num_classes=10)
    batch = {"input": np.ones((2, 8), np.float32), "target": np.zeros(2, np.int32)}
    task = task.bind(batch) if not task.is_bound else task
    forward = make_forward(task, "amp_bf16")
    closed = jax.make_jaxpr(lambda p, s, b: forward(p, s, b, train=True, key=None))(task.params, task.state, batch)
    assert [dtypes for _, dtypes in _matmuls(closed.jaxpr)] == [(jnp.bfloat16,) * 2, (jnp.float32,) * 2]
