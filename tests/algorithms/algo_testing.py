"""Shared helpers for the per-method tests (docs/design.md, "Tests").

``examples()`` collects each method's representative configuration (the ``EXAMPLE`` in its own test file): the
composition table (test_composition.py) and the Trainer contract (test_trainer_contract.py) parametrize over it. ``dummy_step`` is
a minimal pure train step that touches every slot a method can fill; ``run_steps`` runs a few of them jitted.
"""
from __future__ import annotations

import jax
import jax.numpy as jnp
import optax

from jaxcomposer import algorithms
import functools
import importlib
from typing import Callable, NamedTuple

from jaxcomposer.core.method import Composed, Method, ModelView, RunInfo, StepCtx
from jaxcomposer.loss import soft_cross_entropy
from jaxcomposer.trainer.step import make_base_tx

NUM_CLASSES = 5
IMAGE_SHAPE = (8, 8, 3)  # NHWC without the batch axis

class Example(NamedTuple):
    """A method's representative configuration, declared as ``EXAMPLE`` in its test file
    (``tests/algorithms/test_<module>.py``): the composition table and the Trainer contract run it."""

    make: Callable[[], Method]
    # the module class this method's surgery puts into the contract's NNX ResNet (test_trainer_contract.py checks it
    # is there, in the module passed in), for the methods that change an NNX ResNet's modules
    surgery: type | None = None


@functools.cache
def examples() -> dict[str, Example]:
    """Factory name -> the ``EXAMPLE`` of every registered method, from the method's own test file (a method
    without one fails the contract's coverage test)."""
    out = {}
    for entry in algorithms.ENTRIES:
        module = entry.factory.__module__.rsplit(".", 1)[-1]
        try:
            test_module = importlib.import_module(f"tests.algorithms.test_{module}")
        except ModuleNotFoundError:
            continue
        if hasattr(test_module, "EXAMPLE"):
            out[entry.factory.__name__] = test_module.EXAMPLE
    return out




def make_ctx(step, key=None, *, total_steps: int = 10, steps_per_epoch: int | None = None, stage=None,
             base_lr: float | None = None, model: ModelView = ModelView()) -> StepCtx:
    """The ctx a slot sees inside a step (``step`` traced as int32), with this run's static facts."""
    return StepCtx(step=jnp.asarray(step, jnp.int32), key=jax.random.PRNGKey(0) if key is None else key,
                   stage=stage, run=RunInfo(total_steps, steps_per_epoch, base_lr), model=model)


def make_batch(key, batch_size: int = 4) -> dict:
    """Image-like NHWC inputs in [0, 1) and integer labels."""
    kx, ky = jax.random.split(key)
    return {"input": jax.random.uniform(kx, (batch_size,) + IMAGE_SHAPE),
            "target": jax.random.randint(ky, (batch_size,), 0, NUM_CLASSES)}


def init_model(key):
    """A linear classifier on globally pooled features (so any image size works: ProgressiveResizing) with a
    BatchNorm-like running mean and an integer counter as model state."""
    d = IMAGE_SHAPE[-1] * 4
    params = {"dense": {"kernel": 0.1 * jax.random.normal(key, (d, NUM_CLASSES)),
                        "bias": jnp.zeros((NUM_CLASSES,))}}
    state = {"mean": jnp.zeros((NUM_CLASSES,)), "count": jnp.zeros((), jnp.int32)}
    return params, state


