"""The pure train and eval steps. Everything a method does inside a step is composed here, at trace time.

Order inside one train step (Composer's in-step events, as slots):
  batch slots (AFTER_DATALOADER/BEFORE_FORWARD) -> forward -> loss wrappers (BEFORE/AFTER_LOSS) -> grad wrappers
  around gradient accumulation (BACKWARD) -> tx wrappers + optimizer (AFTER_TRAIN_BATCH, step) -> post_step (BATCH_END).
Every slot gets the step's one ``StepCtx`` (docs/design.md, "The train step").
"""
from __future__ import annotations

from typing import Any, Callable, Mapping

import jax
import jax.numpy as jnp
import optax
from jaxcomposer import parallel
from jaxcomposer.core.method import Composed, ModelView, RunInfo, StepCtx
from jaxcomposer.core.model import param_path
from jaxcomposer.core.state import TrainState, tree_select
from jaxcomposer.metrics.base import Metric, batch_states

_FORWARD_KEY = 0x5EED  # fold-in tag for the model's own randomness (dropout), distinct from method keys


def cast_floating(tree, dtype):
    return jax.tree.map(lambda x: x.astype(dtype) if jnp.issubdtype(x.dtype, jnp.floating) else x, tree)


def make_forward(task, precision: str) -> Callable:
    """``forward(params, model_state, batch, *, train, key)`` with AMP: fp32 master weights, bf16 compute,
    fp32 outputs (so losses and metrics are reduced in fp32)."""
    if precision == "fp32":
        return task.forward

    def forward(params, model_state, batch, *, train, key):
        outputs, new_state = task.forward(cast_floating(params, jnp.bfloat16), model_state,
                                          cast_floating(batch, jnp.bfloat16), train=train, key=key)
        return cast_floating(outputs, jnp.float32), new_state

    return forward


def make_per_example_loss(task, loss_fn: Callable, precision: str,
                          microbatch_transform: Callable | None = None) -> Callable:
    """``per_example_loss(params, model_state, batch, key, *, train=True) -> (losses (B,), new_model_state)``:
    the forward and loss that ``grad_fn`` differentiates, exposed (as ``StepCtx.per_example_loss``) for grad
    wrappers that score examples without a gradient. ``microbatch_transform`` (``DataSpec.microbatch_transforms``)
    runs first, on each microbatch gradient accumulation hands in."""
    forward = make_forward(task, precision)

    def per_example_loss(params, model_state, batch, key, *, train=True):
        if microbatch_transform is not None:
            batch = microbatch_transform(batch)
        outputs, new_state = forward(params, model_state, batch, train=train, key=key)
        return loss_fn(outputs, batch), new_state

    return per_example_loss


def make_grad_fn(task, loss_fn: Callable, precision: str, microbatch_transform: Callable | None = None) -> Callable:
    """``grad_fn(params, model_state, batch, key) -> ((mean_loss, new_model_state), grads)``."""
    per_example_loss = make_per_example_loss(task, loss_fn, precision, microbatch_transform)

    def mean_loss(params, model_state, batch, key):
        losses, new_state = per_example_loss(params, model_state, batch, key)
        return losses.mean(), new_state

    return jax.value_and_grad(mean_loss, has_aux=True)


