"""Every method's pure function, for use in anyone's own JAX loop (Composer's ``composer.functional``).

Random ones take an explicit ``key``; images are NHWC unless ``data_format='NCHW'`` is passed.
"""
from jaxcomposer.algorithms.augmix import augmix_image
from jaxcomposer.algorithms.blurpool import apply_blurpool
from jaxcomposer.algorithms.colout import colout_batch
from jaxcomposer.algorithms.cutmix import cutmix_batch
from jaxcomposer.algorithms.cutout import cutout_batch
from jaxcomposer.algorithms.ema import compute_ema
from jaxcomposer.algorithms.gradient_clipping import apply_gradient_clipping
from jaxcomposer.algorithms.label_smoothing import smooth_labels
from jaxcomposer.algorithms.layer_freezing import freeze_layers
from jaxcomposer.algorithms.mixup import mixup_batch
from jaxcomposer.algorithms.progressive_resizing import resize_batch
from jaxcomposer.algorithms.randaugment import randaugment_image
from jaxcomposer.algorithms.sam import apply_sam
from jaxcomposer.algorithms.selective_backprop import select_using_loss, should_selective_backprop
from jaxcomposer.algorithms.seq_length_warmup import set_batch_sequence_length

__all__ = ["augmix_image", "randaugment_image",
           "apply_blurpool", "apply_gradient_clipping", "colout_batch", "compute_ema", "cutmix_batch", "cutout_batch",
           "mixup_batch", "smooth_labels", "apply_sam", "select_using_loss", "should_selective_backprop",
           "freeze_layers", "resize_batch", "set_batch_sequence_length"]
