"""ViT (Hugging Face layout): exact parameter counts, forward/layer/gradient parity with transformers'
``ViTForImageClassification`` (eager attention), exact weight conversion both ways, sharding rules, a Trainer run.

Everything that executes uses one tiny configuration (non-square 16x12 images of 2 channels, 4x4 patches: a 4x3
grid, so a swapped height/width or a wrong patch order shows). Full-size models are only built abstractly
(``nnx.eval_shape``, torch's meta device).
"""
from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
import torch
from flax import nnx

from torch_bridge.weights import (NAMED_MODELS, conversion_table, from_torch_state_dict, to_torch_state_dict,
                                   torch_state_dict_to_nnx)
from jaxcomposer.models import ViT, VIT_SIZES, num_params, sharding, vit
from tests.torch_bridge.parity import LAYER_TOL, MODEL_TOL, assert_close_on_scale

transformers = pytest.importorskip("transformers")
from transformers import ViTConfig, ViTForImageClassification  # noqa: E402

pytestmark = pytest.mark.xdist_group("test_vit")

# ours and HF's spelling of the same tiny model
TINY = dict(image_size=(16, 12), patch_size=4, num_classes=5, d_model=32, n_layers=2, n_heads=4, mlp_dim=64,
            in_channels=2)
HF_TINY = dict(image_size=(16, 12), patch_size=4, num_labels=5, hidden_size=32, num_hidden_layers=2,
               num_attention_heads=4, intermediate_size=64, num_channels=2)


def _hf(**cfg) -> ViTForImageClassification:
    torch.manual_seed(0)
    m = ViTForImageClassification(ViTConfig(**{**HF_TINY, **cfg}, attn_implementation="eager")).eval()
    assert m.config._attn_implementation == "eager"
    return m


def _randomize(model: nnx.Module, seed: int = 0) -> nnx.Module:
    """Random values for every variable, drawn with numpy (no initializer compiles); biases and LN scales get
    noise too, so a swapped mapping cannot hide behind zeros and ones."""
    rng = np.random.default_rng(seed)
    for path, var in nnx.to_flat_state(nnx.state(model)):
        shape, leaf = var.get_value().shape, path[-1]
        noise = rng.standard_normal(shape)
        value = {"kernel": noise / np.sqrt(np.prod(shape[:-1])), "scale": 1.0 + 0.1 * noise,
                 "bias": 0.1 * noise}.get(leaf, 0.5 * noise)  # cls_token, position_embeddings
        var.set_value(jnp.asarray(value.astype(np.float32)))
    return model


def _images(seed: int = 0, b: int = 3):
    """``(ours NHWC, theirs NCHW)``: the same batch."""
    x = (np.random.default_rng(seed).standard_normal((b, 16, 12, 2)) * 1.5 + 0.3).astype(np.float32)
    return jnp.asarray(x), torch.from_numpy(np.ascontiguousarray(x.transpose(0, 3, 1, 2)))


@nnx.jit
def _logits(model, x):
    return model(x, train=False)


_CACHE: dict = {}


def _pair():
    """``(ours, hf)``: the tiny ViT with random weights and HF's model holding the same ones (built once)."""
    if "pair" not in _CACHE:
        ours = _randomize(ViT(**TINY, rngs=nnx.Rngs(0)))
        hf = _hf()
        hf.load_state_dict(to_torch_state_dict(ours), strict=True)
        _CACHE["pair"] = ours, hf
    return _CACHE["pair"]


def _flat(model: nnx.Module) -> dict[str, np.ndarray]:
    return {"/".join(map(str, p)): np.asarray(v.get_value()) for p, v in nnx.to_flat_state(nnx.state(model))}


def _assert_same_weights(a: nnx.Module, b: nnx.Module) -> None:
    fa, fb = _flat(a), _flat(b)
    assert fa.keys() == fb.keys()
    for k in fa:
        np.testing.assert_array_equal(fa[k], fb[k], err_msg=k)


# ------------------------------------------------------------------------------------------------ parameter counts
@pytest.mark.parametrize("size", sorted(VIT_SIZES))
def test_param_counts_equal_hf(size):
    d, layers, heads, mlp, count = VIT_SIZES[size]
    with torch.device("meta"):
        hf = ViTForImageClassification(ViTConfig(hidden_size=d, num_hidden_layers=layers, num_attention_heads=heads,
                                                 intermediate_size=mlp, num_labels=1000))
    assert (hf.config.image_size, hf.config.patch_size) == (224, 16)
    ours = nnx.eval_shape(lambda: vit(size))
    assert num_params(ours) == sum(p.numel() for p in hf.parameters()) == count
    assert ours.num_classes == 1000 and ours.num_patches == 196
    assert ours.position_embeddings.get_value().shape == (1, 197, d) and ours.cls_token.get_value().shape == (1, 1, d)


