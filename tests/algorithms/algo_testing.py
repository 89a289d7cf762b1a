"""Shared helpers for the per-method tests (DESIGN §7).

``EXAMPLE_METHODS`` builds one representative configuration of each method: the pairwise composition test uses it
now, and the trainer tests (items 3-4: two steps in the Trainer, resume equality) can parametrize over it later.
``dummy_step`` is a minimal pure train step that touches every slot a method can fill.
"""
from __future__ import annotations

import jax
import jax.numpy as jnp
import optax

from jaxcomposer import algorithms
from jaxcomposer.core.method import Composed, RunInfo, StepCtx
from jaxcomposer.core.model import soft_cross_entropy
from jaxcomposer.data import DIGITS_MEAN, DIGITS_STD

NUM_CLASSES = 5
IMAGE_SHAPE = (8, 8, 3)  # NHWC without the batch axis

# name -> zero-argument factory; small half-life and threshold so the effects show within a few steps.
EXAMPLE_METHODS = {
    "LabelSmoothing": lambda: algorithms.LabelSmoothing(smoothing=0.1),
    "MixUp": lambda: algorithms.MixUp(alpha=0.2),
    "CutOut": lambda: algorithms.CutOut(num_holes=1, length=0.5),
    "CutMix": lambda: algorithms.CutMix(alpha=1.0),
    # 8x8 images shrink to 6x6: image models only (an MLP's fixed fan-in rejects them)
    "ColOut": lambda: algorithms.ColOut(p_row=0.15, p_col=0.15),
    "GradientClipping": lambda: algorithms.GradientClipping(clipping_type="norm", clipping_threshold=0.1),
    "EMA": lambda: algorithms.EMA(half_life="2ba"),
    # min_channels=1: the contract tests' ResNetCIFAR(width=4) has only 4- and 8-channel strided convs
    "BlurPool": lambda: algorithms.BlurPool(min_channels=1),
    # host-side (data slot); the contract tests feed digits normalized with these statistics
    "RandAugment": lambda: algorithms.RandAugment(severity=9, depth=2, mean=DIGITS_MEAN, std=DIGITS_STD),
    "AugMix": lambda: algorithms.AugMix(severity=3, depth=-1, width=3, alpha=1.0, mean=DIGITS_MEAN, std=DIGITS_STD),
    # start=0, end=1, interrupt=0: selects on every step (interrupt=1 would never select)
    "SelectiveBackprop": lambda: algorithms.SelectiveBackprop(start=0.0, end=1.0, keep=0.5, interrupt=0),
    # interval=2: a plain step, then a SAM step, so two Trainer steps cover both branches
    "SAM": lambda: algorithms.SAM(rho=0.5, interval=2),
    # per-batch recomputation from the start: in the contract ResNet, 9 of 19 layers freeze for the 2nd step
    "LayerFreezing": lambda: algorithms.LayerFreezing(freeze_start=0.0, freeze_level=1.0, update_interval="1ba"),
    # sample every batch from the start; the params become the average at the last step (0.9dur of 2 or 4
    # steps); SWALR anneals the LR over the first 2 samples
    "SWA": lambda: algorithms.SWA(swa_start="0.0dur", swa_end="0.9dur", update_interval="1ba",
                                  schedule_swa_lr=True, anneal_steps=2, swa_lr=0.05),
    # 8x8 images at scale 0.5 (4x4) while t < 0.5: one size over 2 steps, full size at step 3 of 4. image_size pins
    # sizes while the stage is not given the batch's shapes. Image models only (an MLP's fixed fan-in rejects them)
    "ProgressiveResizing": lambda: algorithms.ProgressiveResizing(initial_scale=0.5),
    # truncates image rows (the composition check's model pools over space), so its changing shapes meet every
    # other method: length 6 over 2 steps (a warmup under one batch starts at max), 4 then 6 over 4 steps. Image
    # models only, like ColOut; the causal-LM trainer tests are in test_seq_length_warmup.py
    "SeqLengthWarmup": lambda: algorithms.SeqLengthWarmup(duration=0.25, min_seq_length=4, max_seq_length=6,
                                                          step_size=2, sequence_keys=("input",)),
}


def make_ctx(step, key=None, *, total_steps: int = 10, steps_per_epoch: int | None = None) -> StepCtx:
    step = jnp.asarray(step, jnp.int32)
    return StepCtx(step=step, progress=step.astype(jnp.float32) / total_steps,
                   key=jax.random.PRNGKey(0) if key is None else key, total_steps=total_steps,
                   steps_per_epoch=steps_per_epoch)


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


