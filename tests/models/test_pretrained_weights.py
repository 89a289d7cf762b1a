"""ResNet (torchvision layout) and GPT-2 (Hugging Face layout): exact parameter counts, weight round trips with the
torch originals, and ``from_torch_state_dict`` on the files and wrappers users have.

The torch originals: the torchvision ResNet rewritten in ``tests/models/torchvision_resnet.py`` (torchvision does
not import here) and transformers' ``GPT2LMHeadModel`` / ``GPT2Model`` built from small configs. Full-size models
are only ever built abstractly (``nnx.eval_shape``, torch's meta device).
"""
from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import torch
from flax import nnx

from torch_bridge.weights import (NAMED_MODELS, conversion_table, from_torch_state_dict, load_torch_file,
                                   to_torch_state_dict)
from jaxcomposer import models
from jaxcomposer.models import sharding
from jaxcomposer.models.resnet_imagenet import DEPTHS
from tests.models import torchvision_resnet as tv
from tests.torch_bridge.parity import LAYER_TOL, MODEL_TOL, assert_close_on_scale

transformers = pytest.importorskip("transformers")

pytestmark = pytest.mark.xdist_group("test_pretrained_weights")


def _torch_params(module: torch.nn.Module) -> int:
    return sum(p.numel() for p in module.parameters())


# ------------------------------------------------------------------------------------------------ parameter counts
# the sizes beyond these (ResNet-101/152, GPT-2 large/xl: long traces) share the checked code; their table
# rows are Composer's and torchvision's published counts
@pytest.mark.parametrize("depth", [18, 34, 50])
def test_resnet_param_counts_equal_torchvision(depth):
    ours = models.num_params(nnx.eval_shape(lambda: models.resnet(depth)))
    with torch.device("meta"):
        theirs = _torch_params(tv.resnet(depth))
    assert ours == theirs == DEPTHS[depth][2]


@pytest.mark.parametrize("size", ["gpt2", "gpt2-medium"])
def test_gpt2_param_counts_equal_hugging_face(size):
    d, n_layers, n_heads, count = models.GPT2_SIZES[size]
    ours = models.num_params(nnx.eval_shape(lambda: models.gpt2(size)))
    cfg = transformers.GPT2Config(n_embd=d, n_layer=n_layers, n_head=n_heads)
    with torch.device("meta"):
        hf = transformers.GPT2LMHeadModel(cfg)
    # HF counts the tied head once (parameters() deduplicates shared tensors)
    assert ours == _torch_params(hf) == count


# ------------------------------------------------------------------------------------------------ ResNet parity
RESNET_CASES = {  # name -> (depth, small kwargs shared by both sides)
    "resnet18ish": (18, dict(layers=[2, 1, 1, 1], width=4, num_classes=5)),
    "resnet50ish": (50, dict(layers=[1, 2, 1, 1], width=4, num_classes=3)),
}


def _randomized_torchvision(name: str, seed: int = 0) -> torch.nn.Module:
    """The torch original with every parameter and BN statistic off its init value, so no mapping hides."""
    depth, kw = RESNET_CASES[name]
    torch.manual_seed(seed)
    model = tv.resnet(depth, **kw)
    g = torch.Generator().manual_seed(seed + 1)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(0.1 * torch.randn(p.shape, generator=g))
        for m in model.modules():
            if isinstance(m, torch.nn.BatchNorm2d):
                m.running_mean.copy_(0.2 * torch.randn(m.running_mean.shape, generator=g))
                m.running_var.copy_(torch.rand(m.running_var.shape, generator=g) + 0.5)
                m.num_batches_tracked.fill_(7)
    return model.eval()


def _images(seed: int = 0, size: int = 32, batch: int = 2):
    x = np.random.default_rng(seed).normal(size=(batch, size, size, 3)).astype(np.float32)
    return jnp.asarray(x), torch.from_numpy(np.ascontiguousarray(x.transpose(0, 3, 1, 2)))


# The models run jitted: run eagerly, every op of the forward and backward passes is compiled on its own, hundreds
# of programs per model against one
_eval_forward = nnx.jit(lambda model, x: model(x, train=False))


def _template(name: str) -> nnx.Module:
    depth, kw = RESNET_CASES[name]
    return nnx.eval_shape(lambda: models.resnet(depth, **{**kw, "layers": tuple(kw["layers"])}))


