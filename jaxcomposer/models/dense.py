"""A dense layer's product whose kernel gradient XLA:CPU runs as an ordinary matrix product.

Autodiff writes the kernel gradient of ``y = x @ w`` as one dot that contracts the batch axis, the leading axis of
both operands (``x^T dy`` with the transpose folded into the dot). XLA:CPU hands ordinary products (the lhs's last
axis against the rhs's first) to its YNNPACK kernels, but runs this shape on Eigen's generic contraction, several
times as slow as the forward product (the quickstart ConvNet's head, (128 x 1536)^T (128 x 10)).
:func:`dense_dot_general` keeps the forward and the input gradient as they were and, on the CPU only, writes the
kernel gradient as ``transpose(transpose(dy) @ x)``: an ordinary product between two small transposes, each
materialized behind an optimization barrier (XLA would otherwise fold them back into the dot); ``dy`` is transposed
rather than ``x``, the larger operand (benchmarks/README.md, "Measurements behind code choices"). Elsewhere
(cuBLAS and the TPU read transposed operands natively) the gradient is autodiff's (``jax.lax.platform_dependent``).

Pass it as ``nnx.Linear(..., dot_general=dense_dot_general)``. Products it does not cover (batch dimensions,
contractions other than the last input axis against a 2-D kernel's first) go to ``jax.lax.dot_general`` unchanged.
Like any ``jax.custom_vjp``, the covered product supports reverse mode (gradients of gradients included) but not
forward mode (``jax.jvp``, ``jax.hessian``).
"""
from __future__ import annotations

import jax
import jax.numpy as jnp
from jax import lax


def _plain_kernel_grad(x2: jax.Array, dy2: jax.Array) -> jax.Array:
    return lax.dot_general(x2, dy2, (((0,), (0,)), ((), ())))


def _cpu_kernel_grad(x2: jax.Array, dy2: jax.Array) -> jax.Array:
    # (dy^T x)^T: only dy (batch x out) and the result (out x in) are transposed, both small for a classifier head.
    # The barriers keep XLA from folding either transpose back into the dot.
    barrier = lax.optimization_barrier
    return barrier(barrier(dy2.T) @ x2).T


@jax.custom_vjp
def _dense(x: jax.Array, w: jax.Array) -> jax.Array:
    return lax.dot_general(x, w, (((x.ndim - 1,), (0,)), ((), ())))


def _dense_fwd(x, w):
    return _dense(x, w), (x, w)


def _dense_bwd(residuals, dy):
    x, w = residuals
    dx = lax.dot_general(dy, w, (((dy.ndim - 1,), (1,)), ((), ()))).astype(x.dtype)
    x2, dy2 = x.reshape(-1, x.shape[-1]), dy.reshape(-1, dy.shape[-1])
    dw = lax.platform_dependent(x2, dy2, cpu=_cpu_kernel_grad, default=_plain_kernel_grad)
    return dx, dw.astype(w.dtype)


_dense.defvjp(_dense_fwd, _dense_bwd)


def dense_dot_general(lhs, rhs, dimension_numbers, precision=None, preferred_element_type=None, **kwargs):
    """``jax.lax.dot_general``'s signature; a dense layer's product (``lhs``'s last axis against a 2-D ``rhs``'s
    first, no batch dimensions, default precision and result type) gets the CPU-friendly kernel gradient."""
    (lhs_contract, rhs_contract), (lhs_batch, rhs_batch) = dimension_numbers
    covered = (rhs.ndim == 2 and tuple(lhs_contract) == (lhs.ndim - 1,) and tuple(rhs_contract) == (0,)
               and not lhs_batch and not rhs_batch and precision is None and preferred_element_type is None
               and kwargs.get("out_sharding") is None and lhs.dtype == rhs.dtype
               and jnp.issubdtype(lhs.dtype, jnp.floating))
    if not covered:
        return lax.dot_general(lhs, rhs, dimension_numbers, precision=precision,
                               preferred_element_type=preferred_element_type, **kwargs)
    return _dense(lhs, rhs)
