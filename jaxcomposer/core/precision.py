"""Composer's ``Precision`` names, as a string enum: ``Trainer(precision=Precision.AMP_BF16)`` is ``'amp_bf16'``."""
from __future__ import annotations

import enum


class Precision(str, enum.Enum):
    """The numerics of a run, by Composer's names. jaxcomposer trains ``FP32`` and ``AMP_BF16`` (float32 master
    weights, bfloat16 compute); ``AMP_FP16`` and ``AMP_FP8`` are named so a Composer script reads as written, and
    the Trainer refuses them with the supported values (bfloat16 needs no loss scaling, so it takes fp16's place)."""

    FP32 = "fp32"
    AMP_FP16 = "amp_fp16"
    AMP_BF16 = "amp_bf16"
    AMP_FP8 = "amp_fp8"

    def __str__(self) -> str:
        return self.value
