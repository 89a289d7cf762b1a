"""``DataSpec``: a loader plus how to count and transform its batches, as Composer's ``composer.core.DataSpec``.

A Composer script passes ``train_dataloader=DataSpec(loader, batch_transforms=..., get_num_samples_in_batch=...)``
(or an eval loader the same way); the ``Trainer`` takes it as Composer's does.

Where ours differs, on purpose:

- ``batch_transforms`` and ``microbatch_transforms`` run *inside* the compiled train, eval and predict steps, so they
  are JAX functions of the batch (a dict of arrays; an ``(input, target)`` pair arrives as ``{'input', 'target'}``),
  traced once. Composer calls them eagerly on the device's torch tensors; a torch function here fails when the step
  is traced, with an error naming the argument. That is what makes them cheap: normalizing ``uint8`` images in the
  step costs one fused pass on the device, where a loader that normalizes on the host gathers, converts and
  copies four times the bytes per batch.
- ``microbatch_transforms`` runs on each microbatch of gradient accumulation, after the methods' batch edits, as in
  Composer; evaluation and ``predict`` run whole batches, so there it follows ``batch_transforms`` on the batch.
- ``get_num_samples_in_batch`` and ``get_num_tokens_in_batch`` count the batch as the loader yields it (before the
  transforms, which run on the device); they feed the timestamp's sample and token counts.
- ``split_batch`` is refused: microbatches are split inside the compiled step, every leaf of the batch pytree along
  its first axis (``device_train_microbatch_size``), so batches of any structure split without a function.
"""

from __future__ import annotations

import warnings
from collections.abc import Callable, Iterable
from typing import Any

from jaxcomposer.errors import ConfigurationError

Batch = Any
BatchTransform = Callable[[Batch], Batch]


class DataSpec:
    """A loader and how to count and transform its batches (Composer's signature; see the module docstring for
    what runs where).

    Args:
        dataloader: any iterable of batches our ``Trainer`` accepts (our loaders, a torch ``DataLoader``).
        num_samples, num_tokens: the dataset's size, for the record (Composer uses them the same way: they do not
            change how many batches an epoch has, which is the loader's length).
        batch_transforms: ``batch -> batch``, a JAX function run at the start of every compiled step, before the
            methods see the batch (Composer: after the batch is moved to the device, before ``AFTER_DATALOADER``).
        microbatch_transforms: ``microbatch -> microbatch``, run on each microbatch before the forward.
        split_batch: not supported (``ConfigurationError``); see the module docstring.
        get_num_samples_in_batch: ``batch -> int``; default: the length of the batch's first leaf.
        get_num_tokens_in_batch: ``batch -> int``; default: the task's count (0 for classifiers).
        device_transforms: Composer's former name for ``batch_transforms`` (deprecated there too).
    """

    def __init__(self, dataloader: Iterable, num_samples: int | None = None, num_tokens: int | None = None,
                 batch_transforms: BatchTransform | None = None,
                 microbatch_transforms: BatchTransform | None = None, split_batch: Callable | None = None,
                 get_num_samples_in_batch: Callable[[Batch], int] | None = None,
                 get_num_tokens_in_batch: Callable[[Batch], int] | None = None,
                 device_transforms: BatchTransform | None = None):
        if device_transforms is not None:
            if batch_transforms is not None:
                raise ConfigurationError("DataSpec: device_transforms and batch_transforms both given; "
                                         "device_transforms is the former name of batch_transforms: pass one")
            warnings.warn("DataSpec: device_transforms is deprecated (as in Composer); use batch_transforms",
                          DeprecationWarning, stacklevel=2)
            batch_transforms = device_transforms
        if split_batch is not None:
            raise ConfigurationError(
                "DataSpec.split_batch: not supported; microbatches are split inside the compiled step, every leaf of "
                "the batch along its first axis (device_train_microbatch_size), so any batch structure splits "
                "without a function. Drop split_batch.")
        for name, fn in (("batch_transforms", batch_transforms), ("microbatch_transforms", microbatch_transforms),
                         ("get_num_samples_in_batch", get_num_samples_in_batch),
                         ("get_num_tokens_in_batch", get_num_tokens_in_batch)):
            if fn is not None and not callable(fn):
                raise ConfigurationError(f"DataSpec.{name}: expected a function of the batch, got "
                                         f"{type(fn).__name__}")
        if isinstance(dataloader, DataSpec):
            raise ConfigurationError("DataSpec.dataloader: got another DataSpec; pass its .dataloader")
        self.dataloader = dataloader
        self.num_samples, self.num_tokens = num_samples, num_tokens
        self.batch_transforms, self.microbatch_transforms = batch_transforms, microbatch_transforms
        self.get_num_samples_in_batch = get_num_samples_in_batch
        self.get_num_tokens_in_batch = get_num_tokens_in_batch
        # the transforms as the compiled steps call them (the Trainer caches those steps by transform_key)
        self._in_step = tuple(None if fn is None else _in_step(fn, name) for fn, name in (
            (batch_transforms, "batch_transforms"), (microbatch_transforms, "microbatch_transforms")))
        self._whole_batch = _then(*self._in_step)

    def __repr__(self) -> str:
        parts = [type(self.dataloader).__name__] + [name for name in (
            "batch_transforms", "microbatch_transforms", "get_num_samples_in_batch", "get_num_tokens_in_batch")
            if getattr(self, name) is not None]
        return f"DataSpec({', '.join(parts)})"


