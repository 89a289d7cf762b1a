"""GhostBatchNorm.

Method card
-----------
**What it does.** Batch normalization whose training-time statistics come from "ghost batches": the batch is
split along axis 0 into ``ceil(B / ghost_batch_size)`` chunks and each chunk is normalized with its own mean and
variance, as if the model were trained with smaller batches. The running statistics are updated once per chunk,
in chunk order, with the update fraction (torch's ``momentum``) divided by the number of chunks, so one step
moves them about as far as one plain BatchNorm update. Evaluation uses the running statistics, as plain
BatchNorm does. Parameters and state are the wrapped BatchNorm's own: nothing is added.

**When it helps.** Large-batch training of CNNs with BatchNorm, where per-batch statistics become too accurate and
the regularizing noise of small batches is lost (Hoffer et al. 2017). Composer reports small accuracy gains on
ResNets; it costs one reduction per chunk. It needs a per-device batch of at least ``ghost_batch_size``.

**Hyperparameters.** ``ghost_batch_size`` (default ``32``): the number of examples per ghost batch.

**Exact Composer semantics.** As ``composer/algorithms/ghost_batchnorm``: chunks are ``torch.chunk(x,
ceil(B / g), 0)``, which makes chunks of ``ceil(B / ceil(B / g))`` rows and a smaller last one (for an integer
``g`` always exactly ``ceil(B / g)`` chunks); momentum is divided by that number of chunks; a training batch
smaller than ``ghost_batch_size`` raises ``ValueError``. Running statistics therefore are, per chunk
``k`` in order, ``r <- (1 - m/n) r + (m/n) stat_k`` with torch's ``m`` (= ``1 - momentum`` of flax). The
variance that goes into the running variance follows each framework's own BatchNorm: torch (the torch surgery in
:mod:`torch_bridge.methods.ghost_batchnorm`, and a bridged torch model) uses the *unbiased* chunk variance, as
``nn.BatchNorm2d`` does; the NNX version reuses ``nnx.BatchNorm`` per chunk, so it keeps flax's convention, the
*biased* chunk variance (flax's ``use_fast_variance`` formula, exactly what ``nnx.BatchNorm`` stores). The
normalized outputs are the same in both (both normalize with the biased variance). Deviations: (1) in evaluation
(``use_running_average=True`` / ``module.eval()``) the chunking has no effect, so no chunking is done and a batch
smaller than ``ghost_batch_size`` is allowed (Composer raises even in eval, which would break a small last
evaluation batch); (2) the functional forms return the model (Composer's returns ``None``). The batch axis must be
axis 0 and must not be a feature axis of the BatchNorm; otherwise surgery raises.

**How it plugs in.** ``model`` slot, ``model(task, ctx) -> task`` (host, once, before the optimizer is built). An
NNX model has its ``nnx.BatchNorm`` submodules wrapped (in place in the Trainer; the functional clones unless
``inplace=True``) in :class:`GhostBatchNormModule`; parameter and state paths gain a ``batchnorm`` segment
(``stem_bn/batchnorm/scale``; torch: ``bn.batchnorm.weight``, as Composer), so checkpoints of the surgered model
need GhostBatchNorm in the recipe (Composer's ``required_on_load``). A torch model is surgered before export by the
function torch_bridge registers under ``"GhostBatchNorm"`` (``nn.BatchNorm1d/2d/3d`` -> ``GhostBatchNorm1d/2d/3d``).
The running statistics are model state (``nnx.BatchStat``; torch buffers), so they are checkpointed and resume
bitwise. The bridge exports with a symbolic batch size, which the chunking cannot be written in, so while
``torch.export`` traces, the torch layer emits one custom op (``jaxcomposer::ghost_batch_norm``) whose JAX lowering
(registered by the torch surgery module) chunks with the concrete batch size and runs the bridge's own BatchNorm
lowering per chunk: a bridged model computes what the eager torch layer computes.

**Reference.** Hoffer, Hubara, Soudry, "Train longer, generalize better: closing the generalization gap in large
batch training of neural networks", NeurIPS 2017 (arXiv:1705.08741). Composer: ``composer/algorithms/ghost_batchnorm``.
"""
from __future__ import annotations

import math
import warnings
from typing import Any

import jax
import jax.numpy as jnp
from flax import nnx

from jaxcomposer.errors import NoEffectWarning
from jaxcomposer.algorithms.functional_io import optimizers_follow
from jaxcomposer.algorithms.nnx_surgery import apply_surgery, replace_modules
from jaxcomposer.core.method import Method, MethodEntry
from jaxcomposer.models.norms import with_cheap_stat_writes

__all__ = ["GhostBatchNorm", "GhostBatchNormModule", "apply_ghost_batchnorm", "ghost_chunk_sizes"]


def ghost_chunk_sizes(batch_size: int, ghost_batch_size: int) -> tuple[int, tuple[int, ...]]:
    """``(n_asked, sizes)``: the number of chunks Composer asks ``torch.chunk`` for (``ceil(B / g)``, which scales
    the momentum) and the sizes of the chunks ``torch.chunk`` makes (``ceil(B / n)`` each, the last one smaller)."""
    n_asked = math.ceil(batch_size / ghost_batch_size)
    size = math.ceil(batch_size / n_asked)
    sizes = tuple(min(size, batch_size - start) for start in range(0, batch_size, size))
    return n_asked, sizes