def test_known_counts_and_head_width():
    assert VIT_SIZES["vit-s16"][-1] == 22_050_664 and VIT_SIZES["vit-b16"][-1] == 86_567_656
    m = nnx.eval_shape(lambda: vit("vit-b16", 10))
    assert m.num_classes == 10 and num_params(m) == 86_567_656 - 990 * 768 - 990


# ------------------------------------------------------------------------------------------------ parity
def test_forward_parity_with_hf():
    ours, hf = _pair()
    x, xt = _images()
    with torch.no_grad():
        want = hf(pixel_values=xt).logits
    got = _logits(ours, x)
    assert got.dtype == jnp.float32 and got.shape == (3, 5)
    assert float(want.abs().max()) > 0.5  # random weights give logits of scale, not a near-zero comparison
    assert_close_on_scale(got, want, MODEL_TOL, "ViT logits")


def test_one_encoder_layer_parity_with_hf():
    ours, hf = _pair()
    h = np.random.default_rng(1).standard_normal((3, 13, 32)).astype(np.float32)
    with torch.no_grad():
        want = hf.vit.layers[1](torch.from_numpy(h), None)
    got = nnx.jit(lambda layer, h: layer(h, train=False, keys=[None] * 3))(ours.layers[1], jnp.asarray(h))
    assert_close_on_scale(got, want, LAYER_TOL, "ViTLayer")
    assert not np.allclose(np.asarray(got), h, atol=1e-2)  # the layer did change its input


def test_gradient_parity_with_hf():
    ours, hf = _pair()
    x, xt = _images(seed=2)
    y = np.array([0, 3, 4])
    hf.zero_grad()
    torch.nn.functional.cross_entropy(hf(pixel_values=xt).logits, torch.from_numpy(y)).backward()
    theirs = dict(hf.named_parameters())
    graphdef, params = nnx.split(ours)

    def loss(params):
        logits = nnx.merge(graphdef, params)(x, train=False)
        return optax.softmax_cross_entropy_with_integer_labels(logits, jnp.asarray(y)).mean()

    grads = {tuple(p): v.get_value() for p, v in nnx.to_flat_state(jax.jit(jax.grad(loss))(params))}
    table = {e.nnx_path: e for e in conversion_table(ours).entries}
    for path in [("patch_embed", "kernel"), ("cls_token",), ("position_embeddings",),
                 ("layers", 0, "attention", "q_proj", "kernel"), ("layers", 0, "attention", "v_proj", "bias"),
                 ("layers", 1, "fc1", "bias"), ("layers", 1, "layernorm_after", "scale"), ("classifier", "kernel")]:
        e = table[path]
        want = theirs[e.torch_key].grad.numpy()
        assert np.abs(want).max() > 1e-6, e.torch_key  # a real gradient, not a zero compared with a zero
        assert_close_on_scale(e.to_torch(np.asarray(grads[path])), want, MODEL_TOL, e.torch_key)


# ------------------------------------------------------------------------------------------------ weights
def test_state_dict_round_trip_is_bitwise():
    ours, hf = _pair()
    sd = to_torch_state_dict(ours)
    assert sd.keys() == hf.state_dict().keys()
    assert tuple(sd["vit.embeddings.cls_token"].shape) == (1, 1, 32)
    assert tuple(sd["vit.embeddings.position_embeddings"].shape) == (1, 13, 32)
    fresh = _hf()
    fresh.load_state_dict(sd, strict=True)  # raises on any missing/unexpected key or shape
    for k, v in fresh.state_dict().items():
        assert torch.equal(v, sd[k]), k
    back = torch_state_dict_to_nnx(fresh.state_dict(), ViT(**TINY, rngs=nnx.Rngs(1)))
    _assert_same_weights(back, ours)


def test_legacy_layout_loads_in_hf_and_back(tmp_path, monkeypatch):
    """The ``hf_legacy`` keys are the Hub checkpoints' (transformers 4.x) names: transformers 5.24's own
    ``from_pretrained`` reads such a file (renaming on load) into exactly our weights, and such a state dict loads
    into NNX by itself (the layout is detected from the keys)."""
    from safetensors.torch import save_file

    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    ours, hf = _pair()
    old = to_torch_state_dict(ours, "hf_legacy")
    assert "vit.encoder.layer.1.attention.attention.query.weight" in old and "vit.layers.0.mlp.fc1.bias" not in old
    hf.config.save_pretrained(tmp_path)
    save_file({k: v.contiguous() for k, v in old.items()}, str(tmp_path / "model.safetensors"))
    loaded = ViTForImageClassification.from_pretrained(tmp_path, attn_implementation="eager")
    sd = loaded.state_dict()
    assert sd.keys() == hf.state_dict().keys()
    for k, v in to_torch_state_dict(ours).items():
        assert torch.equal(sd[k], v), k
    _assert_same_weights(torch_state_dict_to_nnx(old, ours), ours)


