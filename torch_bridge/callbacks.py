"""Composer's callbacks' torch side: exporting a torch model (``ExportForInferenceCallback``) and generating with
a Hugging Face model (``Generate``). jaxcomposer's callbacks reach these through the torch adapter
(``functional['export_for_inference']``, ``functional['generate']``), so jaxcomposer itself never imports torch."""
from __future__ import annotations

import copy
from pathlib import Path
from typing import Any, Callable, Sequence

import numpy as np
import torch

__all__ = ["export_for_inference", "generate"]


def export_for_inference(model: torch.nn.Module, save_format: str, path: Path, *, transforms: Sequence[Callable],
                         sample: Callable[[], Any], input_names: Sequence[str] | None = None,
                         output_names: Sequence[str] | None = None) -> None:
    """Write a copy of ``model`` (the user's module holding the trained weights; ``transforms`` applied to the
    copy, in eval mode) to ``path`` as ``'state_dict'``, ``'safetensors'``, ``'torchscript'`` (scripted, else traced
    with ``sample()``) or ``'onnx'``."""
    model = copy.deepcopy(model)
    for transform in transforms:
        model = transform(model)
    model.eval()
    if save_format == "state_dict":
        torch.save(model.state_dict(), path)
    elif save_format == "safetensors":
        from safetensors.torch import save_model
        save_model(model, str(path))
    elif save_format == "torchscript":
        torch.jit.save(_torchscript(model, sample), str(path))
    else:
        example = _as_torch(sample())
        input_names = list(input_names or ["input"])
        output_names = list(output_names or ["output"])
        axes = {name: {0: "batch_size"} for name in input_names + output_names}
        with torch.no_grad():
            torch.onnx.export(model, (example,), str(path), input_names=input_names, output_names=output_names,
                              dynamic_axes=axes)


def _torchscript(model: torch.nn.Module, sample: Callable[[], Any]):
    try:
        return torch.jit.script(model)
    except Exception as script_error:
        try:
            example = _as_torch(sample())
        except ValueError as e:
            raise RuntimeError(f"ExportForInferenceCallback: torch.jit.script failed ({script_error}) and there "
                               f"is no sample input to trace the model with instead ({e})") from script_error
        try:
            with torch.no_grad():
                return torch.jit.trace(model, (example,), strict=False)
        except Exception as trace_error:
            raise RuntimeError(f"ExportForInferenceCallback: the model can be neither scripted "
                               f"(torch.jit.script: {script_error}) nor traced (torch.jit.trace: {trace_error}); "
                               "export it as 'state_dict' or 'safetensors' instead") from trace_error


def _as_torch(sample: Any) -> Any:
    """A sample of host arrays as torch tensors (a torch tensor passes through)."""
    def convert(x):
        return x if isinstance(x, torch.Tensor) else torch.from_numpy(np.array(x))

    if isinstance(sample, dict):
        return {k: convert(v) for k, v in sample.items()}
    if isinstance(sample, (tuple, list)):
        return type(sample)(convert(v) for v in sample)
    return convert(sample)


def generate(wrapper: torch.nn.Module, prompts: list[list[int]], tokenizer: Any, generate_kwargs: dict) -> list:
    """New token ids after each prompt, by ``wrapper.model.generate`` (a ``HuggingFaceModel`` holding the current
    weights), in eval mode and without gradients; prompts are left-padded so generation continues from each row's
    last token."""
    hf = wrapper.model
    config = getattr(hf, "config", None)
    pad = next((v for v in (getattr(tokenizer, "pad_token_id", None), getattr(tokenizer, "eos_token_id", None),
                            getattr(config, "pad_token_id", None), getattr(config, "eos_token_id", None))
                if v is not None), 0)
    longest = max(map(len, prompts))
    input_ids = torch.tensor([[pad] * (longest - len(ids)) + ids for ids in prompts], dtype=torch.long)
    mask = torch.tensor([[0] * (longest - len(ids)) + [1] * len(ids) for ids in prompts], dtype=torch.long)
    was_training = wrapper.training
    wrapper.eval()
    try:
        with torch.no_grad():
            out = hf.generate(input_ids=input_ids, attention_mask=mask, **{"pad_token_id": pad, **generate_kwargs})
    finally:
        wrapper.train(was_training)
    return [row[longest:].tolist() for row in out]
