"""Every method's pure function, for use in anyone's own JAX loop (Composer's ``composer.functional``).

Random ones take an explicit ``key``; images are NHWC unless ``data_format='NCHW'`` is passed.
"""
from jaxcomposer.algorithms.blurpool import apply_blurpool
from jaxcomposer.algorithms.cutout import cutout_batch
from jaxcomposer.algorithms.ema import compute_ema
from jaxcomposer.algorithms.gradient_clipping import apply_gradient_clipping
from jaxcomposer.algorithms.label_smoothing import smooth_labels
from jaxcomposer.algorithms.mixup import mixup_batch

__all__ = ["apply_blurpool", "apply_gradient_clipping", "compute_ema", "cutout_batch", "mixup_batch", "smooth_labels"]
