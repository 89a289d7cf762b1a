"""The model as the run has trained it so far, for callbacks that hand it to other tools (export, generation).

The Trainer writes its weights into the user's module (``state.model``) at the end of ``fit`` (before FIT_END) and
before ``eval``, ``predict`` and ``save_checkpoint``; between those the current ones live in ``state.train_state``.
A torch module gets them through ``state.sync_model()``; an NNX module is copied with them, so the user's module
is not touched mid-run.
"""
from __future__ import annotations

from typing import Any

import jax
import numpy as np
from flax import nnx

from jaxcomposer.core import adapters
from jaxcomposer.core.model import own_copy
from jaxcomposer.trainer import checkpoint

__all__ = ["is_torch_model", "current_nnx_module", "write_torch_weights", "flat_names"]


def is_torch_model(model: Any) -> bool:
    """Whether ``model`` is another framework's module (torch), reached only through its adapter."""
    return adapters.model_adapter(model) is not None


def current_nnx_module(state) -> nnx.Module:
    """A new module like ``state.model`` (an NNX module) holding the run's current weights. The user's module is not
    touched, and the new one owns its arrays, so it stays valid after the next step donates the train state's."""
    model = state.model
    if not isinstance(model, nnx.Module):
        raise TypeError(f"expected state.model to be a flax.nnx.Module, got {type(model).__name__}")
    # the Trainer split this same module with this same filter (core.model.from_nnx): the train state's trees
    # have this graphdef's structure
    graphdef, _, _ = nnx.split(model, nnx.Param, ...)
    ts = state.train_state
    return nnx.merge(graphdef, own_copy(ts.params), own_copy(ts.model_state))


def write_torch_weights(state) -> Any:
    """``state.model`` (a torch module) holding the run's current weights, written by the Trainer
    (``state.sync_model``, what it does itself at the end of ``fit`` and before ``eval``/``predict``)."""
    if state.sync_model is None:
        raise RuntimeError("state.sync_model is not set: this state does not come from a Trainer, which writes the "
                           "current weights into state.model")
    return state.sync_model()


def flat_names(tree) -> dict[str, np.ndarray]:
    """``{dotted path: host array}`` of a tree of arrays (an ``nnx.State``), as checkpoints name them: the names a
    flat file format stores. PRNG key arrays, which no such format can hold, are left out."""
    return {name: np.asarray(jax.device_get(leaf)) for name, leaf in checkpoint.flat_paths(tree).items()
            if hasattr(leaf, "dtype") and not jax.dtypes.issubdtype(leaf.dtype, jax.dtypes.prng_key)}
