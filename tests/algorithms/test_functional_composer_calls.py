"""``jaxcomposer.functional`` called the way a Composer user's own torch loop calls ``composer.functional``.

Every form takes Composer's positional arguments and returns the caller's array type (torch in, torch out; numpy in,
numpy out), with the values of the same call on JAX arrays with the same key. The key is keyword-only: a random call
without it, or with it where Composer has another argument, fails loudly. ``compute_ema`` and ``freeze_layers`` act
in place on torch modules, as Composer's do. See jaxcomposer/algorithms/functional_io.py.
"""
import copy
from dataclasses import dataclass
from typing import Callable

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import torch
import torch.nn.functional as F
from PIL import Image

from jaxcomposer import functional as cf
from jaxcomposer.algorithms import LabelSmoothing
from jaxcomposer.loss import soft_cross_entropy
from jaxcomposer.errors import MissingKeyError
from torch_bridge.adapter import ADAPTER

KEY = jax.random.key(7)
_rng = np.random.default_rng(0)
IMAGES = _rng.random((4, 3, 8, 8), dtype=np.float32)  # NCHW, values in [0, 1) (the augmentations need that range)
LABELS = np.array([0, 2, 1, 2], np.int64)  # torch's default label dtype


@dataclass(frozen=True)
class Case:
    name: str
    call: Callable  # (x, y, **layout) -> result: written as a Composer user writes the call
    layout: bool = True  # the form takes data_format: torch tensors default to NCHW, JAX and numpy are told NCHW


CASES = [
    Case("mixup_batch(x, y, 0.3)", lambda x, y, **kw: cf.mixup_batch(x, y, 0.3, key=KEY), layout=False),
    Case("mixup_batch(x, y, None, 0.4)", lambda x, y, **kw: cf.mixup_batch(x, y, None, 0.4, key=KEY), layout=False),
    Case("cutout_batch(x, 2)", lambda x, y, **kw: cf.cutout_batch(x, 2, key=KEY, **kw)),
    Case("cutout_batch(x, 1, 0.25, True)", lambda x, y, **kw: cf.cutout_batch(x, 1, 0.25, True, key=KEY, **kw)),
    Case("colout_batch(x, 0.25)", lambda x, y, **kw: cf.colout_batch(x, 0.25, key=KEY, **kw)),
    Case("colout_batch((x, mask), 0.25, 0.5, True)",
         lambda x, y, **kw: cf.colout_batch((x, x[:, 0]), 0.25, 0.5, True, key=KEY, **kw)),
    Case("cutmix_batch(x, y, 0.5)", lambda x, y, **kw: cf.cutmix_batch(x, y, 0.5, key=KEY, **kw)),
    Case("cutmix_batch(x, y, None, 0.7)", lambda x, y, **kw: cf.cutmix_batch(x, y, None, 0.7, key=KEY, **kw)),
    Case("resize_batch(x, y, 0.5)", lambda x, y, **kw: cf.resize_batch(x, y, 0.5, **kw)),
    Case("resize_batch(x, y, 0.5, 'crop')", lambda x, y, **kw: cf.resize_batch(x, y, 0.5, "crop", key=KEY, **kw)),
    Case("smooth_labels(logits, y, 0.2)", lambda x, y, **kw: cf.smooth_labels(x[:, :, 0, 0], y, 0.2, **kw)),
    Case("compute_ema(tree, ema_tree, 0.9)",
         lambda x, y, **kw: cf.compute_ema({"w": x, "n": y}, {"w": x * 0.5, "n": y}, 0.9), layout=False),
    Case("augmix_image(x, 3, 1, 2)", lambda x, y, **kw: cf.augmix_image(x, 3, 1, 2, rng=0, **kw)),
    Case("randaugment_image(x, 9, 1)", lambda x, y, **kw: cf.randaugment_image(x, 9, 1, rng=0, **kw)),
]

_TYPES = {"torch": torch.Tensor, "numpy": np.ndarray, "jax": jax.Array}
_CONVERT = {"torch": torch.from_numpy, "numpy": lambda a: a.copy(), "jax": jnp.asarray}


def _numpy(a):
    return a.numpy() if isinstance(a, torch.Tensor) else np.asarray(a)