@pytest.fixture(scope="module")
def resnet_pairs():
    out = {}
    for name in RESNET_CASES:
        theirs = _randomized_torchvision(name)
        out[name] = (from_torch_state_dict(_template(name), theirs.state_dict()), theirs)
    return out


@pytest.mark.parametrize("name", list(RESNET_CASES))
def test_resnet_eval_forward_matches_torchvision(resnet_pairs, name):
    ours, theirs = resnet_pairs[name]
    x_ours, x_theirs = _images()
    with torch.no_grad():
        want = theirs(x_theirs).numpy()
    assert_close_on_scale(np.asarray(_eval_forward(ours, x_ours)), want, MODEL_TOL, name)


@pytest.mark.parametrize("name", list(RESNET_CASES))
def test_resnet_train_forward_and_grads_match_torchvision(resnet_pairs, name):
    ours, theirs = resnet_pairs[name]
    ours = nnx.clone(ours)
    theirs = _randomized_torchvision(name).train()
    # 64 px and 4 images: train-mode BN then sees >= 16 values per channel in the last stage (with 2 values it
    # divides by a variance of two numbers, which turns float32 rounding into 1e-3 logit noise). Seed 2 because
    # with seed 1 two activations in one max-pool window are equal to the last bit, and torch and XLA break such
    # ties differently (both correct), which moves one pixel's gradient
    x_ours, x_theirs = _images(seed=2, size=64, batch=4)
    y = np.array([0, 1, 2, 1])

    def loss_fn(m):
        logits = m(x_ours, train=True)
        return -jnp.mean(jnp.take_along_axis(jax.nn.log_softmax(logits), jnp.asarray(y)[:, None], 1)), logits

    (loss, logits), grads = nnx.jit(nnx.value_and_grad(loss_fn, has_aux=True))(ours)
    torch_logits = theirs(x_theirs)
    torch_loss = torch.nn.functional.cross_entropy(torch_logits, torch.from_numpy(y))
    torch_loss.backward()
    assert_close_on_scale(np.asarray(logits), torch_logits.detach(), MODEL_TOL, "train logits")
    # gradients in torch's layout through the same table, so every mapped gradient is compared
    table = conversion_table(ours)
    flat = {tuple(p): v for p, v in nnx.to_flat_state(grads)}
    torch_grads = {k: p.grad for k, p in theirs.named_parameters()}
    compared = 0
    for e in table.entries:
        if e.torch_key in torch_grads:
            assert_close_on_scale(e.to_torch(np.asarray(flat[e.nnx_path].get_value())), torch_grads[e.torch_key],
                                  MODEL_TOL, e.torch_key)
            compared += 1
    assert compared == len(torch_grads)
    # the BN running means move the same way (variances differ by torch's unbiased estimate: see torch_bridge.weights)
    blocks_bn = ours.blocks[0].bn1
    assert_close_on_scale(np.asarray(blocks_bn.mean.get_value()), theirs.layer1[0].bn1.running_mean, LAYER_TOL)


@pytest.mark.parametrize("name", list(RESNET_CASES))
def test_resnet_round_trip_is_bitwise_and_loads_strictly(resnet_pairs, name):
    ours, theirs = resnet_pairs[name]
    back = to_torch_state_dict(ours)
    want = theirs.state_dict()
    assert set(back) == set(want)
    for k, v in want.items():
        if k.endswith("num_batches_tracked"):
            assert int(back[k]) == 0  # a counter NNX does not keep
        else:
            assert torch.equal(back[k], v), k
    fresh = tv.resnet(RESNET_CASES[name][0], **RESNET_CASES[name][1])
    fresh.load_state_dict(back, strict=True)


def test_resnet_per_layer_stem():
    ours, theirs = from_torch_state_dict(_template("resnet18ish"), _randomized_torchvision("resnet18ish").state_dict()), \
        _randomized_torchvision("resnet18ish")
    x_ours, x_theirs = _images(seed=2)
    got = ours.stem_bn(ours.stem_conv(x_ours), use_running_average=True)
    with torch.no_grad():
        want = theirs.bn1(theirs.conv1(x_theirs)).permute(0, 2, 3, 1)
    assert_close_on_scale(np.asarray(got), want, LAYER_TOL)


# ------------------------------------------------------------------------------------------------ GPT-2 parity
GPT2_SMALL = dict(vocab_size=61, n_positions=16, n_embd=32, n_layer=2, n_head=4)


def _gpt2_kwargs() -> dict:
    c = GPT2_SMALL
    return dict(vocab_size=c["vocab_size"], seq_len=c["n_positions"], d_model=c["n_embd"], n_layers=c["n_layer"],
                n_heads=c["n_head"])


