"""torch_bridge.weights: exact NNX <-> torch weight conversion for MLP, ResNetCIFAR, ConvNet and GPT."""
from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import torch
from flax import nnx

from jaxcomposer.models.convnet import ConvNet
from jaxcomposer.models.gpt import GPT
from jaxcomposer.models.mlp import MLP
from jaxcomposer.models.resnet import ResNetCIFAR
from torch_bridge.mirrors import TorchConvNet, TorchGPT, TorchMLP, TorchResNetCIFAR
from torch_bridge.weights import conversion_table, nnx_to_torch_state_dict, torch_state_dict_to_nnx
from tests.torch_bridge.parity import LAYER_TOL, MODEL_TOL, assert_close_on_scale

# its module-scoped fixtures and caches are built once per worker: keep its tests on one xdist worker
pytestmark = pytest.mark.xdist_group("test_weights")

# name -> (config shared by both sides, NNX class, torch class, input kind)
CASES = {
    "mlp": (dict(in_features=12, hidden=(16, 8), num_classes=5, dropout=0.1), MLP, TorchMLP, "vector"),
    "resnet8": (dict(depth=8, width=4, num_classes=5, in_channels=3), ResNetCIFAR, TorchResNetCIFAR, "image"),
    "resnet14_s2": (dict(depth=14, width=4, num_classes=3, in_channels=2, stem_stride=2, widen=(1, 2),
                         bn_momentum=0.8), ResNetCIFAR, TorchResNetCIFAR, "image"),
    "convnet_flatten": (dict(channels=(4, 6), strides=(2, 1), num_classes=5, in_channels=3, image_size=8),
                        ConvNet, TorchConvNet, "image"),
    "convnet_avg": (dict(channels=(4,), strides=(1,), kernel_size=5, num_classes=3, in_channels=3, image_size=8,
                         head="avg", bn_momentum=0.8), ConvNet, TorchConvNet, "image"),
    "gpt_tied": (dict(vocab_size=17, seq_len=8, d_model=16, n_layers=2, n_heads=2, mlp_ratio=2),
                 GPT, TorchGPT, "tokens"),
    "gpt_untied": (dict(vocab_size=17, seq_len=8, d_model=16, n_layers=1, n_heads=4, tie_embeddings=False),
                   GPT, TorchGPT, "tokens"),
}


def _inputs(case: str, seed: int = 0):
    """``(ours, theirs)``: the same batch as a jax array (NHWC for images) and a torch tensor (NCHW)."""
    cfg, _, _, kind = CASES[case]
    rng = np.random.default_rng(seed)
    if kind == "vector":
        x = rng.normal(size=(4, 3, 4)).astype(np.float32)
        return jnp.asarray(x), torch.from_numpy(x)
    if kind == "image":
        x = (rng.normal(size=(4, 8, 8, cfg["in_channels"])) * 2.0 + 0.5).astype(np.float32)  # NHWC
        return jnp.asarray(x), torch.from_numpy(np.ascontiguousarray(x.transpose(0, 3, 1, 2)))
    t = rng.integers(0, cfg["vocab_size"], size=(3, cfg["seq_len"]))
    return jnp.asarray(t, dtype=jnp.int32), torch.from_numpy(t).long()


def _init_nnx(model: nnx.Module, seed: int, case: str) -> None:
    """Random values for every variable, drawn with numpy (the native initializers compile one XLA program per
    shape, which would dominate this file). Biases and LN/BN scales get noise too, so a swapped
    mapping cannot hide behind zeros and ones; BN running stats come from a few train-mode forwards."""
    rng = np.random.default_rng(seed)
    for path, var in nnx.to_flat_state(nnx.state(model)):
        shape, dtype, leaf = var.get_value().shape, var.get_value().dtype, path[-1]
        noise = rng.standard_normal(shape)
        if leaf == "kernel":
            value = noise / np.sqrt(np.prod(shape[:-1]))  # fan-in scaling keeps activations O(1)
        elif leaf == "embedding":
            value = 0.5 * noise
        elif leaf in ("scale", "var"):
            value = 1.0 + 0.1 * noise if leaf == "scale" else np.ones(shape)
        else:  # bias, mean
            value = 0.1 * noise if leaf == "bias" else np.zeros(shape)
        var.set_value(jax.device_put(value.astype(dtype)))
    if isinstance(model, (ResNetCIFAR, ConvNet)):
        for s in range(3):
            model(_inputs(case, seed=100 + s)[0], train=True)


