"""The per-op parity harness of the ATen op tests: run a lowering eagerly and under jit, compare with the torch op."""
import jax
import jax.numpy as jnp
import numpy as np
import torch

from torch_bridge.ops.registry import lookup, to_jnp_dtype, to_numpy


def to_jax(x):
    return jnp.asarray(to_numpy(x)) if isinstance(x, torch.Tensor) else x


def run_jitted(fn, args, kwargs):
    """Tensors become traced jit arguments; scalars, dtypes and lists stay static, as in a bridged graph."""
    pos = [i for i, a in enumerate(args) if isinstance(a, jax.Array)]
    keys = [k for k, v in kwargs.items() if isinstance(v, jax.Array)]

    def f(arrays, kw_arrays):
        a = list(args)
        for i, v in zip(pos, arrays):
            a[i] = v
        return fn(*a, **{**kwargs, **kw_arrays})

    return jax.jit(f)([args[i] for i in pos], {k: kwargs[k] for k in keys})


def assert_matches(got, expected, tol, where=""):
    if isinstance(expected, (tuple, list)):
        assert isinstance(got, (tuple, list)) and len(got) == len(expected), where
        for i, (g, e) in enumerate(zip(got, expected)):
            assert_matches(g, e, tol, f"{where}[{i}]")
        return
    want = to_numpy(expected)
    got = np.asarray(got)
    assert got.dtype == np.dtype(to_jnp_dtype(expected.dtype)), f"{where} dtype {got.dtype} vs torch {expected.dtype}"
    assert got.shape == want.shape, f"{where} shape {got.shape} vs {want.shape}"
    if np.issubdtype(want.dtype, np.floating) or want.dtype == jnp.bfloat16:
        np.testing.assert_allclose(got.astype(np.float32), want.astype(np.float32), atol=tol[0], rtol=tol[1],
                                   equal_nan=True, err_msg=where)
    else:
        np.testing.assert_array_equal(got, want, err_msg=where)


def check_parity(op, args, kwargs, tol):
    """The lowering of ``op`` equals the torch op itself (values, dtype, shape), eagerly and under jit."""
    expected = op(*args, **kwargs)
    lowering = lookup(op)
    assert lowering is not None, f"{op} is not lowered"
    jargs = tuple(to_jax(a) for a in args)
    jkwargs = {k: to_jax(v) for k, v in kwargs.items()}
    assert_matches(lowering.fn(*jargs, **jkwargs), expected, tol, "eager")
    assert_matches(run_jitted(lowering.fn, jargs, jkwargs), expected, tol, "jit")
