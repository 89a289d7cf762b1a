"""The image methods follow the model's layout by default: on a bridged torch model (``param_layout='torch'``) a
method without ``data_format`` acts exactly as with ``data_format='NCHW'``, on an NNX model as with 'NHWC'. One
table for every method that takes ``data_format``."""
import jax
import numpy as np
import pytest

from jaxcomposer.algorithms import AugMix, ColOut, CutMix, CutOut, ProgressiveResizing, RandAugment
from jaxcomposer.algorithms.image_layout import model_layout
from jaxcomposer.core.method import ModelView, RunInfo, StepCtx

# (factory, slot): the slot that reads the layout
METHODS = {
    "CutOut": (lambda **kw: CutOut(num_holes=2, length=0.25, **kw), "batch"),
    "CutMix": (lambda **kw: CutMix(alpha=1.0, **kw), "batch"),
    "ColOut": (lambda **kw: ColOut(p_row=0.25, p_col=0.25, **kw), "batch"),
    "RandAugment": (lambda **kw: RandAugment(severity=9, depth=1, **kw), "data"),
    "AugMix": (lambda **kw: AugMix(severity=3, width=2, **kw), "data"),
}


def _ctx(layout: str, slot: str, seed: int = 0) -> StepCtx:
    key = np.random.default_rng(seed) if slot == "data" else jax.random.key(seed)
    return StepCtx(step=0, key=key, run=RunInfo(total_steps=10), model=ModelView(param_layout=layout))


def _batch(layout: str) -> dict:
    rng = np.random.default_rng(1)
    x = rng.random((4, 8, 12, 3)).astype(np.float32)  # not square, so H and W cannot be mistaken for each other
    return {"input": x.transpose(0, 3, 1, 2).copy() if layout == "NCHW" else x,
            "target": np.arange(4, dtype=np.int32) % 3}


@pytest.mark.parametrize("name", sorted(METHODS))
@pytest.mark.parametrize("param_layout, data_format", [("torch", "NCHW"), ("flax", "NHWC")])
def test_default_layout_is_the_models(name, param_layout, data_format):
    make, slot = METHODS[name]
    batch = _batch(data_format)
    default = getattr(make(), slot)(dict(batch), _ctx(param_layout, slot))
    explicit = getattr(make(data_format=data_format), slot)(dict(batch), _ctx(param_layout, slot))
    for k in explicit:
        np.testing.assert_array_equal(np.asarray(default[k]), np.asarray(explicit[k]), err_msg=k)
    assert not np.array_equal(np.asarray(default["input"]), batch["input"])  # the method did change the images


def test_progressive_resizing_stage_reads_the_models_layout():
    method = ProgressiveResizing(initial_scale=0.5, finetune_fraction=0.0, delay_fraction=0.0, size_increment=4)
    shapes = {"input": (4, 3, 16, 24), "target": (4,)}
    torch_stage = method.stage(shapes, _ctx("torch", "batch"))
    nchw_stage = ProgressiveResizing(initial_scale=0.5, finetune_fraction=0.0, delay_fraction=0.0, size_increment=4,
                                     data_format="NCHW").stage(shapes, _ctx("flax", "batch"))
    assert torch_stage == nchw_stage


def test_model_layout():
    assert model_layout(None, _ctx("torch", "batch")) == "NCHW" and model_layout(None, _ctx("flax", "batch")) == "NHWC"
    assert model_layout("NHWC", _ctx("torch", "batch")) == "NHWC"  # an explicit data_format wins