def unwrap(loader: Any) -> tuple[Any, DataSpec | None]:
    """``(the loader, its DataSpec or None)`` for whatever a ``Trainer`` argument holds: a loader, a ``DataSpec``,
    or, as in Composer, a dict of ``DataSpec``'s arguments (``{'dataloader': ..., 'batch_transforms': ...}``)."""
    if isinstance(loader, dict) and "dataloader" in loader:
        try:
            loader = DataSpec(**loader)
        except TypeError as error:
            raise ConfigurationError(f"a dataloader given as a dict is DataSpec's arguments: {error}") from None
    return (loader.dataloader, loader) if isinstance(loader, DataSpec) else (loader, None)


def step_transforms(spec: DataSpec | None) -> tuple[BatchTransform | None, BatchTransform | None]:
    """``(batch transform, microbatch transform)`` for the train step: each None when the spec has none."""
    return (None, None) if spec is None else spec._in_step


def whole_batch_transform(spec: DataSpec | None) -> BatchTransform | None:
    """The eval and predict steps' transform: ``batch_transforms`` then ``microbatch_transforms`` (those steps run
    whole batches), or None."""
    return None if spec is None else spec._whole_batch


def transform_key(spec: DataSpec | None) -> tuple | None:
    """What a compiled step's transforms are, for caching it: the user's functions (a new DataSpec around the same
    functions finds the step compiled for an earlier one)."""
    return None if spec is None or spec._whole_batch is None else (spec.batch_transforms, spec.microbatch_transforms)


def _in_step(fn: BatchTransform, name: str) -> BatchTransform:
    """``fn`` as the compiled steps call it: a failure while tracing names the argument and says why it runs there;
    an ``(input, target)`` pair it returns becomes the batch dict."""
    def transform(batch: dict) -> dict:
        try:
            out = fn(batch)
        except Exception as error:
            raise ConfigurationError(
                f"DataSpec.{name}: raised {type(error).__name__}: {error} on the batch (a dict with keys "
                f"{sorted(batch)}) while the compiled step was traced. jaxcomposer runs it inside the step, so it "
                "must be a JAX function of the batch dict (jax.numpy), not an eager torch one.") from error
        if isinstance(out, (tuple, list)) and len(out) == 2:
            out = {"input": out[0], "target": out[1]}
        if not isinstance(out, dict):
            raise ConfigurationError(f"DataSpec.{name}: returned {type(out).__name__}; expected the batch: a dict "
                                     "of arrays, or an (input, target) pair")
        return out

    return transform


def _then(first: BatchTransform | None, second: BatchTransform | None) -> BatchTransform | None:
    if first is None or second is None:
        return first or second
    return lambda batch: second(first(batch))