def _expected_dtype(ref_dtype) -> np.dtype:
    # JAX computes int64 labels as int32; the caller's int64 comes back (torch's cross_entropy needs it)
    return np.dtype(np.int64) if np.dtype(ref_dtype) == np.int32 else np.dtype(ref_dtype)


@pytest.mark.parametrize("framework", ["torch", "numpy"])
@pytest.mark.parametrize("case", CASES, ids=lambda c: c.name)
def test_composer_positional_call_returns_callers_type(case, framework):
    layout = {"data_format": "NCHW"} if case.layout else {}
    ref = case.call(jnp.asarray(IMAGES), jnp.asarray(LABELS), **layout)
    x, y = _CONVERT[framework](IMAGES), _CONVERT[framework](LABELS)
    x_before = _numpy(x).copy()
    # torch tensors take Composer's NCHW layout without being told; numpy arrays default to ours (NHWC)
    got = case.call(x, y, **(layout if framework == "numpy" else {}))
    ref_leaves, got_leaves = jax.tree_util.tree_leaves(ref), jax.tree_util.tree_leaves(got)
    assert jax.tree_util.tree_structure(ref) == jax.tree_util.tree_structure(got)
    assert len(got_leaves) >= 1
    for r, g in zip(ref_leaves, got_leaves):
        if type(r) in (float, int):  # mixup's mixing, cutmix's area and box: Python numbers, as Composer's
            assert type(g) is type(r) and g == pytest.approx(r), (g, r, case.name)
            continue
        assert isinstance(g, _TYPES[framework]), (type(g), case.name)
        assert tuple(g.shape) == tuple(r.shape)
        assert np.dtype(_numpy(g).dtype) == _expected_dtype(r.dtype), (g.dtype, r.dtype, case.name)
        np.testing.assert_array_equal(_numpy(g), np.asarray(r).astype(_expected_dtype(r.dtype)))
    np.testing.assert_array_equal(_numpy(x), x_before)  # zero-copy in, but the caller's input is never written


def test_jax_in_jax_out_for_the_host_forms():
    # augmix_image computes in numpy on the host; a JAX caller still gets a JAX array
    out = cf.augmix_image(jnp.asarray(IMAGES), 3, 1, 2, rng=0, data_format="NCHW")
    assert isinstance(out, jax.Array) and out.shape == IMAGES.shape and out.dtype == jnp.float32


def test_numpy_defaults_to_nhwc_and_torch_to_nchw():
    nhwc = np.ascontiguousarray(np.moveaxis(IMAGES, 1, -1))
    from_numpy = cf.cutout_batch(nhwc, 2, 0.5, key=KEY)
    from_torch = cf.cutout_batch(torch.from_numpy(IMAGES), 2, 0.5, key=KEY)
    np.testing.assert_array_equal(np.moveaxis(from_numpy, -1, 1), from_torch.numpy())
    assert (from_numpy == 0).any()  # the holes are there, in the same place in both layouts


def test_mixup_mixing_is_composers_formula():
    # Composer: x_mix = (1 - mixing) * x + mixing * x[perm]; mixing=0.3 is the third positional argument
    x, y, perm = torch.from_numpy(IMAGES), torch.from_numpy(LABELS), torch.tensor([1, 2, 3, 0])
    mixed, y_perm, mixing = cf.mixup_batch(x, y, 0.3, indices=perm)  # mixing and indices given: no key needed
    torch.testing.assert_close(mixed, 0.7 * x + 0.3 * x[perm], rtol=0, atol=0)
    assert torch.equal(y_perm, y[perm]) and y_perm.dtype == torch.int64
    assert type(mixing) is float and mixing == pytest.approx(0.3)  # Composer returns the float it was given
    wide, _, _ = cf.mixup_batch(x.double(), y, 0.3, indices=perm)  # 64-bit in, 64-bit out (computed in float32)
    assert wide.dtype == torch.float64
    torch.testing.assert_close(wide, mixed.double(), rtol=0, atol=0)


