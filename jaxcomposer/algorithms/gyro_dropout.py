"""GyroDropout.

Method card
-----------
**What it does.** Replaces every dropout layer with a ``GyroDropoutLayer``: instead of a fresh mask per example,
it draws ``sigma`` dropout masks once (each feature kept with probability ``1 - p``) and trains only those
``sigma`` subnetworks. Each training call uses ``tau`` of them: the batch is split into ``tau`` equal contiguous
chunks and chunk ``i`` gets mask ``i``; the ``tau`` masks are re-chosen every ``iter_num`` calls, where
``iter_num = int(iters_per_epoch * max_epoch / sigma) * tau``, so each subnetwork is trained about equally often
over the run. Kept features are scaled by ``1 / (1 - p)``; in eval the layer is the identity.

**When it helps.** Models with dropout on a feature vector (MLP heads, classifier heads after pooling): the paper
reports better accuracy than dropout at the same cost. It needs dropout layers to replace; otherwise it warns.

**Hyperparameters.** ``p`` (default ``0.5``, the drop probability, replacing each layer's own rate), ``sigma``
(default ``256``, masks drawn once), ``tau`` (default ``16``, masks used per call; the batch size must be a
multiple of it).

**Exact Composer semantics.** As ``composer/algorithms/gyro_dropout``: ``sigma`` masks of shape
``(features,)`` with ``features = x.shape[1]`` of a 2-D ``(B, features)`` input, ``keep = uniform > p``; at call
``t`` (counting training calls from 0), when ``t % iter_num == 0``, ``tau`` indices are drawn uniformly *with
replacement* (``np.random.choice(sigma, tau)``); mask ``i`` is repeated ``B // tau`` times along the batch
(``repeat_interleave``); ``out = x * mask * (1 / (1 - p))``. Differences, with the reason:

- randomness comes from the keys the Trainer gives the forward pass, and the layer's bookkeeping (the call
  counter, the key of the ``sigma`` masks, the chosen indices) is model state, checkpointed with the run, so a
  resumed run is bitwise the straight one. Composer keeps it in Python attributes and warns that GyroDropout does
  not resume correctly. The masks are not stored: mask ``i`` is regenerated from the stored key and ``i`` (a
  pure function), so the state's shapes do not depend on the feature count, which a dropout layer does not know.
- ``iter_num`` is at least ``tau`` (``max(int(...), 1) * tau``): Composer's is 0, a division by zero, whenever
  the run is shorter than ``sigma`` iterations.
- the method fills ``iters_per_epoch * max_epoch`` with the run's length in steps (``RunInfo.total_steps``);
  Composer multiplies the epoch length by ``max_duration.value``, which is the number of epochs only when the
  duration is given in epochs.
- a batch that ``tau`` does not divide raises a clear ``ValueError`` at trace time (Composer's
  ``repeat_interleave`` gives a mask of the wrong size, then torch a broadcasting error).
- inputs with more than two axes (a transformer's ``(B, T, D)``) get masks of shape ``x.shape[1:]``, one value
  per element of an example, which is Composer's rule (a mask over everything but the batch axis) where
  Composer's own ``(sigma, x.shape[1])`` masks do not broadcast and raise.

**How it plugs in.** ``model`` slot (host, once, before the optimizer is built): NNX ``nnx.Dropout`` submodules
become :class:`GyroDropoutLayer` (same call signature: ``deterministic``, ``rngs``); torch ``nn.Dropout``
modules become ``torch_bridge.methods.gyro_dropout.GyroDropoutLayer`` (the surgery registered as
``"GyroDropout"``), which keeps the same bookkeeping in buffers (there the ``sigma`` masks themselves, in a lazy
buffer whose width the first call sets: the method runs one eval-mode call on the first batch just before the
bridge exports the module; after the functional form, call the module once before handing it to the bridge).
The exported graph serves any batch size, so a bridged model cannot raise for a batch ``tau`` does not divide: its
row ``r`` uses mask ``floor(r * tau / B)``. The NNX layer needs the dropout key its model passes
(``rngs=key``); a model whose dropout rate is 0 passes none, and the layer then raises. Each training call
advances the layer's counter, so a layer called twice per forward (a shared dropout module) or once per
microbatch advances twice, as Composer's does.

**Reference.** Park et al., "Gyro Dropout: Maximizing Ensemble Effect in Neural Network Training", MLSys 2022.
Composer: ``composer/algorithms/gyro_dropout``.
"""
from __future__ import annotations

