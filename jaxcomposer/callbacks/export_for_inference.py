"""``ExportForInferenceCallback``: the trained model written out for serving at the end of ``fit``, as Composer's."""
from __future__ import annotations

import importlib.util
import tempfile
import warnings
from pathlib import Path
from typing import Any, Callable, Sequence

import jax
import numpy as np
from flax import nnx

from jaxcomposer.callbacks._current_model import (current_nnx_module, flat_names, is_torch_model,
                                                  write_torch_weights)
from jaxcomposer.core import adapters
from jaxcomposer.core.events import Callback
from jaxcomposer.utils.object_store import GCSObjectStore, S3ObjectStore, is_uri, split_uri

__all__ = ["ExportForInferenceCallback", "export_stablehlo", "TORCH_FORMATS", "NNX_FORMATS"]

TORCH_FORMATS = ("torchscript", "onnx", "state_dict", "safetensors")
NNX_FORMATS = ("stablehlo", "safetensors")
# the package each format needs beyond the framework itself: jax.export serializes through flatbuffers, torch's
# ONNX exporter writes through onnx
_NEEDS = {"stablehlo": "flatbuffers", "onnx": "onnx", "safetensors": "safetensors"}
_NEEDS_SAMPLE = ("onnx", "stablehlo")


class ExportForInferenceCallback(Callback):
    """Composer's ``ExportForInferenceCallback(save_format, save_path, save_object_store=None, sample_input=None,
    transforms=None, input_names=None, output_names=None)``: at FIT_END, writes the trained model to ``save_path``
    (a local file; its folder is created).

    ``save_format`` (a string or Composer's ``ExportFormat``), by the kind of ``state.model``:

    - a torch module: ``'torchscript'`` (``torch.jit.script``; a module that cannot be scripted is traced with the
      sample input instead, and when neither works the error gives both reasons), ``'onnx'`` (``torch.onnx.export``
      with ``input_names``/``output_names``, default ``['input']``/``['output']``, and a dynamic batch axis; needs
      the ``onnx`` package), ``'state_dict'`` (``torch.save(model.state_dict())``) and ``'safetensors'``
      (``safetensors.torch.save_model``, which stores tied weights once);
    - an NNX module: ``'stablehlo'``, the eval forward ``module(inputs, train=False)`` through ``jax.export`` with
      the trained weights inside (read it back with ``jax.export.deserialize(data).call(inputs)``; the batch axis
      is symbolic where the model allows it; needs the ``flatbuffers`` package, which JAX serializes with), and
      ``'safetensors'`` (every array of ``nnx.state(module)`` by dotted path, ``blocks.0.attn.qkv.kernel``).

    The format is checked against the model, and the package it needs, at INIT: before training, not after it.

    What is exported is ``state.model`` (a ComposerModel wrapper is exported whole, as Composer exports its
    ``state.model``) with the run's final weights (the Trainer writes them into the user's module before FIT_END;
    a torch model is exported by ``torch_bridge``, through the torch adapter). ``transforms`` (callables
    ``model -> model``) run on a copy before export, as Composer's.

    ``sample_input``: the model's input for tracing (one positional argument). By default, taken from the last
    train batch: ``batch['input']`` for a bare module (torch or NNX), and for a torch ComposerModel the batch in the
    loader's structure (an ``(input, target)`` pair, else the dict), which its ``forward`` takes. A batch without
    an ``'input'`` entry (a language model's ``input_ids``, which the task slices) needs ``sample_input``; that is
    checked at the first batch. Batches are read before a DataSpec's in-step transforms, so a DataSpec that changes
    the model's input (uint8 images normalized in the step) needs ``sample_input`` too.

    The file is also handed to ``logger.upload_file(remote_file_name=save_path, ...)``, so a destination that
    uploads files gets it, as in Composer. As Composer's, ``save_path`` may be an object-store URI
    (``s3://bucket/model.stablehlo``), or, with ``save_object_store`` (``jaxcomposer.utils.S3ObjectStore``, or
    anything with Composer's ``upload_object(object_name, filename)``), the object's name in that store: the model
    is then exported to a local temporary file and uploaded.
    """

    def __init__(self, save_format: Any, save_path: str | Path, save_object_store: Any = None,
                 sample_input: Any = None, transforms: Sequence[Callable] | None = None,
                 input_names: Sequence[str] | None = None, output_names: Sequence[str] | None = None):
        fmt = str(getattr(save_format, "value", save_format)).lower()
        if fmt not in TORCH_FORMATS + NNX_FORMATS:
            raise ValueError(f"ExportForInferenceCallback: save_format must be one of "
                             f"{sorted(set(TORCH_FORMATS + NNX_FORMATS))}, got {save_format!r}")
        if save_object_store is not None and not callable(getattr(save_object_store, "upload_object", None)):
            raise TypeError(f"ExportForInferenceCallback: save_object_store must have Composer's "
                            f"upload_object(object_name, filename) (jaxcomposer.utils.S3ObjectStore), got "
                            f"{type(save_object_store).__name__}")
        if save_object_store is None and is_uri(str(save_path)):  # Composer's: a URL names the store and object
            scheme, bucket, key = split_uri(str(save_path), "ExportForInferenceCallback(save_path)")
            save_object_store = (S3ObjectStore if scheme == "s3" else GCSObjectStore)(bucket)
            save_path = key
        transforms = list(transforms or [])
        if not all(callable(t) for t in transforms):
            raise TypeError(f"ExportForInferenceCallback: transforms must be callables model -> model, got "
                            f"{transforms!r}")
        self.save_format, self.save_path = fmt, Path(save_path)
        self.save_object_store = save_object_store
        self.sample_input, self.transforms = sample_input, transforms
        self.input_names = list(input_names) if input_names is not None else None
        self.output_names = list(output_names) if output_names is not None else None
        self.exported_path: Path | None = None  # set once the model is written
        self._sample_checked = False

    def init(self, state, logger) -> None:
        torch_model = is_torch_model(state.model)
        if not torch_model and not isinstance(state.model, nnx.Module):
            raise TypeError(f"ExportForInferenceCallback: exports a torch module or a flax.nnx.Module, and "
                            f"state.model is a {type(state.model).__name__}")
        formats, kind = (TORCH_FORMATS, "a torch model") if torch_model else (NNX_FORMATS, "an NNX model")
        if self.save_format not in formats:
            raise ValueError(f"ExportForInferenceCallback: save_format={self.save_format!r} does not apply to "
                             f"{kind} ({type(state.model).__name__}); use one of {list(formats)}")
        package = _NEEDS.get(self.save_format)
        if package is not None and importlib.util.find_spec(package) is None:
            raise ImportError(f"ExportForInferenceCallback: save_format={self.save_format!r} needs the {package!r} "
                              f"package, which is not installed; `pip install {package}`, or choose another format")

    def batch_end(self, state, logger) -> None:
        if self._sample_checked:
            return
        self._sample_checked = True
        if self.save_format in _NEEDS_SAMPLE and self.sample_input is None and \
                self._default_sample(state) is None:
            raise ValueError(f"ExportForInferenceCallback: save_format={self.save_format!r} traces the model with an "
                             f"example input, and this run's batches (keys {sorted(state.batch)}) have no 'input' "
                             "entry to take it from; pass sample_input=<the model's input>")

    def fit_end(self, state, logger) -> None:
        self.export_model(state, logger)

    def export_model(self, state, logger=None) -> Path:
        """Write the model with the run's current weights to ``save_path`` (with an object store: to a local
        temporary file, then uploaded as ``save_path``); returns the local path."""
        path = self.save_path
        if self.save_object_store is not None:
            path = Path(tempfile.mkdtemp(prefix="jaxcomposer-export-")) / self.save_path.name
        path.parent.mkdir(parents=True, exist_ok=True)
        if is_torch_model(state.model):
            self._export_torch(state, path)
        else:
            self._export_nnx(state, path)
        if self.save_object_store is not None:
            self.save_object_store.upload_object(str(self.save_path), path)
        self.exported_path = path
        upload = getattr(logger, "upload_file", None)
        if callable(upload):  # Composer hands the export to the logger's file-upload destinations under save_path
            upload(remote_file_name=str(self.save_path), file_path=path, overwrite=True)
        return path

    # ---- the sample input ----
    def _default_sample(self, state) -> Any:
        """The model's input taken from the last train batch, as host arrays (None when it cannot be told)."""
        batch = state.batch
        if not isinstance(batch, dict):
            return None
        host = {k: np.asarray(v) for k, v in batch.items()}
        if is_torch_model(state.model) and callable(getattr(state.model, "loss", None)):
            # a ComposerModel's forward takes the batch as its loader made it (torch_bridge's rule: a dict of
            # exactly input and target was a pair)
            return (host["input"], host["target"]) if set(host) == {"input", "target"} else host
        return host.get("input")

    def _sample(self, state) -> Any:
        sample = self.sample_input if self.sample_input is not None else self._default_sample(state)
        if sample is None:
            raise ValueError(f"ExportForInferenceCallback: save_format={self.save_format!r} needs an example input "
                             "and none could be taken from the last train batch; pass sample_input=...")
        return sample

    # ---- torch: torch_bridge's (jaxcomposer never imports torch) ----
    def _export_torch(self, state, path: Path) -> None:
        export = adapters.model_adapter(state.model).functional["export_for_inference"]
        export(write_torch_weights(state), self.save_format, path, transforms=self.transforms,
               sample=lambda: self._sample(state), input_names=self.input_names, output_names=self.output_names)

    # ---- NNX ----
    def _export_nnx(self, state, path: Path) -> None:
        module = current_nnx_module(state)
        for transform in self.transforms:
            module = transform(module)
        if self.save_format == "safetensors":
            from safetensors.numpy import save_file
            save_file(flat_names(nnx.state(module)), str(path))
        else:
            path.write_bytes(export_stablehlo(module, self._sample(state)).serialize())