def test_select_using_loss_with_a_torch_model_and_loss():
    # Composer calls model(x) under torch.no_grad() and loss_fun(output, target, reduction='none')
    x, y = torch.from_numpy(IMAGES), torch.from_numpy(LABELS)
    seen = []

    def model(inp):
        seen.append((type(inp), tuple(inp.shape), torch.is_grad_enabled()))
        return inp.mean(dim=(2, 3)) * 10

    xs, ys = cf.select_using_loss(x, y, model, F.cross_entropy, 0.5, 0.5, key=KEY)
    assert seen == [(torch.Tensor, (4, 3, 4, 4), False)]  # NCHW, downscaled by scale_factor=0.5, no graph
    assert isinstance(xs, torch.Tensor) and xs.shape == (2, 3, 8, 8) and ys.dtype == torch.int64
    ref_x, ref_y = cf.select_using_loss(jnp.asarray(IMAGES), jnp.asarray(LABELS), lambda v: v.mean(axis=(2, 3)) * 10,
                                        lambda o, t, reduction="none": soft_cross_entropy(o, t), 0.5, 0.5, key=KEY,
                                        data_format="NCHW")
    np.testing.assert_array_equal(xs.numpy(), ref_x)
    np.testing.assert_array_equal(ys.numpy(), ref_y)
    kept = [int(np.flatnonzero((IMAGES == row).all(axis=(1, 2, 3)))[0]) for row in xs.numpy()]
    np.testing.assert_array_equal(ys.numpy(), LABELS[kept])  # each kept input keeps its own target


# ---- missing and misplaced keys ----------------------------------------------------------------------------------

def _torch_xy():
    return torch.from_numpy(IMAGES), torch.from_numpy(LABELS)


MISSING_KEY = {
    "mixup_batch": lambda x, y: cf.mixup_batch(x, y, 0.3),
    "cutout_batch": lambda x, y: cf.cutout_batch(x, 2),
    "colout_batch": lambda x, y: cf.colout_batch(x, 0.2),
    "cutmix_batch": lambda x, y: cf.cutmix_batch(x, y),
    "resize_batch": lambda x, y: cf.resize_batch(x, y, 0.5, "crop"),
    "select_using_loss": lambda x, y: cf.select_using_loss(x, y, lambda v: v.mean(dim=(2, 3)), F.cross_entropy, 0.5),
}

NO_DRAW = {
    "mixup_batch": lambda x, y: cf.mixup_batch(x, y, 0.3, 0.2, torch.tensor([3, 2, 1, 0])),
    "cutout_batch": lambda x, y: cf.cutout_batch(x, 0),
    "colout_batch": lambda x, y: cf.colout_batch(x, 0.0, 0.0),
    "cutmix_batch": lambda x, y: cf.cutmix_batch(x, y, None, 1.0, (0, 0, 4, 4), torch.tensor([3, 2, 1, 0])),
    "resize_batch": lambda x, y: cf.resize_batch(x, y, 0.5, "resize"),
    "select_using_loss": lambda x, y: cf.select_using_loss(x, y, lambda v: v.mean(dim=(2, 3)), F.cross_entropy, 1.0),
}


def _jax_xy():
    return jnp.asarray(IMAGES.transpose(0, 2, 3, 1)), jnp.asarray(LABELS.astype(np.int32))


def _jax_call(name):
    """MISSING_KEY's call on JAX arrays (NHWC; select_using_loss's model and loss in JAX)."""
    if name == "select_using_loss":
        return lambda x, y: cf.select_using_loss(x, y, lambda v: v.mean(axis=(1, 2)),
                                                 lambda o, t, reduction="none": soft_cross_entropy(o, t), 0.5)
    return MISSING_KEY[name]


@pytest.mark.parametrize("name", sorted(MISSING_KEY))
def test_a_random_call_on_jax_arrays_without_key_says_what_it_needs(name):
    with pytest.raises(MissingKeyError, match=rf"^{name}: pass key=jax\.random\.key\(0\).*draws") as info:
        _jax_call(name)(*_jax_xy())
    assert isinstance(info.value, ValueError)


def _leaves(out):
    return [np.asarray(leaf) for leaf in jax.tree_util.tree_leaves(out)]


