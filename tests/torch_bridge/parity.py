"""Parity harnesses: the per-op one of the ATen op tests (run a lowering eagerly and under jit, compare with the torch
op; :class:`JitTable` runs a whole table under one jit) and the one comparison of whole models and layers with
torch, :func:`assert_close_on_scale`."""
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
    """Torch tensors as JAX arrays, also inside lists, tuples and dicts; anything else as it is. (A copy put on the
    device: ``jnp.asarray`` of a numpy array compiles an identity program per new shape and dtype, and
    ``device_put`` alone would alias the tensor's memory, which in-place torch ops write.)"""
    if isinstance(x, torch.Tensor):
        return jax.device_put(np.array(to_numpy(x)))
    if isinstance(x, (list, tuple)):
        return type(x)(to_jax(e) for e in x)
    if isinstance(x, dict):
        return {k: to_jax(v) for k, v in x.items()}
    return x


def _traceable(fn, args, kwargs, extra):
    """``(arrays, call)``: the JAX arrays among ``args``/``kwargs`` (inside lists too) and ``call(arrays)``, which runs
    ``fn`` with them put back. Under jit the arrays are traced; ints, dtypes and strings stay static, as in a
    bridged graph."""
    leaves, tree = jax.tree.flatten((args, kwargs))
    traced = [isinstance(leaf, jax.Array) for leaf in leaves]

    def call(arrays):
        it = iter(arrays)
        a, k = jax.tree.unflatten(tree, [next(it) if t else leaf for leaf, t in zip(leaves, traced)])
        return fn(*a, **k, **extra)

    return [leaf for leaf, t in zip(leaves, traced) if t], call


def run_lowering(op, args=(), kwargs=None, jit=True, **extra):
    """The lowering of ``op`` on the torch arguments turned into JAX ones, eagerly or under its own ``jax.jit``."""
    fn = lookup(op).fn
    jargs, jkwargs = to_jax(tuple(args)), to_jax(kwargs or {})
    if not jit:
        return fn(*jargs, **jkwargs, **extra)
    arrays, call = _traceable(fn, jargs, jkwargs, extra)
    return jax.jit(call)(arrays)


class JitTable:
    """The rows of one op table, ``pytest.param(op, args, kwargs, ...)``, under a single ``jax.jit``.

    A row's own jit costs an XLA:CPU compile, most of an op test's time; one function that traces every row
    compiles a table of hundreds of rows in seconds. Each row is traced on its own inside that function, so a row
    whose lowering fails to trace fails alone, with its own error; :meth:`run` hands a row its result (or raises
    that error). Built on first use, once per process.

    Eager runs are checked on the first row of each overload only (:meth:`checks_eagerly`): a lowering that works
    under jit and breaks eagerly does so on its code path, not on particular values, and eager dispatch compiles
    every primitive on its own (an op table's eager runs cost several times its one jit). Every row's values are checked
    under jit.
    """

    def __init__(self, rows):
        self._rows = [p.values[:3] for p in rows]
        self._row_of = {id(args): i for i, (_, args, _) in enumerate(self._rows)}
        self._first_of_op = {}
        for i, (op, _, _) in enumerate(self._rows):
            self._first_of_op.setdefault(op, i)
        self._results = None

    def checks_eagerly(self, op, args) -> bool:
        """Whether this row (the very ``args`` object of the table) is its overload's first, the one run eagerly."""
        return self._first_of_op[op] == self._row_of[id(args)]

    def run(self, op, args, kwargs):
        """The jitted result of the row whose ``args`` these are (the very objects of the table)."""
        i = self._row_of[id(args)]
        assert self._rows[i][0] is op and self._rows[i][2] is kwargs, "not a row of this table"
        if self._results is None:
            self._results = self._run_all()
        result = self._results[i]
        if isinstance(result, Exception):
            raise result
        return result

    def _run_all(self) -> list:
        errors, calls, inputs = {}, [], []
        for i, (op, args, kwargs) in enumerate(self._rows):
            lowering = lookup(op)
            if lowering is None:
                errors[i] = AssertionError(f"{op} is not lowered")
                arrays, call = [], None
            else:
                arrays, call = _traceable(lowering.fn, to_jax(tuple(args)), to_jax(kwargs), {})
            calls.append(call)
            inputs.append(arrays)

        def every_row(inputs):
            outs = []
            for i, (call, arrays) in enumerate(zip(calls, inputs)):
                try:
                    outs.append(None if i in errors else call(arrays))
                except Exception as e:  # this row's failure, raised in its own test
                    errors[i] = e
                    outs.append(None)
            return outs

        try:
            outs = jax.jit(every_row)(inputs)
        except Exception:  # a failure past tracing (XLA's): one jit per row, so that it lands on its own row
            outs = [None] * len(calls)
            for i, (call, arrays) in enumerate(zip(calls, inputs)):
                if i not in errors:
                    try:
                        outs[i] = jax.jit(call)(arrays)
                    except Exception as e:
                        errors[i] = e
        return [errors.get(i, out) for i, out in enumerate(outs)]


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


def check_parity(op, args, kwargs, tol, table: JitTable | None = None):
    """The lowering of ``op`` equals the torch op itself (values, dtype, shape) under jit (the row's result from
    ``table`` when the row is one of its own) and eagerly (with a table: on its overload's first row)."""
    expected = op(*args, **kwargs)
    assert lookup(op) is not None, f"{op} is not lowered"
    if table is None or table.checks_eagerly(op, args):
        assert_matches(run_lowering(op, args, kwargs, jit=False), expected, tol, "eager")
    jitted = table.run(op, args, kwargs) if table is not None else run_lowering(op, args, kwargs)
    assert_matches(jitted, expected, tol, "jit")


def grads_against_torch(op, args, kwargs, wrt):
    """``(jax_grads, torch_grads)``: the gradients of ``sum(out * w)`` with respect to ``args[i]`` for each ``i`` in
    ``wrt``, from the lowering under ``jax.jit(jax.grad)`` and from torch autograd on the op itself. ``w`` are fixed
    random weights of the output's shape, so every output element counts; of a tuple output (values, indices) the
    first element is used."""
    first = lambda out: out[0] if isinstance(out, (tuple, list)) else out
    targs = [a.detach().clone().requires_grad_(i in wrt) if isinstance(a, torch.Tensor) else a
             for i, a in enumerate(args)]
    out = first(op(*targs, **kwargs))
    w = torch.rand(out.shape, generator=torch.Generator().manual_seed(0)) + 0.5
    torch_grads = torch.autograd.grad((out * w).sum(), [targs[i] for i in wrt])
    fn, jargs, jkwargs, jw = lookup(op).fn, list(to_jax(tuple(args))), to_jax(kwargs), to_jax(w)

    def weighted_sum(diff):
        a = list(jargs)
        for i, v in zip(wrt, diff):
            a[i] = v
        return jnp.sum(first(fn(*a, **jkwargs)) * jw)

    return jax.jit(jax.grad(weighted_sum))([jargs[i] for i in wrt]), torch_grads


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