def export_stablehlo(module: nnx.Module, sample_input: Any) -> jax.export.Exported:
    """``module(inputs, train=False)`` as a ``jax.export.Exported`` for inputs shaped like ``sample_input`` (an
    array or a pytree of arrays), with the module's weights inside as constants, so the artifact needs nothing
    else: ``exported.call(inputs)``. The leading (batch) axis of every input is one symbolic size where the model
    allows it; a model whose shapes do not (a reshape that fixes the batch) is exported for the sample's batch
    size, with a warning."""
    graphdef, weights = nnx.split(module)
    weights = jax.tree.map(lambda x: x if jax.dtypes.issubdtype(getattr(x, "dtype", np.float32), jax.dtypes.prng_key)
                           else np.asarray(jax.device_get(x)), weights)

    def forward(inputs):
        return nnx.merge(graphdef, weights)(inputs, train=False)

    sample = jax.tree.map(np.asarray, sample_input)
    (batch,) = jax.export.symbolic_shape("batch")
    symbolic = jax.tree.map(lambda x: jax.ShapeDtypeStruct((batch,) + x.shape[1:], x.dtype), sample)
    try:
        return jax.export.export(jax.jit(forward))(symbolic)
    except Exception as e:  # shape polymorphism has many ways to fail; the concrete shapes always export
        warnings.warn(f"export_stablehlo: {type(module).__name__} cannot be exported for any batch size ({e}); "
                      f"exporting it for the sample's batch size only", RuntimeWarning, stacklevel=2)
        return jax.export.export(jax.jit(forward))(jax.tree.map(lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype),
                                                                sample))
