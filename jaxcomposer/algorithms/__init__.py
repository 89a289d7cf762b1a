"""Speedup methods: Composer's class names and hyperparameters, each a factory returning a ``Method``.

One file per method holds its functional form, its factory and its method card (the module docstring).
"""
from jaxcomposer.algorithms.augmix import AugMix, augmix_image
from jaxcomposer.algorithms.blurpool import BlurPool, apply_blurpool
from jaxcomposer.algorithms.colout import ColOut, colout_batch
from jaxcomposer.algorithms.cutmix import CutMix, cutmix_batch
from jaxcomposer.algorithms.cutout import CutOut, cutout_batch
from jaxcomposer.algorithms.ema import EMA, compute_ema
from jaxcomposer.algorithms.gradient_clipping import GradientClipping, apply_gradient_clipping
from jaxcomposer.algorithms.label_smoothing import LabelSmoothing, smooth_labels
from jaxcomposer.algorithms.layer_freezing import LayerFreezing, freeze_layers
from jaxcomposer.algorithms.mixup import MixUp, mixup_batch
from jaxcomposer.algorithms.progressive_resizing import ProgressiveResizing, resize_batch
from jaxcomposer.algorithms.randaugment import RandAugment, randaugment_image
from jaxcomposer.algorithms.sam import SAM, apply_sam
from jaxcomposer.algorithms.selective_backprop import SelectiveBackprop, select_using_loss, should_selective_backprop
from jaxcomposer.algorithms.seq_length_warmup import SeqLengthWarmup, set_batch_sequence_length
from jaxcomposer.algorithms.swa import SWA

# Composer's registry spellings (``composer/algorithms/algorithm_registry.py``) -> factory name in this package;
# the config loader resolves YAML ``algorithms:`` entries through it.
REGISTRY: dict[str, str] = {
    "augmix": "AugMix",
    "blurpool": "BlurPool",
    "colout": "ColOut",
    "cutmix": "CutMix",
    "cutout": "CutOut",
    "ema": "EMA",
    "gradient_clipping": "GradientClipping",
    "label_smoothing": "LabelSmoothing",
    "layer_freezing": "LayerFreezing",
    "mixup": "MixUp",
    "progressive_resizing": "ProgressiveResizing",
    "randaugment": "RandAugment",
    "sam": "SAM",
    "selective_backprop": "SelectiveBackprop",
    "seq_length_warmup": "SeqLengthWarmup",
    "swa": "SWA",
}



def describe_methods() -> list[tuple[str, str]]:
    """(registry name, one-line description) for every method: the first sentence of its method card's
    "What it does" paragraph."""
    import importlib
    import re

    out = []
    for name, factory in sorted(REGISTRY.items()):
        doc = importlib.import_module(globals()[factory].__module__).__doc__ or ""
        what = re.search(r"\*\*What it does\.\*\*\s*(.+?\.)(\s|$)", doc, re.S)
        line = " ".join((what.group(1) if what else doc.strip().splitlines()[0]).split())
        out.append((name, line))
    return out


__all__ = [
    "REGISTRY", "describe_methods",
    "AugMix", "RandAugment", "augmix_image", "randaugment_image",
    "BlurPool", "ColOut", "CutMix", "CutOut", "EMA", "GradientClipping", "LabelSmoothing", "MixUp",
    "apply_blurpool", "apply_gradient_clipping", "colout_batch", "compute_ema", "cutmix_batch", "cutout_batch",
    "mixup_batch", "smooth_labels",
    "SAM", "SelectiveBackprop", "apply_sam", "select_using_loss", "should_selective_backprop",
    "LayerFreezing", "SWA", "freeze_layers",
    "ProgressiveResizing", "SeqLengthWarmup", "resize_batch", "set_batch_sequence_length",
]
