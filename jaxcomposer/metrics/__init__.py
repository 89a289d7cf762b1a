"""Evaluation metrics as pure ``init / update / compute`` over sum states (see ``jaxcomposer.metrics.base``), named
as Composer's are in logs (``metrics/eval/MulticlassAccuracy``, ``metrics/eval/LanguagePerplexity``, ...)."""
from jaxcomposer.metrics.base import MeanMetric, Metric, compute_all, merge
from jaxcomposer.metrics.classification import BinaryF1Score, CrossEntropy, MulticlassAccuracy
from jaxcomposer.metrics.language import LanguageCrossEntropy, LanguagePerplexity, MaskedAccuracy
from jaxcomposer.metrics.segmentation import Dice, MIoU

__all__ = ["Metric", "MeanMetric", "merge", "compute_all", "MulticlassAccuracy", "CrossEntropy", "BinaryF1Score",
           "LanguageCrossEntropy", "LanguagePerplexity", "MaskedAccuracy", "MIoU", "Dice"]