def _check_ghost_batch_size(ghost_batch_size: Any, where: str) -> int:
    if isinstance(ghost_batch_size, bool) or int(ghost_batch_size) != ghost_batch_size or ghost_batch_size < 1:
        raise ValueError(f"{where}: ghost_batch_size must be a positive integer, got {ghost_batch_size!r}.")
    return int(ghost_batch_size)


class GhostBatchNormModule(nnx.Module):
    """An ``nnx.BatchNorm`` applied to ghost batches in training: the NNX counterpart of Composer's
    ``_GhostBatchNorm`` (``GhostBatchNorm2d`` etc.). The wrapped BatchNorm keeps its parameters and running stats.

    Each chunk calls the wrapped BatchNorm itself with its update fraction ``1 - momentum`` divided by the number
    of chunks asked for, so everything else (dtype promotion, epsilon, masks, flax's variance) is flax's own.
    """

    def __init__(self, batchnorm: nnx.BatchNorm, ghost_batch_size: int = 32):
        axes = (batchnorm.axis,) if isinstance(batchnorm.axis, int) else tuple(batchnorm.axis)
        if any(a == 0 for a in axes):
            raise ValueError(f"GhostBatchNorm: the batch axis (0) is a feature axis of this BatchNorm "
                             f"(axis={batchnorm.axis}); ghost batches split axis 0.")
        self.ghost_batch_size = _check_ghost_batch_size(ghost_batch_size, "GhostBatchNorm")
        # one running-stat write per chunk: without cheap writes the trace grows quadratically in chunks
        self.batchnorm = with_cheap_stat_writes(batchnorm)

    def __call__(self, x: jax.Array, use_running_average: bool | None = None, *,
                 mask: jax.Array | None = None) -> jax.Array:
        bn = self.batchnorm
        ura = bn.use_running_average if use_running_average is None else use_running_average
        if ura:  # running statistics: chunking changes nothing (see the method card's deviations)
            return bn(x, use_running_average=True, mask=mask)
        batch_size = x.shape[0]
        if batch_size < self.ghost_batch_size:
            raise ValueError(f"GhostBatchNorm: worker batch size {batch_size} < ghost_batch_size "
                             f"{self.ghost_batch_size}.")
        n_asked, sizes = ghost_chunk_sizes(batch_size, self.ghost_batch_size)
        momentum = bn.momentum
        # flax's update is ``momentum * r + (1 - momentum) * stat``: torch's momentum is ``1 - momentum``.
        bn.momentum = 1.0 - (1.0 - momentum) / n_asked
        try:
            outs, start = [], 0
            for size in sizes:
                chunk_mask = None if mask is None else jax.lax.slice_in_dim(mask, start, start + size, axis=0)
                outs.append(bn(jax.lax.slice_in_dim(x, start, start + size, axis=0), use_running_average=False,
                               mask=chunk_mask))
                start += size
        finally:
            bn.momentum = momentum  # a static attribute: restored before the graph is split again
        return outs[0] if len(outs) == 1 else jnp.concatenate(outs, axis=0)


def _apply_nnx(model: nnx.Module, ghost_batch_size: int, inplace: bool) -> tuple[nnx.Module, int]:
    new = model if inplace else nnx.clone(model)
    # a BatchNorm shared by two parents gets one wrapper; every wrapper is built (and checked) before the first edit
    replace_modules(new, lambda m: isinstance(m, nnx.BatchNorm),
                    lambda bn, i: GhostBatchNormModule(bn, ghost_batch_size), skip=(GhostBatchNormModule,))
    return new, sum(isinstance(m, GhostBatchNormModule) for _, m in nnx.iter_graph(new))


def apply_ghost_batchnorm(model: Any, ghost_batch_size: int = 32, optimizers: Any = None, *,
                          inplace: bool | None = None):
    """Composer's ``apply_ghost_batchnorm(model, ghost_batch_size=32, optimizers=None)``; a torch optimizer given
    as ``optimizers`` holds the new layers' parameters afterwards, as in Composer.

    A torch module is edited in place and returned (Composer returns ``None``); a Flax NNX module is cloned and the
    new model returned unless ``inplace=True``. Warns with :class:`NoEffectWarning` when the result has no ghost
    BatchNorm layer.
    """
    ghost_batch_size = _check_ghost_batch_size(ghost_batch_size, "apply_ghost_batchnorm")
    with optimizers_follow(model, optimizers, "apply_ghost_batchnorm"):
        new, count = apply_surgery("GhostBatchNorm", model, lambda m: _apply_nnx(m, ghost_batch_size, bool(inplace)),
                                   who="apply_ghost_batchnorm", ghost_batch_size=ghost_batch_size)
    if count == 0:
        warnings.warn(NoEffectWarning(f"GhostBatchNorm did not change any layers of {type(model).__name__}: no "
                                      f"BatchNorm layer was found."), stacklevel=2)
    return new


def GhostBatchNorm(ghost_batch_size: int = 32) -> Method:
    """Composer's ``GhostBatchNorm(ghost_batch_size=32)`` as a :class:`Method` (``model`` slot)."""
    ghost_batch_size = _check_ghost_batch_size(ghost_batch_size, "GhostBatchNorm")

    def model_fn(task, ctx):  # in place, as Composer: the module the user passed is the trained one
        new = apply_ghost_batchnorm(task.source, ghost_batch_size, inplace=True)
        return task.with_model(new)

    return Method(name="GhostBatchNorm", model=model_fn,
                  description=f"GhostBatchNorm(ghost_batch_size={ghost_batch_size})")


ENTRY = MethodEntry(registry_name="ghost_batchnorm", factory=GhostBatchNorm, functional=(apply_ghost_batchnorm,))
