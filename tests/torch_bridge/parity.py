"""Parity harnesses: the per-op one of the ATen op tests (run a lowering eagerly and under jit, compare with the torch
op) and the one comparison of whole models and layers with torch, :func:`assert_close_on_scale`."""
import jax
import jax.numpy as jnp
import numpy as np
import torch

from torch_bridge.ops.registry import lookup, to_jnp_dtype, to_numpy

MODEL_TOL = 1e-4  # a whole model: outputs, gradients, the loss, a to_torch round trip
LAYER_TOL = 1e-5  # one layer or block, BatchNorm running statistics


def assert_close_on_scale(got, want, tol, where=""):
    """``max |got - want| <= tol * max(max |want|, 1)``: one bound on the reference's scale, not one per element.

    float32 rounding grows with the magnitude of what was summed, not with each result element: a logit of 26
    computed from terms near 7,000 carries their rounding (~1e-3), which an element-wise ``rtol`` flags although it
    is 1e-7 of the output's scale. Below scale 1 the bound is ``tol`` absolute, so outputs near zero (an unused
    gradient, ~1e-13) are not held to a relative bound rounding cannot meet. Non-finite entries must match exactly.
    ``want`` may be a torch tensor; shapes must be equal (no broadcasting).
    """
    want = want.detach().cpu().numpy() if isinstance(want, torch.Tensor) else np.asarray(want)
    got = np.asarray(got)
    assert got.shape == want.shape, f"{where} shape {got.shape} vs {want.shape}"
    g, w = got.astype(np.float64), want.astype(np.float64)
    finite = np.isfinite(w)
    np.testing.assert_array_equal(g[~finite], w[~finite], err_msg=f"{where} non-finite entries differ")
    with np.errstate(invalid="ignore"):  # inf - inf where both are inf: masked out
        err = np.where(finite, np.abs(g - w), 0.0)
    if not err.size:
        return
    assert not np.isnan(err).any(), f"{where} non-finite values where the reference is finite"
    scale = max(float(np.abs(w[finite]).max(initial=0.0)), 1.0)
    i = np.unravel_index(int(err.argmax()), err.shape)
    assert err[i] <= tol * scale, (f"{where} max |got - want| = {err[i]:.3g} at {tuple(map(int, i))} "
                                   f"(got {g[i]:.7g}, want {w[i]:.7g}) > {tol:g} * scale {scale:.4g}")


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


def assert_signature_matches_schema(op) -> None:
    """The lowering of ``op`` takes the ATen schema's arguments: positional ones in the schema's order, every schema
    argument by name, the schema's default wherever it has one, and no required argument the schema does not require."""
    import inspect

    params = inspect.signature(lookup(op).fn).parameters
    schema = op._schema.arguments
    positional = [a.name for a in schema if not a.kwarg_only]
    assert list(params)[:len(positional)] == positional, f"{op}: {list(params)} vs schema {positional}"
    for a in schema:
        assert a.name in params, f"{op}: no parameter {a.name}"
        if a.has_default_value():
            default = params[a.name].default
            assert default is not inspect.Parameter.empty, f"{op}: {a.name} has no default"
            if not isinstance(a.default_value, torch.dtype):
                same = default == a.default_value or (isinstance(default, (list, tuple)) and isinstance(
                    a.default_value, (list, tuple)) and list(default) == list(a.default_value))  # () for []
                assert same, \
                    f"{op}: {a.name}={default!r}, schema default {a.default_value!r}"
    required = {n for n, p in params.items() if p.default is inspect.Parameter.empty}
    assert required <= {a.name for a in schema if not a.has_default_value()}, f"{op}: {required}"