def accumulate_gradients(grad_fn: Callable, num_microbatches: int, data_sharding=None) -> Callable:
    """Gradient accumulation as a wrapper (levanter's shape): the update equals the full-batch update.

    Microbatch ``i`` takes examples ``i, i+n, i+2n, ...``: a strided split keeps every microbatch spread over the
    data axis, where a contiguous split would put each microbatch on one device. Each microbatch's mean loss is
    weighted by ``1/n``, so the summed gradient is the gradient of the full-batch mean loss. Model state
    (BatchNorm statistics) threads through the microbatches in order, as in Composer.
    """
    if num_microbatches == 1:
        return grad_fn
    n = num_microbatches

    def split(x):
        if x.shape[0] % n:  # e.g. SelectiveBackprop kept a count that n microbatches cannot share
            raise ValueError(f"gradient accumulation: a batch of {x.shape[0]} examples does not split into {n} "
                             "microbatches; choose device_train_microbatch_size so the (selected) batch divides")
        x = x.reshape((x.shape[0] // n, n) + x.shape[1:]).swapaxes(0, 1)
        if data_sharding is not None:
            x = jax.lax.with_sharding_constraint(x, data_sharding)
        return x

    def accumulated(params, model_state, batch, key):
        micro = jax.tree.map(split, batch)

        def body(carry, xs):
            loss_sum, grad_sum, state = carry
            i, mb = xs
            (loss, state), grads = grad_fn(params, state, mb, jax.random.fold_in(key, i))
            grad_sum = jax.tree.map(lambda a, g: a + g / n, grad_sum, grads)
            return (loss_sum + loss / n, grad_sum, state), None

        zeros = jax.tree.map(jnp.zeros_like, params)
        (loss, grads, state), _ = jax.lax.scan(body, (jnp.zeros((), jnp.float32), zeros, model_state),
                                               (jnp.arange(n), micro))
        return (loss, state), grads

    return accumulated


def make_base_tx(base: optax.GradientTransformation, alpha: Callable, composed: Composed) -> Callable:
    """``build_tx(ctx) -> tx``: the optimizer chain for one step, built from that step's ctx.

    The LR multiplier is ``alpha(ctx.step)`` after the ``schedule`` wrappers, and the ``tx`` wrappers see the same
    ctx, so the schedule and every optimizer wrapper read the one clock. Built once with the step-0 ctx for
    ``init`` (the state's structure does not depend on the step), then inside every traced step."""

    def build_tx(ctx: StepCtx, host_lr=1.0) -> optax.GradientTransformation:
        # host_lr: the product of Composer-style function schedulers, computed on the host for this step
        multiplier = composed.wrap_schedule(alpha, ctx)(ctx.step) * host_lr
        return composed.wrap_tx(optax.chain(base, optax.scale(multiplier)), ctx)

    return build_tx


def make_train_step(task, build_tx: Callable, composed: Composed, run: RunInfo, *, precision: str = "fp32",
                    num_microbatches: int = 1, mesh=None, grad_shardings: Any = None,
                    model_view: ModelView = ModelView(), batch_transform: Callable | None = None,
                    microbatch_transform: Callable | None = None, layer_norms: bool = False,
                    train_metrics: Mapping[str, Metric] | None = None) -> Callable:
    """``train_step(state, batch, stage, host_lr, host) -> (state, metrics)``, pure; the caller jits it (see
    ``jit_train_step``). ``host_lr`` multiplies the LR (function schedulers evaluated on the host; 1.0 without).
    ``host`` is ``{method name: values computed on the host for this step}`` (``StepCtx.host``; None without); what
    methods ``emit`` comes back as ``metrics['logs']``.

    ``build_tx(ctx)`` builds the step's optimizer (:func:`make_base_tx`); ``model_view`` is what the methods see of
    the model (its memoized param order and its layout; the step adds ``per_example_loss``). ``grad_shardings``
    (``jaxcomposer.parallel.train_state_shardings``) lays the gradients out as the optimizer state is: under FSDP
    the data-parallel sum becomes a reduce-scatter, and each device updates only its shard.
    ``batch_transform`` and ``microbatch_transform`` are a ``DataSpec``'s: the first runs on the batch before the
    methods' batch slots, the second on each microbatch before the forward. ``layer_norms`` adds each parameter's
    gradient, weight and update L2 norms to the metrics (``metrics['layer_norms'][kind][name]``, named by
    ``task.user_param_name``), for Composer's ``OptimizerMonitor``; off, the step computes none of them.
    ``train_metrics`` (Composer's ``compute_training_metrics``): each metric's sums over this batch
    (``metrics['train_metrics']``), from a forward without gradient in train mode, with the step's key and the
    weights before the update, on the batch as the methods left it."""
    data_sharding = parallel.batch_sharding(mesh, leading=1) if mesh is not None else None

    def train_step(state: TrainState, batch: dict, stage=None, host_lr=1.0, host=None):
        logs: dict = {}  # what the methods emit in this trace, returned as metrics['logs']
        ctx = StepCtx(step=state.step, key=jax.random.fold_in(state.key, state.step), stage=stage, run=run,
                      model=model_view, host=host, emit=logs.__setitem__)
        loss_fn = composed.wrap_loss(task.loss, ctx)
        per_example_loss = make_per_example_loss(task, loss_fn, precision, microbatch_transform)
        ctx = ctx._replace(model=ctx.model._replace(per_example_loss=per_example_loss))
        grad_fn = accumulate_gradients(make_grad_fn(task, loss_fn, precision, microbatch_transform),
                                       num_microbatches, data_sharding)
        if batch_transform is not None:
            batch = batch_transform(dict(batch))
        batch = composed.apply_batch(dict(batch), ctx)
        forward_key = jax.random.fold_in(ctx.key, _FORWARD_KEY)
        (loss, model_state), grads = composed.wrap_grad(grad_fn, ctx)(
            state.params, state.model_state, batch, forward_key)
        if grad_shardings is not None:
            grads = jax.lax.with_sharding_constraint(grads, grad_shardings)
        updates, opt_state = build_tx(ctx, host_lr).update(grads, state.opt_state, state.params)
        params = optax.apply_updates(state.params, updates)
        extras = composed.update_extras(state.extras, params, model_state, ctx)
        grad_norm = optax.tree.norm(grads)
        # A non-finite loss or gradient never reaches the state: the step keeps the old params, optimizer and
        # method state (the host then raises or counts the skip). Unlike optax.apply_if_finite, there is no
        # "apply anyway" after N failures. The clock still advances (the batch was consumed), and since every
        # method and the schedule read the clock, none of them disagrees about the step afterwards.
        finite = jnp.isfinite(loss) & jnp.isfinite(grad_norm)
        kept = tree_select(finite, (params, model_state, opt_state, extras),
                           (state.params, state.model_state, state.opt_state, state.extras))
        new_state = TrainState(state.step + 1, *kept, state.key)
        metrics = {"loss": loss, "grad_norm": grad_norm, "finite": finite}
        if logs:
            metrics["logs"] = logs
        if train_metrics:
            metrics["train_metrics"] = _train_metric_sums(task, train_metrics, precision, microbatch_transform,
                                                          state, batch, forward_key)
        if layer_norms:
            metrics["layer_norms"] = {kind: _named_norms(task, tree)
                                      for kind, tree in (("grad", grads), ("param", params), ("update", updates))}
        return new_state, metrics

    return train_step


def _train_metric_sums(task, metrics: Mapping[str, Metric], precision: str, microbatch_transform, state, batch,
                       key) -> dict:
    """Each train metric's sums over the batch: the model's outputs come from one more forward (train mode, the
    step's forward key, no gradient), since the differentiated forward keeps its outputs inside the gradient."""
    if microbatch_transform is not None:
        batch = microbatch_transform(batch)
    params, model_state = jax.lax.stop_gradient((state.params, state.model_state))
    outputs, _ = make_forward(task, precision)(params, model_state, batch, train=True, key=key)
    preds, target = task.metric_inputs(outputs, batch)
    n = jax.tree_util.tree_leaves(target)[0].shape[0]
    return batch_states(metrics, preds, target, jnp.ones((n,), jnp.float32))


def _named_norms(task, tree) -> dict[str, jax.Array]:
    """Each leaf's L2 norm by the parameter's name as the user's model names it (trace time: the names cost
    nothing in the step)."""
    return {task.user_param_name(".".join(param_path(path))): jnp.sqrt(jnp.sum(jnp.square(leaf.astype(jnp.float32))))
            for path, leaf in jax.tree_util.tree_flatten_with_path(tree)[0]}


def make_eval_step(task, composed: Composed, run: RunInfo, metrics: Mapping[str, Metric], *,
                   precision: str = "fp32", batch_transform: Callable | None = None) -> Callable:
    """``eval_step(state, batch, mask) -> {metric name: this batch's sums}``: padded examples (mask 0) count for
    nothing and the batches' sums add up exactly (``jaxcomposer.metrics.base``). Methods with an ``eval`` slot
    (EMA) choose the weights; ``batch_transform`` (a ``DataSpec``'s) runs on the batch first."""
    forward = make_forward(task, precision)

    def eval_step(state: TrainState, batch: dict, mask: jax.Array):
        if batch_transform is not None:
            batch = batch_transform(dict(batch))
        params, model_state = eval_weights(composed, state, run)
        outputs, _ = forward(params, model_state, batch, train=False, key=None)
        preds, target = task.metric_inputs(outputs, batch)
        return batch_states(metrics, preds, target, mask)

    return eval_step


def make_predict_step(task, composed: Composed, run: RunInfo, *, precision: str = "fp32",
                      batch_transform: Callable | None = None) -> Callable:
    forward = make_forward(task, precision)

    def predict_step(state: TrainState, batch: dict):
        if batch_transform is not None:
            batch = batch_transform(dict(batch))
        params, model_state = eval_weights(composed, state, run)
        outputs, _ = forward(params, model_state, batch, train=False, key=None)
        return outputs

    return predict_step


def eval_weights(composed: Composed, state: TrainState, run: RunInfo):
    """The params and model state evaluation uses, after the methods' ``eval`` slots (EMA, SWA)."""
    ctx = StepCtx(step=state.step, key=None, run=run)
    return composed.eval_weights(state.extras, state.params, state.model_state, ctx)


def jit_train_step(train_step: Callable, mesh, state_shardings, host_args: int = 1) -> Callable:
    """Jit with the state laid out by ``state_shardings`` (``jaxcomposer.parallel``), the batch split over the
    mesh's batch axes, the ``host_args`` arguments after the static stage replicated, and the old state's buffers
    donated."""
    rep = parallel.replicated(mesh)
    return jax.jit(train_step, in_shardings=(state_shardings, parallel.batch_sharding(mesh)) + (rep,) * host_args,
                   out_shardings=(state_shardings, rep), donate_argnums=0, static_argnums=2)


def make_multi_step(train_step: Callable, k: int) -> Callable:
    """``multi_step(state, batches, stage, count) -> (state, [metrics] * k)``: up to ``k`` train steps in one
    program, a ``lax.scan`` over ``batches`` (a tuple of ``k`` batches of one shape, stacked inside the program) in
    which the first ``count`` steps train and the rest are skipped (``lax.cond``: not computed), so one compiled
    program serves every call, also one cut short at the end of an epoch. Each step is ``train_step`` with its own
    clock and key, so the result is that of ``count`` calls; metrics come back per step, sliced in the program
    (no slicing dispatch on the host); those of skipped steps are zeros."""
    # jitted inside, so that the trace eval_shape makes (for the skipped steps' metrics) is the one the scan reuses:
    # otherwise the first call traces the whole step twice
    step = jax.jit(train_step, static_argnums=2)

    def multi_step(state, batches: tuple, stage, count):
        stacked = jax.tree.map(lambda *xs: jnp.stack(xs), *batches)
        no_metrics = jax.tree.map(lambda m: jnp.zeros(m.shape, m.dtype),
                                  jax.eval_shape(step, state, batches[0], stage)[1])

        def body(s, xs):
            batch, i = xs
            return jax.lax.cond(i < count, lambda s: step(s, batch, stage), lambda s: (s, no_metrics), s)

        state, metrics = jax.lax.scan(body, state, (stacked, jnp.arange(k)))
        return state, [jax.tree.map(lambda m, i=i: m[i], metrics) for i in range(k)]

    return multi_step


def jit_eval_step(eval_step: Callable, mesh, state_shardings) -> Callable:
    data = parallel.batch_sharding(mesh)
    return jax.jit(eval_step, in_shardings=(state_shardings, data, data), out_shardings=parallel.replicated(mesh))


def init_train_state(task, build_tx: Callable, composed: Composed, run: RunInfo, seed: int,
                     model_view: ModelView = ModelView()) -> TrainState:
    """The state before the first step (not yet placed on the mesh); optimizer and method states are built with
    the step-0 ctx."""
    params, model_state = task.params, task.state
    key = jax.random.PRNGKey(seed)
    ctx = StepCtx(step=0, key=jax.random.fold_in(key, 0), run=run, model=model_view)
    return TrainState(step=jnp.zeros((), jnp.int32), params=params, model_state=model_state,
                      opt_state=build_tx(ctx).init(params), extras=composed.init_extras(params, model_state, ctx),
                      key=key)