@pytest.mark.parametrize("name", sorted(MISSING_KEY))
def test_a_torch_call_without_key_draws_from_torchs_global_generator(name):
    """As Composer's forms: torch.manual_seed makes a torch loop's random calls repeat."""
    torch.manual_seed(3)
    first = _leaves(MISSING_KEY[name](*_torch_xy()))
    after_first = torch.rand(())  # the call took its draw from the generator...
    torch.manual_seed(3)
    again = _leaves(MISSING_KEY[name](*_torch_xy()))
    assert torch.equal(torch.rand(()), after_first)  # ...and the same draw again
    for a, b in zip(first, again, strict=True):
        np.testing.assert_array_equal(a, b)
    outputs = set()
    for seed in range(6):  # other seeds, other draws
        torch.manual_seed(seed)
        outputs.add(tuple(x.tobytes() for x in _leaves(MISSING_KEY[name](*_torch_xy()))))
    assert len(outputs) > 1


def test_a_numpy_call_without_key_draws_from_numpys_global_generator():
    x, y = IMAGES.transpose(0, 2, 3, 1).copy(), LABELS
    np.random.seed(5)
    first = cf.cutout_batch(x, 2)
    np.random.seed(5)
    np.testing.assert_array_equal(cf.cutout_batch(x, 2), first)
    np.random.seed(6)
    assert not np.array_equal(cf.cutout_batch(x, 2), first)


@pytest.mark.parametrize("name", sorted(NO_DRAW))
def test_a_call_that_draws_nothing_leaves_the_global_generator_alone(name):
    torch.manual_seed(0)
    NO_DRAW[name](*_torch_xy())
    after = torch.rand(())
    torch.manual_seed(0)
    assert torch.equal(torch.rand(()), after)


@pytest.mark.parametrize("name", sorted(NO_DRAW))
def test_a_call_that_draws_nothing_needs_no_key(name):
    out = NO_DRAW[name](*_torch_xy())
    assert all(isinstance(leaf, (torch.Tensor, float, int)) for leaf in jax.tree_util.tree_leaves(out))


@pytest.mark.parametrize("key", [jax.random.key(0), jax.random.PRNGKey(0)], ids=["typed", "raw"])
def test_a_key_in_composers_positional_place_is_refused(key):
    x, y = _torch_xy()
    with pytest.raises(TypeError, match="mixup_batch: mixing got a JAX PRNG key; pass it as key="):
        cf.mixup_batch(x, y, jax.random.key(0))
    with pytest.raises(TypeError, match="cutout_batch: num_holes got a JAX PRNG key"):
        cf.cutout_batch(x, key)
    with pytest.raises(TypeError, match="colout_batch: p_row got a JAX PRNG key"):
        cf.colout_batch(x, key)
    with pytest.raises(TypeError, match="cutmix_batch: length got a JAX PRNG key"):
        cf.cutmix_batch(x, y, key)
    with pytest.raises(TypeError, match="select_using_loss: keep got a JAX PRNG key"):
        cf.select_using_loss(x, y, lambda v: v, F.cross_entropy, key)


# ---- smooth_labels -------------------------------------------------------------------------------------------------

def test_smooth_labels_integer_one_hot_targets_equal_float_one_hot():
    logits = torch.randn(64, 2)
    y = torch.randint(0, 2, (64,))
    from_int = cf.smooth_labels(logits, F.one_hot(y, 2), 0.1)  # int64 one-hot: Composer treats it as dense
    assert from_int.shape == (64, 2) and from_int.dtype == torch.float32
    torch.testing.assert_close(from_int, cf.smooth_labels(logits, F.one_hot(y, 2).float(), 0.1), rtol=0, atol=0)
    torch.testing.assert_close(from_int, cf.smooth_labels(logits, y, 0.1), rtol=0, atol=0)
    torch.testing.assert_close(from_int, F.one_hot(y, 2).float() * 0.9 + 0.05, rtol=0, atol=1e-7)


def test_smooth_labels_torch_segmentation_classes_on_axis_one():
    logits = torch.randn(2, 3, 4, 5)  # Composer's (N, C, H, W)
    target = torch.randint(0, 3, (2, 4, 5))
    got = cf.smooth_labels(logits, target, 0.3)
    expected = F.one_hot(target, 3).permute(0, 3, 1, 2).float() * 0.7 + 0.1
    assert got.shape == (2, 3, 4, 5)
    torch.testing.assert_close(got, expected, rtol=0, atol=1e-7)