import warnings
from typing import Any

import jax
import jax.numpy as jnp
from flax import nnx

from jaxcomposer.errors import NoEffectWarning
from jaxcomposer.algorithms.nnx_surgery import apply_surgery, replace_modules
from jaxcomposer.core.method import Method, MethodEntry

__all__ = ["GyroDropout", "GyroDropoutLayer", "GyroDropoutState", "apply_gyro_dropout", "gyro_iter_num"]


def gyro_iter_num(total_iters: float, sigma: int, tau: int) -> int:
    """Calls between two re-choices of the ``tau`` masks: Composer's ``int(iters_per_epoch * max_epoch / sigma)
    * tau``, at least ``tau`` (Composer's 0 would divide by zero)."""
    return max(int(total_iters / sigma), 1) * tau


class GyroDropoutState(nnx.Variable):
    """GyroDropout's bookkeeping: model state (checkpointed, never trained), like BatchNorm's statistics."""


def _raw_key(rngs: Any) -> jax.Array | None:
    if rngs is None:
        return None
    if isinstance(rngs, nnx.Rngs):
        rngs = rngs.dropout()
    elif isinstance(rngs, nnx.RngStream):
        rngs = rngs()
    if jnp.issubdtype(rngs.dtype, jax.dtypes.prng_key):
        return jax.random.key_data(rngs)
    return rngs


