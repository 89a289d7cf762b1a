"""Composer's decoupled-weight-decay optimizers as optax transformations.

Composer decays ``p *= 1 - (lr_t / initial_lr) * wd``: the decay follows the LR *schedule* but is not multiplied by
the LR itself (unlike ``torch.optim.AdamW`` / ``optax.adamw``, whose decay is ``lr_t * wd``). Here the schedule
multiplier ``alpha_t = lr_t / initial_lr`` is applied by the trainer as a final ``optax.scale(alpha(step))``,
so these transformations emit, at alpha = 1, the update ``-(lr * direction + wd * p)``. After the trainer's
scaling the step is ``-alpha_t * (lr * direction + wd * p)``, which is Composer's update exactly.
"""
from __future__ import annotations

import warnings
from typing import Any, Callable, NamedTuple

import jax
import jax.numpy as jnp

from jaxcomposer.core.state import tree_select

__all__ = ["DecoupledTransformation", "DecoupledSGDW", "DecoupledAdamW", "SGDWState", "AdamWState"]


class DecoupledTransformation(NamedTuple):
    """An optax ``GradientTransformation`` (``init``, ``update``) that also carries the initial ``lr``, which the
    trainer reads to log ``lr * alpha``."""

    init: Callable[[Any], Any]
    update: Callable[..., tuple[Any, Any]]
    lr: float


class SGDWState(NamedTuple):
    count: jnp.ndarray  # steps taken; torch seeds the momentum buffer with the first gradient
    momentum_buffer: Any  # pytree like params, or None without momentum


class AdamWState(NamedTuple):
    count: jnp.ndarray
    exp_avg: Any
    exp_avg_sq: Any
    max_exp_avg_sq: Any  # None unless amsgrad


def _check(name: str, value: float, ok: bool, expectation: str) -> None:
    if not ok:
        raise ValueError(f"Invalid {name}={value!r}: expected {expectation}.")


def _composer_params(name: str, params: Any, lr: Any, default: float | None) -> float:
    """Composer's optimizers take torch's ``params`` first; here the Trainer owns the parameters, so ``params``
    (``model.parameters()``, or param groups without options of their own) is accepted and not needed. A number
    in its place is the learning rate (``DecoupledSGDW(0.1)``), the optax habit."""
    if isinstance(params, (int, float)) and not isinstance(params, bool):
        if lr is not None:
            raise TypeError(f"{name}: got a learning rate twice ({params!r} positionally and lr={lr!r})")
        return params
    groups = params if isinstance(params, (list, tuple)) else []
    for i, group in enumerate(groups):
        if isinstance(group, dict) and set(group) - {"params"}:
            raise ValueError(f"{name}: param group {i} sets {sorted(set(group) - {'params'})}; per-group options are "
                             "not supported (one optimizer for every parameter, as the Trainer builds it); use "
                             "optax.multi_transform for per-group settings")
    if lr is None:
        if default is None:
            raise TypeError(f"{name}: lr is required, e.g. {name}(model.parameters(), lr=0.1)")
        return default
    return lr


def _need_params(params: Any, name: str) -> Any:
    if params is None:
        raise ValueError(f"{name}.update needs params for decoupled weight decay; call update(grads, state, params).")
    return params


def _decoupled(lr: float, wd: float, direction: Any, params: Any) -> Any:
    """-(lr * direction + wd * p), cast back to each parameter's dtype."""
    if wd == 0.0:
        return jax.tree.map(lambda d, p: (-lr * d).astype(p.dtype), direction, params)
    return jax.tree.map(lambda d, p: (-(lr * d + wd * p)).astype(p.dtype), direction, params)