@pytest.fixture(scope="module")
def hf_gpt2():
    torch.manual_seed(0)
    cfg = transformers.GPT2Config(**GPT2_SMALL, attn_implementation="eager")
    model = transformers.GPT2LMHeadModel(cfg).eval()
    g = torch.Generator().manual_seed(1)
    with torch.no_grad():  # LN affine and biases off their 1/0 init
        for name, p in model.named_parameters():
            if "ln" in name or name.endswith("bias"):
                p.add_(0.1 * torch.randn(p.shape, generator=g))
    return model


def _tokens(seed: int = 0, t: int = 16):
    ids = np.random.default_rng(seed).integers(0, GPT2_SMALL["vocab_size"], size=(2, t))
    return jnp.asarray(ids, dtype=jnp.int32), torch.from_numpy(ids)


def test_gpt2_logits_and_grads_match_hugging_face(hf_gpt2):
    ours = from_torch_state_dict("gpt2", hf_gpt2.state_dict(), **_gpt2_kwargs())
    assert conversion_table(ours, "hf").layout == "hf"
    ids, ids_t = _tokens()
    logits_t = hf_gpt2(ids_t).logits
    assert_close_on_scale(np.asarray(_eval_forward(ours, ids)), logits_t.detach(), MODEL_TOL, "logits")

    def loss_fn(m):
        logits = m(ids[:, :-1], train=False)
        return -jnp.mean(jnp.take_along_axis(jax.nn.log_softmax(logits), ids[:, 1:, None], -1))

    grads = nnx.jit(nnx.grad(loss_fn))(ours)
    hf_gpt2.zero_grad()
    # HF shifts the labels inside, so the full sequence as labels is the same next-token CE over positions 0..T-2
    hf_gpt2(ids_t, labels=ids_t.clone()).loss.backward()
    want = hf_gpt2.transformer.h[1].attn.c_attn.weight.grad
    assert_close_on_scale(np.asarray(grads.blocks[1].attn.qkv.kernel.get_value()), want, MODEL_TOL, "c_attn grad")
    want = hf_gpt2.transformer.wte.weight.grad  # embedding + tied head
    assert_close_on_scale(np.asarray(grads.wte.embedding.get_value()), want, MODEL_TOL, "wte grad")


def test_gpt2_round_trip_loads_strictly_and_is_bitwise(hf_gpt2):
    ours = from_torch_state_dict("gpt2", hf_gpt2.state_dict(), **_gpt2_kwargs())
    back = to_torch_state_dict(ours, "hf")
    fresh = transformers.GPT2LMHeadModel(transformers.GPT2Config(**GPT2_SMALL))
    fresh.load_state_dict(back, strict=True)
    for k, v in hf_gpt2.state_dict().items():
        assert torch.equal(back[k], v), k
    assert torch.equal(back["lm_head.weight"], back["transformer.wte.weight"])


def test_gpt2_from_a_headless_model_and_a_safetensors_file(hf_gpt2, tmp_path):
    base = hf_gpt2.transformer  # a GPT2Model: keys without 'transformer.', no head
    assert not any(k.startswith("transformer.") for k in base.state_dict())
    ours = from_torch_state_dict("gpt2", base.state_dict(), **_gpt2_kwargs())
    ids, ids_t = _tokens(seed=3)
    assert_close_on_scale(np.asarray(ours(ids, train=False)), hf_gpt2(ids_t).logits.detach(), MODEL_TOL)
    hf_gpt2.save_pretrained(tmp_path / "gpt2-small")  # Hugging Face's own file layout, offline
    from_file = from_torch_state_dict("gpt2", tmp_path / "gpt2-small" / "model.safetensors", **_gpt2_kwargs())
    assert np.array_equal(np.asarray(from_file.wte.embedding.get_value()), np.asarray(ours.wte.embedding.get_value()))


def test_wrapped_checkpoints_load(tmp_path):
    """DDP's ``module.``, Composer's checkpoint (``state.model`` with ``model.`` keys), ``{"state_dict": ...}``."""
    theirs = _randomized_torchvision("resnet18ish", seed=5)
    sd = theirs.state_dict()
    files = {
        "ddp.pt": {f"module.{k}": v for k, v in sd.items()},
        "composer.pt": {"state": {"model": {f"model.{k}": v for k, v in sd.items()}, "timestamp": {}},
                        "rng": []},
        "lightning.ckpt": {"state_dict": sd, "epoch": 3},
    }
    want = np.asarray(from_torch_state_dict(_template("resnet18ish"), sd).head.kernel.get_value())
    for name, obj in files.items():
        torch.save(obj, tmp_path / name)
        got = from_torch_state_dict(_template("resnet18ish"), tmp_path / name)
        assert np.array_equal(np.asarray(got.head.kernel.get_value()), want), name