def dummy_step(composed: Composed, tx: optax.GradientTransformation, carry: dict, batch: dict, step,
               base_key, *, total_steps: int = 10, stage=None) -> tuple[dict, jax.Array]:
    """One pure train step through every in-jit slot: batch, loss, grad, tx, post_step (the trainer's order).
    ``carry`` = params/state/opt/extras; ``stage`` is ``composed.stage(step, total_steps)``, static."""
    ctx = make_ctx(step, total_steps=total_steps)._replace(stage=stage)
    batch = composed.apply_batch(batch, ctx, base_key)
    loss_fn = composed.wrap_loss(lambda outputs, b: soft_cross_entropy(outputs, b["target"]))

    def per_example_loss(params, state, b, key, *, train=True):
        del key, train  # the dummy model has no dropout and no eval mode
        outputs, new_state = apply_model(params, state, b["input"])
        return loss_fn(outputs, b), new_state

    def objective(params, state, b, key):
        losses, new_state = per_example_loss(params, state, b, key)
        return losses.mean(), new_state

    ctx = ctx._replace(per_example_loss=per_example_loss)  # as the Trainer's step provides it (SelectiveBackprop)
    grad_fn = composed.wrap_grad(jax.value_and_grad(objective, has_aux=True), ctx, base_key)
    (loss, new_state), grads = grad_fn(carry["params"], carry["state"], batch, jax.random.fold_in(base_key, step))
    updates, opt = tx.update(grads, carry["opt"], carry["params"])
    params = optax.apply_updates(carry["params"], updates)
    extras = composed.update_extras(carry["extras"], params, new_state, ctx, base_key)
    return {"params": params, "state": new_state, "opt": opt, "extras": extras}, loss


def make_tx(composed: Composed, total_steps: int = 10, lr: float = 0.1) -> optax.GradientTransformation:
    """SGD with a constant schedule, through the ``schedule`` and ``tx`` slots as the Trainer builds it."""
    info = RunInfo(total_steps=total_steps, steps_per_epoch=None, base_lr=lr)
    alpha = composed.wrap_schedule(lambda step: jnp.ones((), jnp.float32), info)
    return composed.wrap_tx(optax.chain(optax.sgd(lr), optax.scale_by_schedule(alpha)), info)


def init_carry(composed: Composed, tx: optax.GradientTransformation, key) -> dict:
    params, state = init_model(key)
    return {"params": params, "state": state, "opt": tx.init(params), "extras": composed.init_extras(params, state)}


def check_composes_with(name: str, other: str, key) -> None:
    """DESIGN §7 item 5 for the ordered pair ``[name, other]``; each method's file checks it listed first, so
    both orders are covered across the files. A method paired with itself must be rejected as a duplicate."""
    import numpy as np
    import pytest

    from jaxcomposer.core.method import compose

    if name == other:
        with pytest.raises(ValueError, match="more than once"):
            compose([EXAMPLE_METHODS[name](), EXAMPLE_METHODS[name]()])
        return
    first, second = EXAMPLE_METHODS[name](), EXAMPLE_METHODS[other]()
    if first.interpolates_targets and second.interpolates_targets:  # MixUp + CutMix: a documented conflict
        from jaxcomposer.core.method import MethodConflictError
        with pytest.raises(MethodConflictError, match="interpolate targets"):
            compose([first, second])
        return
    composed = compose([first, second])
    total = 4
    tx = make_tx(composed, total)
    carry = init_carry(composed, tx, key)
    step = jax.jit(lambda c, b, s, stage: dummy_step(composed, tx, c, b, s, key, total_steps=total, stage=stage),
                   static_argnums=3)
    for s in range(total):  # long enough for staged methods (resizing, sequence warmup) to change stage
        batch = make_batch(jax.random.fold_in(key, s), batch_size=8)
        if composed.has_data:  # host-side data methods work on numpy, before the device
            batch = composed.apply_data({k: np.asarray(v) for k, v in batch.items()}, (0, 0, s))
        carry, loss = step(carry, batch, s, composed.stage(s, total, {k: v.shape for k, v in batch.items()}))
        assert np.isfinite(loss), (name, other, s)
    assert all(np.isfinite(x).all() for x in jax.tree_util.tree_leaves(carry)), (name, other)