def DecoupledSGDW(
    params: Any = None,
    lr: float | None = None,
    momentum: float = 0.0,
    dampening: float = 0.0,
    weight_decay: float = 0.0,
    nesterov: bool = False,
) -> DecoupledTransformation:
    """SGD with torch's momentum rule and Composer's decoupled decay.

    Momentum as ``torch.optim.SGD``: ``buf = g`` on the first step, then ``buf = momentum * buf + (1 - dampening) * g``;
    the direction is ``g + momentum * buf`` with nesterov, else ``buf``. Composer's call,
    ``DecoupledSGDW(model.parameters(), lr=0.1, ...)``, works as written (see :func:`_composer_params`).
    """
    lr = _composer_params("DecoupledSGDW", params, lr, default=None)
    _check("lr", lr, lr > 0, "lr > 0")
    _check("momentum", momentum, momentum >= 0, "momentum >= 0")
    _check("dampening", dampening, dampening >= 0, "dampening >= 0")
    _check("weight_decay", weight_decay, weight_decay >= 0, "weight_decay >= 0")
    if nesterov and (momentum <= 0 or dampening != 0):
        raise ValueError(
            f"Invalid nesterov=True with momentum={momentum!r}, dampening={dampening!r}: "
            f"expected momentum > 0 and dampening = 0 (as torch.optim.SGD)."
        )
    if weight_decay >= 1e-3:
        warnings.warn(
            f"DecoupledSGDW: weight_decay={weight_decay!r} is NOT multiplied by lr (it is scaled only by the LR "
            f"schedule), so it is much stronger than the same value in torch.optim.SGD; typical values are ~1e-5.",
            stacklevel=2,
        )
    lr, momentum, dampening, wd = float(lr), float(momentum), float(dampening), float(weight_decay)

    def init(params):
        buf = jax.tree.map(jnp.zeros_like, params) if momentum != 0.0 else None
        return SGDWState(count=jnp.zeros((), jnp.int32), momentum_buffer=buf)

    def update(grads, state, params=None):
        params = _need_params(params, "DecoupledSGDW")
        if momentum == 0.0:
            return _decoupled(lr, wd, grads, params), SGDWState(state.count + 1, None)
        first = state.count == 0
        buf = jax.tree.map(
            lambda b, g: tree_select(first, g, momentum * b + (1.0 - dampening) * g).astype(b.dtype),
            state.momentum_buffer, grads,
        )
        direction = jax.tree.map(lambda g, b: g + momentum * b, grads, buf) if nesterov else buf
        return _decoupled(lr, wd, direction, params), SGDWState(state.count + 1, buf)

    return DecoupledTransformation(init, update, lr)


def DecoupledAdamW(
    params: Any = None,
    lr: float | None = None,
    betas: tuple[float, float] = (0.9, 0.95),
    eps: float = 1e-8,
    weight_decay: float = 1e-5,
    amsgrad: bool = False,
) -> DecoupledTransformation:
    """Adam with torch's bias correction (``denom = sqrt(v) / sqrt(bc2) + eps``) and Composer's decoupled decay.
    ``lr`` defaults to 1e-3; Composer's call, ``DecoupledAdamW(model.parameters(), lr=...)``, works as written."""
    lr = _composer_params("DecoupledAdamW", params, lr, default=1e-3)
    _check("lr", lr, lr > 0, "lr > 0")
    if not (isinstance(betas, (tuple, list)) and len(betas) == 2):
        raise ValueError(f"Invalid betas={betas!r}: expected a pair (beta1, beta2).")
    _check("betas[0]", betas[0], 0.0 <= betas[0] < 1.0, "0 <= beta1 < 1")
    _check("betas[1]", betas[1], 0.0 <= betas[1] < 1.0, "0 <= beta2 < 1")
    _check("eps", eps, eps >= 0, "eps >= 0")
    _check("weight_decay", weight_decay, weight_decay >= 0, "weight_decay >= 0")
    lr, (b1, b2), eps, wd = float(lr), (float(betas[0]), float(betas[1])), float(eps), float(weight_decay)

    def init(params):
        zeros = lambda: jax.tree.map(jnp.zeros_like, params)  # noqa: E731
        return AdamWState(jnp.zeros((), jnp.int32), zeros(), zeros(), zeros() if amsgrad else None)

    def update(grads, state, params=None):
        params = _need_params(params, "DecoupledAdamW")
        count = state.count + 1
        t = count.astype(jnp.float32)
        bc1 = 1.0 - jnp.float32(b1) ** t
        bc2_sqrt = jnp.sqrt(1.0 - jnp.float32(b2) ** t)
        m = jax.tree.map(lambda m, g: b1 * m + (1.0 - b1) * g, state.exp_avg, grads)
        v = jax.tree.map(lambda v, g: b2 * v + (1.0 - b2) * g * g, state.exp_avg_sq, grads)
        v_max = jax.tree.map(jnp.maximum, state.max_exp_avg_sq, v) if amsgrad else None
        second = v_max if amsgrad else v
        direction = jax.tree.map(lambda m, s: (m / bc1) / (jnp.sqrt(s) / bc2_sqrt + eps), m, second)
        return _decoupled(lr, wd, direction, params), AdamWState(count, m, v, v_max)

    return DecoupledTransformation(init, update, lr)