def test_smoothing_one_is_accepted():
    assert LabelSmoothing(smoothing=1.0) is not None
    got = cf.smooth_labels(torch.zeros(3, 4), torch.tensor([0, 1, 3]), 1.0)
    torch.testing.assert_close(got, torch.full((3, 4), 0.25), rtol=0, atol=0)
    with pytest.raises(ValueError, match="smoothing .* must be in \\[0, 1\\], got 1.01"):
        LabelSmoothing(smoothing=1.01)


# ---- compute_ema and freeze_layers on torch modules ------------------------------------------------------------

def _net(seed: int) -> torch.nn.Module:
    torch.manual_seed(seed)
    return torch.nn.Sequential(torch.nn.Conv2d(3, 4, 3), torch.nn.BatchNorm2d(4), torch.nn.Flatten(),
                               torch.nn.Linear(4 * 6 * 6, 2))


def test_compute_ema_updates_torch_modules_in_place():
    model, ema = _net(0), _net(1)
    model.train()
    for _ in range(3):  # move BatchNorm's running statistics and its counter
        model(torch.randn(5, 3, 8, 8))
    smoothing = 0.75
    old_ema = {k: v.clone() for k, v in ema.state_dict().items()}
    current = {k: v.clone() for k, v in model.state_dict().items()}
    storage = {k: v.data_ptr() for k, v in ema.state_dict().items()}
    out = cf.compute_ema(model, ema, smoothing)
    assert out is ema
    after = ema.state_dict()
    assert {k: v.data_ptr() for k, v in after.items()} == storage  # in place, as Composer's copy_
    floats = [k for k, v in old_ema.items() if v.is_floating_point()]
    assert {"1.running_mean", "1.running_var", "0.weight", "3.bias"} <= set(floats)
    for k in floats:  # Composer's expression, bit for bit: params and float buffers
        torch.testing.assert_close(after[k], old_ema[k] * smoothing + current[k] * (1. - smoothing), rtol=0, atol=0)
    moved = {k for k in floats if not torch.equal(after[k], old_ema[k])}
    assert {"1.running_mean", "1.running_var", "0.weight", "3.bias"} <= moved
    assert int(after["1.num_batches_tracked"]) == 3  # an integer counter is copied, not averaged
    for k, v in model.state_dict().items():
        assert torch.equal(v, current[k])  # the trained model is read, never written


def test_compute_ema_on_numpy_trees_is_pure():
    params = {"w": np.ones(3, np.float32), "step": np.array(5, np.int32)}
    ema = {"w": np.zeros(3, np.float32), "step": np.array(0, np.int32)}
    out = cf.compute_ema(params, ema, 0.9)
    assert isinstance(out["w"], np.ndarray) and out["w"].dtype == np.float32
    np.testing.assert_allclose(out["w"], 0.1, rtol=1e-6)
    assert out["step"] is params["step"]
    np.testing.assert_array_equal(ema["w"], 0.0)  # the caller's tree is untouched


def test_freeze_layers_on_a_torch_module_as_composer():
    torch.manual_seed(0)
    net = torch.nn.Sequential(torch.nn.Linear(5, 4), torch.nn.ReLU(), torch.nn.Linear(4, 3), torch.nn.Linear(3, 2))
    opt = torch.optim.SGD(net.parameters(), lr=0.1, momentum=0.9)
    depth, pct = cf.freeze_layers(net, opt, 0.9)  # (model, optimizers, current_duration): Composer's order
    assert (depth, pct) == (1, pytest.approx(0.8))  # 3 layers with params, int(0.8 * 2) = 1 frozen
    assert not net[0].weight.requires_grad and not net[0].bias.requires_grad
    assert net[2].weight.requires_grad and net[3].weight.requires_grad
    kept = {id(p) for p in opt.param_groups[0]["params"]}
    assert kept == {id(p) for p in (*net[2].parameters(), *net[3].parameters())}
    tree = {"a": {"w": np.ones(2)}, "b": {"w": np.ones(2)}, "c": {"w": np.ones(2)}}
    frozen, tree_depth, tree_pct = cf.freeze_layers(tree, None, 0.9)  # the same schedule on a pytree
    assert (tree_depth, tree_pct) == (depth, pct)
    assert [bool(frozen[k]["w"]) for k in "abc"] == [True, False, False]
    with pytest.raises(TypeError, match="current_duration=0.9"):
        cf.freeze_layers(tree, 0.9)  # the old (params, current_duration) order now means optimizers


