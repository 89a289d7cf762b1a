"""A jaxcomposer checkpoint's weights as a torch ``state_dict``, and as Composer's ``.pt`` file.

jaxcomposer saves verified orbax checkpoints (a directory per step; Composer's names such as ``ep1-ba4-rank0.pt``
link to them). A torch user who wants the weights in torch's own format takes them from there: the bridged
model's params and buffers are saved under their ``state_dict`` names, so they map back onto the module the run
trained (the user's module, or a ``ComposerModel``/``ComposerClassifier`` around it).
"""
from __future__ import annotations

from pathlib import Path

import numpy as np
import torch

from jaxcomposer.trainer import checkpoint

__all__ = ["weights_from_checkpoint", "save_composer_checkpoint"]

# how a saved name can sit in the module's state_dict: as is (the trained module itself), under the exported
# ComposerModel wrapper's 'model.' (a ComposerModel's own names), or under a ComposerClassifier's 'module.'
_PLACEMENTS = (lambda n: n, lambda n: n.removeprefix("model."), lambda n: "module." + n)


def weights_from_checkpoint(checkpoint_path: str | Path, model: torch.nn.Module) -> dict[str, torch.Tensor]:
    """``model.state_dict()`` with the checkpoint's weights (params and buffers; tied names share one value;
    entries the run did not train, such as frozen parameters, keep the module's values). ``checkpoint_path`` is a
    checkpoint directory, one of Composer's names linking to one, or a save_folder (its newest good step)."""
    saved = {}
    for name, value in checkpoint.read_weights(checkpoint_path).items():
        field, _, key = name.partition(".")
        if field in ("params", "model_state"):
            saved[key] = value
    template = model.state_dict()
    for place in _PLACEMENTS:
        if all(place(k) in template for k in saved):
            break
    else:
        missing = sorted(k for k in saved if not any(p(k) in template for p in _PLACEMENTS))[:5]
        raise KeyError(f"weights_from_checkpoint: the checkpoint's weights {missing} are not in "
                       f"{type(model).__name__}.state_dict(); pass the module the run trained")
    out = dict(template)
    by_storage = {}
    for key, value in saved.items():
        name = place(key)
        tensor = torch.from_numpy(np.array(value, dtype=np.float32 if value.dtype.name == "bfloat16" else None))
        out[name] = tensor.to(template[name].dtype)
        by_storage[template[name].data_ptr()] = out[name]
    for name, value in template.items():  # a tied weight's other names: the value saved under one of them
        if name not in {place(k) for k in saved} and value.data_ptr() in by_storage and value.numel():
            out[name] = by_storage[value.data_ptr()]
    return out


def save_composer_checkpoint(checkpoint_path: str | Path, model: torch.nn.Module, path: str | Path) -> Path:
    """Write the checkpoint's weights as Composer's checkpoint file, ``{'state': {'model': state_dict}}``, which
    ``torch.load(path)['state']['model']`` and Composer's ``load_path`` with ``load_weights_only=True`` read."""
    path = Path(path)
    torch.save({"state": {"model": weights_from_checkpoint(checkpoint_path, model)}}, path)
    return path
