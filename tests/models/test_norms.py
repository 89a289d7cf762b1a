"""``with_cheap_stat_writes``: a BatchNorm whose running statistics skip flax's traced ``.sharding`` probe computes
exactly what the plain one does, and keeps its variable type through split, merge and jit."""
import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from jaxcomposer.models.norms import RunningStat, with_cheap_stat_writes


def _train_step(bn: nnx.BatchNorm, x: jax.Array):
    graphdef, params, stats = nnx.split(bn, nnx.Param, nnx.BatchStat)

    @jax.jit
    def step(params, stats, x):
        def loss(params):
            live = nnx.merge(graphdef, params, stats, copy=True)
            y = live(x, use_running_average=False)
            weights = jnp.arange(y.shape[-1], dtype=y.dtype)[None, None, None, :]
            return jnp.sum(y * weights), nnx.state(live, nnx.BatchStat)
        return jax.grad(loss, has_aux=True)(params)

    return step(params, stats, x)


def test_the_same_outputs_gradients_and_running_statistics_as_flax():
    x = jax.random.normal(jax.random.key(0), (6, 5, 5, 3))
    plain = nnx.BatchNorm(3, momentum=0.9, rngs=nnx.Rngs(0))
    cheap = with_cheap_stat_writes(nnx.BatchNorm(3, momentum=0.9, rngs=nnx.Rngs(0)))
    assert isinstance(cheap.mean, RunningStat) and isinstance(cheap.var, RunningStat)
    (g_plain, s_plain), (g_cheap, s_cheap) = _train_step(plain, x), _train_step(cheap, x)
    for a, b in zip(jax.tree.leaves((g_plain, s_plain)), jax.tree.leaves((g_cheap, s_cheap))):
        np.testing.assert_array_equal(a, b)
    assert not np.array_equal(s_cheap["mean"].get_value(), np.zeros(3))  # the statistics did move
    # the type survives the round trip the Trainer makes, and partial writes still work
    merged = nnx.merge(*nnx.split(cheap))
    assert type(merged.var) is RunningStat
    merged.var[1] = 5.0
    np.testing.assert_array_equal(merged.var.get_value(), [1.0, 5.0, 1.0])
    merged.var[...] = 2.0  # a broadcast write keeps flax's meaning (and the array's shape)
    np.testing.assert_array_equal(merged.var.get_value(), [2.0, 2.0, 2.0])
    assert with_cheap_stat_writes(merged) is merged and type(merged.mean) is RunningStat  # idempotent