@pytest.mark.parametrize("clipping_type", ["norm", "value", "adaptive"])
def test_apply_gradient_clipping_on_a_torch_module_as_composer(clipping_type):
    torch.manual_seed(0)
    net = torch.nn.Sequential(torch.nn.Linear(6, 4), torch.nn.Linear(4, 3))
    F.cross_entropy(net(torch.randn(5, 6) * 10), torch.tensor([0, 1, 2, 0, 1])).backward()
    grads = {k: p.grad.clone() for k, p in net.named_parameters()}
    weights = {k: p.detach().clone() for k, p in net.named_parameters()}
    out = cf.apply_gradient_clipping(net, clipping_type, 0.05, False)  # Composer's four positional arguments
    assert out is None  # in place, as Composer's
    if clipping_type == "adaptive":  # the same rule as the pytree form in torch layout with Composer's eps=0
        expected = cf.apply_gradient_clipping({k: g.numpy() for k, g in grads.items()}, "adaptive", 0.05,
                                              {k: w.numpy() for k, w in weights.items()}, eps=0.0, unit_axis=0)
    else:
        ref = copy.deepcopy(net)
        for k, p in ref.named_parameters():
            p.grad = grads[k].clone()
        clip = torch.nn.utils.clip_grad_norm_ if clipping_type == "norm" else torch.nn.utils.clip_grad_value_
        clip(list(ref.parameters()), 0.05)
        expected = {k: p.grad.numpy() for k, p in ref.named_parameters()}
    for k, p in net.named_parameters():
        np.testing.assert_allclose(p.grad.numpy(), expected[k], rtol=1e-6, atol=1e-7)
        assert not torch.equal(p.grad, grads[k]) or clipping_type == "value"
    assert any(not torch.equal(p.grad, grads[k]) for k, p in net.named_parameters())
    with pytest.raises(ValueError, match="fsdp_enabled=True"):
        cf.apply_gradient_clipping(net, clipping_type, 0.05, True)


# ---- PIL images ----------------------------------------------------------------------------------------------------

def test_colout_and_cutout_take_and_return_pil_images():
    rgb = Image.fromarray((_rng.random((10, 12, 3)) * 255).astype(np.uint8))  # 12 wide, 10 high
    out = cf.colout_batch(rgb, 0.2, 0.25, key=KEY)
    assert isinstance(out, Image.Image) and out.mode == "RGB" and out.size == (9, 8)
    ref = cf.colout_batch(jnp.asarray(np.asarray(rgb)), 0.2, 0.25, key=KEY)
    np.testing.assert_array_equal(np.asarray(out), ref)
    gray = Image.fromarray((_rng.random((10, 12)) * 255).astype(np.uint8))
    holed = cf.cutout_batch(gray, 1, 0.5, key=KEY)
    assert isinstance(holed, Image.Image) and holed.mode == "L" and holed.size == gray.size
    ref = cf.cutout_batch(jnp.asarray(np.asarray(gray))[:, :, None], 1, 0.5, key=KEY)[:, :, 0]
    np.testing.assert_array_equal(np.asarray(holed), ref)
    assert (np.asarray(holed) == 0).sum() > (np.asarray(gray) == 0).sum()


# ---- zero copy -----------------------------------------------------------------------------------------------------

def test_tensors_cross_without_a_copy():
    t = torch.tensor(IMAGES)  # torch's allocator aligns to 64 bytes; XLA copies a less aligned buffer (numpy's)
    assert t.data_ptr() % 64 == 0
    as_jax = ADAPTER.to_array(t)
    assert as_jax.unsafe_buffer_pointer() == t.data_ptr()  # DLPack: the tensor's own memory
    back = ADAPTER.from_array(t, as_jax)
    assert back.data_ptr() == t.data_ptr()
    x, y = _torch_xy()
    same_x, same_y = cf.resize_batch(x, y, 1.0)  # a factor >= 1 returns the caller's own tensors, as Composer's
    assert same_x is x and same_y is y