def test_from_torch_state_dict_by_name_template_and_file(tmp_path):
    ours, hf = _pair()
    sd = hf.state_dict()
    # a name: "vit-s16" with the tiny shapes as keyword overrides
    by_name = from_torch_state_dict("vit-s16", sd, **{k: v for k, v in TINY.items() if k != "num_classes"},
                                    num_classes=5)
    _assert_same_weights(by_name, ours)
    # a template module, its weights left untouched; Composer's "model." wrapper prefix stripped
    template = ViT(**TINY, rngs=nnx.Rngs(3))
    before = _flat(template)
    from_template = from_torch_state_dict(template, {f"model.{k}": v for k, v in sd.items()})
    _assert_same_weights(from_template, ours)
    assert all(np.array_equal(before[k], v) for k, v in _flat(template).items())
    # a .safetensors file written from HF's module, by name
    from safetensors.torch import save_file
    save_file({k: v.contiguous() for k, v in sd.items()}, str(tmp_path / "model.safetensors"))
    from_file = from_torch_state_dict("vit-ti16", tmp_path / "model.safetensors",
                                      **{k: v for k, v in TINY.items() if k != "num_classes"}, num_classes=5)
    np.testing.assert_array_equal(_logits(from_file, _images()[0]), _logits(ours, _images()[0]))
    assert {"vit-ti16", "vit-s16", "vit-b16", "vit-l16"} <= set(NAMED_MODELS)


def test_mismatched_state_dict_names_the_key():
    ours, hf = _pair()
    sd = dict(hf.state_dict())
    bad = dict(sd, **{"vit.layers.0.mlp.fc1.weight": torch.zeros(65, 32)})
    with pytest.raises(ValueError, match=r"vit\.layers\.0\.mlp\.fc1\.weight.*expected shape \(64, 32\)"):
        torch_state_dict_to_nnx(bad, ours)
    missing = {k: v for k, v in sd.items() if k != "vit.embeddings.cls_token"}
    with pytest.raises(ValueError, match=r"missing key 'vit\.embeddings\.cls_token'"):
        torch_state_dict_to_nnx(missing, ours)
    no_qkv_bias = nnx.eval_shape(lambda: ViT(**TINY, qkv_bias=False, rngs=nnx.Rngs(0)))
    with pytest.raises(ValueError, match=r"unexpected key 'vit\.layers\.0\.attention\.q_proj\.bias'"):
        torch_state_dict_to_nnx(sd, no_qkv_bias)
    assert num_params(no_qkv_bias) == num_params(ours) - 2 * 3 * 32


def test_no_qkv_bias_matches_hf():
    hf = _hf(qkv_bias=False)
    ours = from_torch_state_dict(ViT(**TINY, qkv_bias=False, rngs=nnx.Rngs(0)), hf.state_dict())
    assert ours.layers[0].attention.q_proj.bias is None
    x, xt = _images(seed=4)
    with torch.no_grad():
        assert_close_on_scale(_logits(ours, x), hf(pixel_values=xt).logits, MODEL_TOL, "ViT without qkv bias")


# ------------------------------------------------------------------------------------------------ init, sharding
def test_init_follows_hf():
    m = nnx.jit(lambda: ViT(image_size=32, patch_size=4, num_classes=10, d_model=64, n_layers=1, n_heads=2,
                            mlp_dim=256, rngs=nnx.Rngs(0)))()  # one compile for all the initializers
    for w in (m.layers[0].fc1.kernel, m.layers[0].attention.q_proj.kernel, m.patch_embed.kernel, m.classifier.kernel,
              m.position_embeddings):
        assert abs(float(jnp.std(w[...])) / 0.02 - 1) < 0.1
    for b in (m.layers[0].fc2.bias, m.patch_embed.bias, m.classifier.bias, m.layernorm.bias):
        assert float(jnp.abs(b[...]).max()) == 0.0
    np.testing.assert_array_equal(m.layers[0].layernorm_before.scale[...], np.ones(64, np.float32))
    assert m.layernorm.epsilon == 1e-12 and 0 < float(jnp.abs(m.cls_token[...]).max()) < 0.02 * 6