def test_errors_name_the_problem(tmp_path, hf_gpt2):
    sd = dict(_randomized_torchvision("resnet18ish").state_dict())
    del sd["layer2.0.downsample.0.weight"]
    sd["layer9.weight"] = torch.zeros(3)
    with pytest.raises(ValueError) as info:
        from_torch_state_dict(_template("resnet18ish"), sd)
    msg = str(info.value)
    assert "missing key 'layer2.0.downsample.0.weight': expected shape (8, 4, 1, 1)" in msg
    assert "unexpected key 'layer9.weight'" in msg
    with pytest.raises(ValueError, match="unknown model name 'resnet51'.*resnet50"):
        from_torch_state_dict("resnet51", sd)
    with pytest.raises(FileNotFoundError, match="no weights file at"):
        from_torch_state_dict("resnet18", tmp_path / "absent.pth")
    torch.save({"epoch": 1}, tmp_path / "not_weights.pt")
    with pytest.raises(ValueError, match="holds no state dict"):
        load_torch_file(tmp_path / "not_weights.pt")
    with pytest.raises(ValueError, match="ties its LM head"):
        conversion_table(models.GPT(vocab_size=8, seq_len=4, d_model=8, n_layers=1, n_heads=2,
                                    tie_embeddings=False, rngs=nnx.Rngs(0)), "hf")
    assert {"resnet50", "gpt2", "gpt2-xl"} <= set(NAMED_MODELS)


# ------------------------------------------------------------------------------------------------ sharding
def test_logical_axes_cover_every_parameter():
    r50 = nnx.eval_shape(lambda: models.resnet(50))
    axes = sharding.logical_axes(r50)  # strict: raises on any unmatched parameter
    assert axes["blocks/3/conv2/kernel"] == (None, None, "conv_in", "conv_out")
    assert axes["head/kernel"] == ("conv_out", "classes")
    g = nnx.eval_shape(lambda: models.gpt2())
    axes = sharding.logical_axes(g)
    assert axes["blocks/11/attn/qkv/kernel"] == ("embed", "heads")
    assert axes["blocks/0/fc_proj/kernel"] == ("mlp", "embed")
    assert axes["wte/embedding"] == ("vocab", "embed")
    specs = sharding.partition_specs(g, {"embed": "fsdp", "mlp": "tensor", "heads": "tensor", "vocab": "fsdp"})
    P = jax.sharding.PartitionSpec
    assert specs.blocks[0].fc.kernel == P("fsdp", "tensor")
    assert specs.wte.embedding == P("fsdp", None)  # one mesh axis used once per parameter
    assert specs.ln_f.scale == P("fsdp")


def test_partition_specs_shard_a_model_on_a_mesh():
    """The annotations are usable as they are: a small GPT-2 placed on a 2-device ``fsdp`` mesh holds half of each
    sharded parameter per device and computes the same logits."""
    devices = jax.devices()[:2]
    if len(devices) < 2:
        pytest.skip("needs 2 devices (tests/conftest.py forces 2 host devices)")
    mesh = jax.sharding.Mesh(np.array(devices), ("fsdp",))
    model = models.gpt2(vocab_size=64, seq_len=16, d_model=32, n_layers=1, n_heads=2)
    shardings = sharding.named_shardings(model, mesh, {"embed": "fsdp", "vocab": "fsdp"})
    graphdef, state = nnx.split(model)
    placed = jax.device_put(state, shardings)
    wte = placed["wte"]["embedding"].get_value()
    assert wte.sharding.spec == jax.sharding.PartitionSpec("fsdp", None)
    assert {s.data.shape for s in wte.addressable_shards} == {(32, 32)}  # 64 rows over 2 devices
    ids = jnp.asarray(np.random.default_rng(0).integers(0, 64, (2, 16)), jnp.int32)
    np.testing.assert_allclose(np.asarray(nnx.merge(graphdef, placed)(ids, train=False)),
                               np.asarray(model(ids, train=False)), rtol=1e-5, atol=1e-5)