def _features(x):
    # mean and max over space per channel, first and second half of rows: (B, 4C), independent of H and W
    half = max(x.shape[1] // 2, 1)
    parts = [x[:, :half].mean((1, 2)), x[:, half:].mean((1, 2)) if x.shape[1] > 1 else x.mean((1, 2)),
             x.max((1, 2)), x.min((1, 2))]
    return jnp.concatenate(parts, axis=-1)


def apply_model(params, state, x):
    logits = _features(x) @ params["dense"]["kernel"] + params["dense"]["bias"][None, :]
    new_state = {"mean": 0.9 * state["mean"] + 0.1 * logits.mean(0), "count": state["count"] + 1}
    return logits, new_state


def dummy_step(composed: Composed, tx_for: Callable, carry: dict, batch: dict, step, base_key, *,
               total_steps: int = 10, stage=None) -> tuple[dict, jax.Array]:
    """One pure train step through every in-jit slot, in the trainer's order: batch, loss, grad, tx, post_step.
    ``carry`` = params/state/opt/extras; ``stage`` is ``composed.stage(shapes, ctx)``, static; ``tx_for(ctx)``
    builds the step's optimizer (:func:`make_tx`)."""
    ctx = make_ctx(step, jax.random.fold_in(base_key, step), total_steps=total_steps, stage=stage, base_lr=0.1)
    loss_fn = composed.wrap_loss(lambda outputs, b: soft_cross_entropy(outputs, b["target"]), ctx)

    def per_example_loss(params, state, b, key, *, train=True):
        del key, train  # the dummy model has no dropout and no eval mode
        outputs, new_state = apply_model(params, state, b["input"])
        return loss_fn(outputs, b), new_state

    def objective(params, state, b, key):
        losses, new_state = per_example_loss(params, state, b, key)
        return losses.mean(), new_state

    # as the Trainer's step provides them: the param order (LayerFreezing), per-example losses (SelectiveBackprop)
    ctx = ctx._replace(model=ModelView(param_order=lambda: PARAM_ORDER, per_example_loss=per_example_loss))
    batch = composed.apply_batch(batch, ctx)
    grad_fn = composed.wrap_grad(jax.value_and_grad(objective, has_aux=True), ctx)
    (loss, new_state), grads = grad_fn(carry["params"], carry["state"], batch, jax.random.fold_in(base_key, step))
    updates, opt = tx_for(ctx).update(grads, carry["opt"], carry["params"])
    params = optax.apply_updates(carry["params"], updates)
    extras = composed.update_extras(carry["extras"], params, new_state, ctx)
    return {"params": params, "state": new_state, "opt": opt, "extras": extras}, loss


PARAM_ORDER = (("dense", "kernel"), ("dense", "bias"))  # the dummy model's one layer


def make_tx(composed: Composed, lr: float = 0.1) -> Callable:
    """``tx_for(ctx)``: SGD with a constant schedule through the ``schedule`` and ``tx`` slots, as the Trainer
    builds it for each step (see ``jaxcomposer.trainer.step.make_base_tx``)."""
    return make_base_tx(optax.sgd(lr), lambda step: jnp.ones((), jnp.float32), composed)


def init_carry(composed: Composed, tx_for: Callable, key, *, total_steps: int = 10) -> dict:
    params, state = init_model(key)
    ctx = make_ctx(0, key, total_steps=total_steps, base_lr=0.1,
                   model=ModelView(param_order=lambda: PARAM_ORDER))
    return {"params": params, "state": state, "opt": tx_for(ctx).init(params),
            "extras": composed.init_extras(params, state, ctx)}


def run_steps(composed: Composed, key, total: int = 4, batch_size: int = 8) -> dict:
    """``total`` jitted dummy steps of ``composed`` (long enough for staged methods to change stage), each loss
    checked finite; returns the final carry."""
    import numpy as np

    tx_for = make_tx(composed)
    carry = init_carry(composed, tx_for, key, total_steps=total)
    step = jax.jit(lambda c, b, s, stage: dummy_step(composed, tx_for, c, b, s, key, total_steps=total, stage=stage),
                   static_argnums=3)
    for s in range(total):
        batch = make_batch(jax.random.fold_in(key, s), batch_size=batch_size)
        host = make_ctx(s, total_steps=total)._replace(step=s)
        if composed.has_data:  # host-side data methods work on numpy, before the device
            batch = composed.apply_data({k: np.asarray(v) for k, v in batch.items()}, host, (0, 0, s))
        carry, loss = step(carry, batch, s, composed.stage({k: v.shape for k, v in batch.items()}, host))
        assert np.isfinite(loss), (composed.names, s)
    assert all(np.isfinite(x).all() for x in jax.tree_util.tree_leaves(carry)), composed.names
    return carry