def _perturb_torch(model: torch.nn.Module, seed: int, case: str) -> None:
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(0.1 * torch.randn(p.shape, generator=g))
    if isinstance(model, (TorchResNetCIFAR, TorchConvNet)):
        model.train()
        with torch.no_grad():
            for s in range(3):
                model(_inputs(case, seed=100 + s)[1])
    model.eval()


def _build(case: str, seed: int = 0):
    """``(ours, theirs)``: our NNX model (structure from the real constructor, values from :func:`_init_nnx`) and
    a fresh torch mirror (its own random init)."""
    cfg, nnx_cls, torch_cls, _ = CASES[case]
    ours = nnx.eval_shape(lambda: nnx_cls(**cfg, rngs=nnx.Rngs(seed)))
    _init_nnx(ours, seed, case)
    torch.manual_seed(seed)
    return ours, torch_cls(**cfg).eval()


def _ours(model, x) -> np.ndarray:
    return np.asarray(model(x, train=False))


def _theirs(model, x) -> np.ndarray:
    with torch.no_grad():
        return model(x).numpy()


def _arrays(model) -> dict:
    return {p: np.array(v.get_value()) for p, v in nnx.to_flat_state(nnx.state(model))}


@pytest.mark.parametrize("case", list(CASES))
def test_nnx_to_torch(case):
    ours, theirs = _build(case, seed=1)
    sd = nnx_to_torch_state_dict(ours)
    theirs.load_state_dict(sd, strict=True)
    x_ours, x_theirs = _inputs(case)
    a, b = _ours(ours, x_ours), _theirs(theirs, x_theirs)
    assert a.shape == b.shape
    assert_close_on_scale(a, b, MODEL_TOL)
    if case.startswith("resnet"):
        assert all(int(v) == 0 for k, v in sd.items() if k.endswith("num_batches_tracked"))
        assert not np.allclose(sd["stem_bn.running_var"].numpy(), 1.0)  # the stats really were non-trivial


def test_per_layer_resnet_stem():
    ours, theirs = _build("resnet8", seed=2)
    theirs.load_state_dict(nnx_to_torch_state_dict(ours), strict=True)
    x_ours, x_theirs = _inputs("resnet8")
    a = np.asarray(ours.stem_bn(ours.stem_conv(x_ours), use_running_average=True))  # NHWC
    with torch.no_grad():
        b = theirs.stem_bn(theirs.stem_conv(x_theirs)).permute(0, 2, 3, 1).numpy()
    assert_close_on_scale(a, b, LAYER_TOL)


@pytest.mark.parametrize("case", list(CASES))
def test_torch_to_nnx(case):
    template, theirs = _build(case, seed=3)
    _perturb_torch(theirs, seed=4, case=case)
    before = _arrays(template)
    ours = torch_state_dict_to_nnx(theirs.state_dict(), template)
    assert type(ours) is type(template) and ours is not template
    after = _arrays(template)
    assert all(np.array_equal(before[k], after[k]) for k in before)  # the template is untouched
    x_ours, x_theirs = _inputs(case, seed=5)
    assert_close_on_scale(_ours(ours, x_ours), _theirs(theirs, x_theirs), MODEL_TOL)
    # a plain {name: np.ndarray} state dict gives the same module
    ours_np = torch_state_dict_to_nnx({k: v.numpy() for k, v in theirs.state_dict().items()}, template)
    assert all(np.array_equal(a, b) for a, b in zip(_arrays(ours).values(), _arrays(ours_np).values()))


def test_native_init_mlp():
    """The real native initializers (not only :func:`_init_nnx`'s values) convert too."""
    cfg, _, _, _ = CASES["mlp"]
    ours, theirs = MLP(**cfg, rngs=nnx.Rngs(0)), TorchMLP(**cfg).eval()
    theirs.load_state_dict(nnx_to_torch_state_dict(ours), strict=True)
    x_ours, x_theirs = _inputs("mlp")
    assert_close_on_scale(_ours(ours, x_ours), _theirs(theirs, x_theirs), MODEL_TOL)


def test_import_does_not_alias_torch_memory():
    template, theirs = _build("mlp")
    ours = torch_state_dict_to_nnx(theirs.state_dict(), template)
    snapshot = np.array(ours.head.bias.get_value())
    with torch.no_grad():
        theirs.head.bias.add_(1.0)
    np.testing.assert_array_equal(np.asarray(ours.head.bias.get_value()), snapshot)


@pytest.mark.parametrize("case", list(CASES))
def test_round_trip_bitwise(case):
    ours, _ = _build(case, seed=6)
    back = torch_state_dict_to_nnx(nnx_to_torch_state_dict(ours), ours)
    a, b = _arrays(ours), _arrays(back)
    assert a.keys() == b.keys()
    for k in a:
        assert a[k].dtype == b[k].dtype and a[k].shape == b[k].shape, k
        assert a[k].tobytes() == b[k].tobytes(), k


