"""The statistics and normalization of jaxcomposer.algorithms.low_precision_norm against flax's own layers: our
copies of flax's private helpers must give nnx.LayerNorm's and nnx.GroupNorm's outputs bit for bit, in float32 and
in bfloat16, with every option the low-precision layers pass through."""
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from jaxcomposer.algorithms.low_precision_groupnorm import LPGroupNorm
from jaxcomposer.algorithms.low_precision_layernorm import LPLayerNorm
from jaxcomposer.algorithms.low_precision_norm import canonical_axes, norm_stats, normalize

DTYPES = (jnp.float32, jnp.bfloat16)


def _randomize_affine(layer: nnx.Module, seed: int) -> None:
    """Scale and bias away from flax's ones and zeros, so a dropped or misshaped parameter shows."""
    keys = jax.random.split(jax.random.PRNGKey(seed), 2)
    for key, name in zip(keys, ("scale", "bias")):
        variable = getattr(layer, name)
        if variable is not None:
            variable[...] = (1 + jax.random.normal(key, variable[...].shape)).astype(variable[...].dtype)


def _input(shape, dtype, seed=0):
    return (jax.random.normal(jax.random.PRNGKey(seed), shape) * 3 + 1).astype(dtype)


def _assert_same(ours, flax_out):
    assert ours.dtype == flax_out.dtype
    np.testing.assert_array_equal(np.asarray(ours.astype(jnp.float32)), np.asarray(flax_out.astype(jnp.float32)))


LAYER_NORM_SETTINGS = (
    {},
    {"use_fast_variance": False},
    {"use_bias": False},
    {"use_scale": False, "use_bias": False},
    {"reduction_axes": (-2, -1), "feature_axes": -1},
    {"reduction_axes": (1, 2), "feature_axes": (1, 2)},
)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("settings", LAYER_NORM_SETTINGS, ids=str)
def test_layer_norm_matches_flax(dtype, settings):
    x = _input((3, 5, 8), dtype)
    num_features = 40 if settings.get("feature_axes") == (1, 2) else 8
    layer = nnx.LayerNorm(num_features, param_dtype=dtype, rngs=nnx.Rngs(0), **settings)
    _randomize_affine(layer, 1)
    _assert_same(LPLayerNorm.from_layer_norm(layer)(x), layer(x))
    _assert_same(jax.jit(lambda v: LPLayerNorm.from_layer_norm(layer)(v))(x), jax.jit(lambda v: layer(v))(x))


@pytest.mark.parametrize("dtype", DTYPES)
def test_layer_norm_mask_matches_flax(dtype):
    x = _input((4, 6, 8), dtype, seed=2)
    mask = jax.random.bernoulli(jax.random.PRNGKey(3), 0.7, (4, 6, 8))
    layer = nnx.LayerNorm(8, param_dtype=dtype, rngs=nnx.Rngs(0))
    _randomize_affine(layer, 4)
    _assert_same(LPLayerNorm.from_layer_norm(layer)(x, mask=mask), layer(x, mask=mask))


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("settings", ({}, {"use_fast_variance": False}, {"reduction_axes": (1, 2, 3)},
                                      {"use_scale": False}), ids=str)
def test_group_norm_matches_flax_with_and_without_a_mask(dtype, settings):
    x = _input((2, 4, 3, 8), dtype, seed=5)
    layer = nnx.GroupNorm(8, num_groups=4, param_dtype=dtype, rngs=nnx.Rngs(0), **settings)
    _randomize_affine(layer, 6)
    _assert_same(LPGroupNorm.from_group_norm(layer)(x), layer(x))
    mask = jax.random.bernoulli(jax.random.PRNGKey(7), 0.8, x.shape)
    _assert_same(LPGroupNorm.from_group_norm(layer)(x, mask=mask), layer(x, mask=mask))


@pytest.mark.parametrize("fast", (True, False))
def test_the_statistics_are_averaged_over_axis_name_as_flax_does(fast):
    # vmap names an axis as pmap and shard_map do: both layers pmean their statistics over it
    xs = _input((3, 2, 8), jnp.float32, seed=8)
    layer = nnx.LayerNorm(8, axis_name="shards", use_fast_variance=fast, rngs=nnx.Rngs(0))
    _randomize_affine(layer, 9)
    lp = LPLayerNorm.from_layer_norm(layer)
    ours = jax.vmap(lambda x: lp(x), axis_name="shards")(xs)
    _assert_same(ours, jax.vmap(lambda x: layer(x), axis_name="shards")(xs))
    per_shard = jax.vmap(lambda x: nnx.LayerNorm(8, rngs=nnx.Rngs(0))(x))(xs)
    assert not np.array_equal(np.asarray(ours), np.asarray(per_shard))  # the pmean did something


@pytest.mark.parametrize("dtype", DTYPES)
def test_norm_stats_accumulate_in_float32_and_match_float64(dtype):
    x = _input((4, 16), dtype, seed=10)
    mean, var = norm_stats(x, -1, dtype)
    assert mean.dtype == var.dtype == jnp.float32
    exact = np.asarray(x.astype(jnp.float32)).astype(np.float64)
    np.testing.assert_allclose(np.asarray(mean), exact.mean(-1), rtol=1e-6, atol=1e-6)
    np.testing.assert_allclose(np.asarray(var), exact.var(-1), rtol=1e-5, atol=1e-6)
    y = normalize(x, mean, var, None, None, -1, -1, dtype, 1e-5)
    assert y.dtype == dtype


def test_canonical_axes():
    assert sorted(canonical_axes(4, -1)) == [3]
    assert sorted(canonical_axes(4, (1, -1, 3))) == [1, 3]