class GyroDropoutLayer(nnx.Module):
    """Gyro dropout on ``(B, features...)`` inputs, called like ``nnx.Dropout`` (``deterministic``, ``rngs``).

    State: ``training_step`` (training calls so far), ``mask_key`` (taken from the first training call's key; mask
    ``i`` is ``uniform(fold_in(mask_key, i), x.shape[1:]) > p``) and ``picked`` (the ``tau`` mask indices in use).
    """

    def __init__(self, iters_per_epoch: float, max_epoch: float, p: float = 0.5, sigma: int = 256, tau: int = 16,
                 *, deterministic: bool | None = False):
        self.p, self.sigma, self.tau = float(p), int(sigma), int(tau)
        self.iter_num = gyro_iter_num(iters_per_epoch * max_epoch, self.sigma, self.tau)
        self.deterministic = deterministic
        key_shape = jax.random.key_data(jax.random.key(0)).shape
        self.training_step = GyroDropoutState(jnp.zeros((), jnp.int32))
        self.mask_key = GyroDropoutState(jnp.zeros(key_shape, jnp.uint32))
        self.picked = GyroDropoutState(jnp.zeros((self.tau,), jnp.int32))

    def masks(self, mask_key: jax.Array, indices: jax.Array, features: int | tuple[int, ...]) -> jax.Array:
        """Masks ``indices`` of the ``sigma`` (float32 0/1, shape ``(len(indices), *features)``)."""
        shape = (features,) if isinstance(features, int) else tuple(features)
        return jax.vmap(lambda i: jax.random.uniform(jax.random.fold_in(mask_key, i), shape) > self.p)(
            indices).astype(jnp.float32)

    def __call__(self, inputs: jax.Array, *, deterministic: bool | None = None, rngs: Any = None) -> jax.Array:
        deterministic = self.deterministic if deterministic is None else deterministic
        if deterministic:
            return inputs
        key = _raw_key(rngs)
        if key is None:
            raise ValueError("GyroDropoutLayer: a training call needs a PRNG key (rngs=key); the model passed none "
                             "(a model with dropout rate 0 passes no dropout key).")
        if inputs.ndim < 2:
            raise ValueError(f"GyroDropoutLayer: expects (batch, features, ...) inputs, got shape {inputs.shape}.")
        batch, features = inputs.shape[0], inputs.shape[1:]
        if batch % self.tau:
            raise ValueError(f"GyroDropoutLayer: the batch ({batch}) must be a multiple of tau={self.tau}: it is "
                             f"split into tau equal chunks, one mask each.")
        step = self.training_step[...]
        mask_key = jnp.where(step == 0, jax.random.fold_in(key, 0), self.mask_key[...])
        fresh = jax.random.randint(jax.random.fold_in(key, 1), (self.tau,), 0, self.sigma, jnp.int32)
        picked = jnp.where(step % self.iter_num == 0, fresh, self.picked[...])
        mask = jnp.repeat(self.masks(mask_key, picked, features), batch // self.tau, axis=0)
        self.training_step[...] = step + 1
        self.mask_key[...] = mask_key
        self.picked[...] = picked
        return inputs * mask.astype(inputs.dtype) * (1 / (1 - self.p))


def _apply_nnx(model: nnx.Module, total_iters: float, p: float, sigma: int, tau: int, inplace: bool):
    new = model if inplace else nnx.clone(model)
    # a dropout shared by two parents stays one (shared) layer
    n = replace_modules(new, lambda m: isinstance(m, nnx.Dropout), lambda dropout, i: GyroDropoutLayer(
        total_iters, 1, p, sigma, tau, deterministic=dropout.deterministic))
    return new, n


def _validate(where: str, p: float, sigma: int, tau: int) -> None:
    if not 0.0 <= p < 1.0:
        raise ValueError(f"{where}: p must be in [0, 1) (kept features are scaled by 1 / (1 - p)), got {p}.")
    for name, v in (("sigma", sigma), ("tau", tau)):
        if isinstance(v, bool) or int(v) != v or v < 1:
            raise ValueError(f"{where}: {name} must be a positive integer, got {v!r}.")


def apply_gyro_dropout(model: Any, iters_per_epoch: int, max_epoch: int, p: float, sigma: int, tau: int, *,
                       inplace: bool | None = None):
    """Composer's ``apply_gyro_dropout(model, iters_per_epoch, max_epoch, p, sigma, tau)``.

    A torch module is edited in place (Composer returns None; this returns the module). An NNX module is cloned
    and the new model returned unless ``inplace=True``. Warns with :class:`NoEffectWarning` when the model has no
    dropout layer.
    """
    _validate("apply_gyro_dropout", p, sigma, tau)
    if iters_per_epoch <= 0 or max_epoch <= 0:
        raise ValueError(f"apply_gyro_dropout: iters_per_epoch and max_epoch must be positive, got "
                         f"{iters_per_epoch} and {max_epoch}.")
    new, _ = _apply_and_warn(model, iters_per_epoch * max_epoch, p, sigma, tau, bool(inplace))
    return new


def _apply_and_warn(model: Any, total_iters: float, p: float, sigma: int, tau: int, inplace: bool):
    """``(model or its clone, prepare)``: ``prepare(model, example_inputs)`` must run before a torch model is
    exported (its layers learn their width from a first call); None for NNX models."""
    p, sigma, tau = float(p), int(sigma), int(tau)
    new, n, prepare = apply_surgery(
        "GyroDropout", model, lambda m: (*_apply_nnx(m, total_iters, p, sigma, tau, inplace), None),
        who="apply_gyro_dropout", total_iters=total_iters, p=p, sigma=sigma, tau=tau)
    if n == 0:
        warnings.warn(NoEffectWarning(f"GyroDropout: no dropout layers (nnx.Dropout / torch.nn.Dropout) were found "
                                      f"in {type(model).__name__}, so there were no modules to replace."),
                      stacklevel=3)
    return new, prepare


def _prepare_on_bind(task, prepare):
    """The task binds (exports) its torch module to the first batch; the layers' widths are set just before."""
    bind = task.bind

    def bind_prepared(batch):
        if not task.is_bound:
            prepare(task.source, task.model_inputs(batch))
        return bind(batch)

    task.bind = bind_prepared
    return task


def GyroDropout(p: float = 0.5, sigma: int = 256, tau: int = 16) -> Method:
    """Composer's ``GyroDropout(p=0.5, sigma=256, tau=16)`` as a :class:`Method` (``model`` slot). The run's
    length in steps stands for Composer's ``iters_per_epoch * max_epoch``."""
    _validate("GyroDropout", p, sigma, tau)

    def model_fn(task, ctx):  # in place, as Composer: the module the user passed is the trained one
        new, prepare = _apply_and_warn(task.source, ctx.run.total_steps, p, sigma, tau, inplace=True)
        new_task = task.with_model(new)
        return new_task if prepare is None else _prepare_on_bind(new_task, prepare)

    return Method(name="GyroDropout", model=model_fn, description=f"GyroDropout(p={p}, sigma={sigma}, tau={tau})")


ENTRY = MethodEntry(registry_name="gyro_dropout", factory=GyroDropout, functional=(apply_gyro_dropout,))