def test_table_is_explicit():
    ours, _ = _build("resnet8")
    table = conversion_table(ours)
    by_path = {e.nnx_path: e for e in table.entries}
    assert by_path[("blocks", 0, "conv1", "kernel")].torch_key == "blocks.0.conv1.weight"
    assert by_path[("blocks", 0, "conv1", "kernel")].transform == "conv"
    assert by_path[("blocks", 1, "proj_bn", "var")].torch_key == "blocks.1.proj_bn.running_var"
    assert by_path[("head", "kernel")].transform == "linear"
    assert "stem_bn.num_batches_tracked" in table.export_zeros
    tied, _ = _build("gpt_tied")
    assert "lm_head.weight" not in nnx_to_torch_state_dict(tied)


# ---------------------------------------------------------------------------------------------------------------
# errors
@pytest.fixture(scope="module")
def resnet_pair():
    ours, _ = _build("resnet8")
    return ours, nnx_to_torch_state_dict(ours)


def test_missing_key(resnet_pair):
    ours, sd = resnet_pair
    sd = dict(sd)
    del sd["blocks.1.proj_conv.weight"]
    with pytest.raises(ValueError, match=r"missing key 'blocks\.1\.proj_conv\.weight': expected shape \(8, 4, 1, 1\)"):
        torch_state_dict_to_nnx(sd, ours)


def test_extra_key(resnet_pair):
    ours, sd = resnet_pair
    sd = {**sd, "blocks.0.proj_conv.weight": torch.zeros(4, 4, 1, 1)}
    with pytest.raises(ValueError, match=r"unexpected key 'blocks\.0\.proj_conv\.weight'.*got shape \(4, 4, 1, 1\)"):
        torch_state_dict_to_nnx(sd, ours)


def test_wrong_shape(resnet_pair):
    ours, sd = resnet_pair
    sd = {**sd, "head.weight": sd["head.weight"].T.contiguous()}  # forgot to transpose: (16, 5) instead of (5, 16)
    with pytest.raises(ValueError, match=r"key 'head\.weight': expected shape \(5, 16\), got shape \(16, 5\)"):
        torch_state_dict_to_nnx(sd, ours)
    # HWIO passed where OIHW is expected
    sd = {**resnet_pair[1], "stem_conv.weight": torch.zeros(3, 3, 3, 4)}
    with pytest.raises(ValueError, match=r"key 'stem_conv\.weight': expected shape \(4, 3, 3, 3\), "
                                         r"got shape \(3, 3, 3, 4\)"):
        torch_state_dict_to_nnx(sd, ours)


def test_all_problems_reported_at_once(resnet_pair):
    ours, sd = resnet_pair
    sd = {k: v for k, v in sd.items() if k != "head.bias"}
    sd["extra"] = np.zeros(2)
    sd["stem_bn.weight"] = np.zeros(3)
    with pytest.raises(ValueError) as info:
        torch_state_dict_to_nnx(sd, ours)
    msg = str(info.value)
    assert "'head.bias'" in msg and "'extra'" in msg and "'stem_bn.weight'" in msg


def test_num_batches_tracked_optional(resnet_pair):
    ours, sd = resnet_pair
    sd = {k: v for k, v in sd.items() if not k.endswith("num_batches_tracked")}
    torch_state_dict_to_nnx(sd, ours)


def test_tied_lm_head_alias():
    ours, _ = _build("gpt_tied")
    sd = nnx_to_torch_state_dict(ours)
    torch_state_dict_to_nnx({**sd, "lm_head.weight": sd["wte.weight"].clone()}, ours)  # nanoGPT-style: accepted
    with pytest.raises(ValueError, match=r"'lm_head\.weight'.*tied"):
        torch_state_dict_to_nnx({**sd, "lm_head.weight": sd["wte.weight"] + 1.0}, ours)


def test_untied_lm_head_required():
    ours, _ = _build("gpt_untied")
    sd = nnx_to_torch_state_dict(ours)
    del sd["lm_head.weight"]
    with pytest.raises(ValueError, match=r"missing key 'lm_head\.weight': expected shape \(17, 16\)"):
        torch_state_dict_to_nnx(sd, ours)


def test_unsupported_model():
    class Other(nnx.Module):
        def __init__(self):
            self.lin = nnx.Linear(2, 2, rngs=nnx.Rngs(0))

    with pytest.raises(TypeError, match="no conversion table for Other"):
        nnx_to_torch_state_dict(Other())
