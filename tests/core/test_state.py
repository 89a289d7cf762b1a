"""``tree_select``: jnp.where over trees, staged as one select per leaf."""
import jax
import jax.numpy as jnp
import numpy as np

from jaxcomposer.core.state import tree_select


def test_tree_select_equals_where_with_its_types():
    new = {"w": jnp.arange(6.0).reshape(2, 3), "count": jnp.int32(5), "lr": jnp.asarray(0.5, jnp.bfloat16),
           "half": jnp.ones(3, jnp.float16), "weak": jnp.float32(3.0)}
    old = {"w": jnp.zeros((2, 3)), "count": jnp.int32(4), "lr": jnp.asarray(0.25, jnp.bfloat16),
           "half": jnp.float32(2.0),  # a shape and dtype that differ: jnp.where's broadcasting and promotion
           "weak": jnp.asarray(1.0) * 2}  # weakly typed
    for pred in (True, False):
        got = jax.jit(tree_select)(jnp.bool_(pred), new, old)
        want = jax.tree.map(lambda a, b: jnp.where(pred, a, b), new, old)
        for k in new:
            assert got[k].aval == want[k].aval, k  # dtype, shape and weak type
            np.testing.assert_array_equal(got[k], want[k], err_msg=k)
    jaxpr = jax.make_jaxpr(tree_select)(jnp.bool_(True), new, old)
    # same-typed leaves are plain selects (no nested jitted function per leaf); the mixed pair goes through where
    assert [e.primitive.name for e in jaxpr.eqns].count("select_n") == 4