def test_logical_axes_cover_every_parameter():
    axes = sharding.logical_axes(nnx.eval_shape(lambda: vit("vit-b16")))  # strict
    assert axes["layers/11/attention/q_proj/kernel"] == ("embed", "heads")
    assert axes["layers/0/attention/o_proj/bias"] == ("embed",)
    assert axes["layers/3/fc2/kernel"] == ("mlp", "embed")
    assert axes["position_embeddings"] == (None, "positions", "embed")
    assert axes["classifier/kernel"] == ("embed", "classes")
    assert len(axes) == 4 + 12 * 16 + 2 + 2  # patch conv, cls, positions; 12 layers of 16; final LN; head
    sharding.logical_axes(nnx.eval_shape(lambda: ViT(**TINY, qkv_bias=False, rngs=nnx.Rngs(0))))


# ------------------------------------------------------------------------------------------------ behaviour
def test_input_and_argument_validation():
    ours, _ = _pair()
    with pytest.raises(ValueError, match=r"expected NHWC images \(B, 16, 12, 2\).*got shape \(1, 12, 16, 2\)"):
        ours(jnp.zeros((1, 12, 16, 2)), train=False)
    with pytest.raises(ValueError, match="got shape"):
        ours(jnp.zeros((1, 2, 16, 12)), train=False)  # NCHW
    with pytest.raises(ValueError, match="d_model=30 must be divisible by n_heads=4"):
        ViT(**{**TINY, "d_model": 30}, rngs=nnx.Rngs(0))
    with pytest.raises(ValueError, match="patch_size=32 is larger than image_size"):
        ViT(**{**TINY, "patch_size": 32}, rngs=nnx.Rngs(0))
    with pytest.raises(ValueError, match="attention_dropout must be in"):
        ViT(**TINY, attention_dropout=1.0, rngs=nnx.Rngs(0))
    with pytest.raises(ValueError, match="size must be one of"):
        vit("vit-h14")
    m = nnx.eval_shape(lambda: vit("vit-s16", 10, image_size=28, patch_size=7, in_channels=1))  # Fashion-MNIST
    out = nnx.eval_shape(lambda m, x: m(x, train=False), m, jax.ShapeDtypeStruct((2, 28, 28, 1), jnp.float32))
    assert m.num_patches == 16 and out.shape == (2, 10)


def test_dropout_uses_the_key():
    ours, _ = _pair()
    for cfg in (dict(dropout=0.2), dict(attention_dropout=0.3)):
        m = ViT(**TINY, **cfg, rngs=nnx.Rngs(0))
        nnx.update(m, nnx.state(ours))
        run = nnx.jit(lambda m, x, k, train: m(x, train=train, key=k), static_argnames="train")
        x = _images()[0]
        k1, k2 = jax.random.split(jax.random.key(0))
        np.testing.assert_array_equal(run(m, x, k1, True), run(m, x, k1, True))
        assert not np.allclose(run(m, x, k1, True), run(m, x, k2, True))
        np.testing.assert_array_equal(run(m, x, k1, False), _logits(ours, x))  # eval: dropout off
        with pytest.raises(ValueError, match="needs a PRNG key"):
            m(x, train=True)


def test_trainer_sgd_steps_lower_the_training_loss():
    from jaxcomposer import Trainer
    from jaxcomposer.data import ArrayLoader
    from jaxcomposer.loggers import InMemoryLogger
    from jaxcomposer.models.tasks import ComposerClassifier
    from jaxcomposer.optim import DecoupledSGDW

    model = ViT(**TINY, rngs=nnx.Rngs(0))
    rng = np.random.default_rng(0)
    data = {"input": rng.standard_normal((16, 16, 12, 2)).astype(np.float32),
            "target": rng.integers(0, 5, 16).astype(np.int32)}
    loss_on_batch = lambda m: float(optax.softmax_cross_entropy_with_integer_labels(
        _logits(m, jnp.asarray(data["input"])), jnp.asarray(data["target"])).mean())
    before = loss_on_batch(model)
    logger = InMemoryLogger()
    trainer = Trainer(model=ComposerClassifier(model), train_dataloader=ArrayLoader(data, 16, seed=0),
                      max_duration="3ba", optimizers=DecoupledSGDW(lr=0.1), seed=0, progress_bar=False,
                      devices=jax.devices()[:1], loggers=[logger])
    trainer.fit()
    losses = [v for _, v in logger.data["loss/train/total"]]
    assert len(losses) == 3 and abs(losses[0] - before) < 1e-5  # every step sees the whole (same) batch
    assert losses[0] > losses[1] > losses[2]
    assert loss_on_batch(trainer.state.model) < losses[2]
