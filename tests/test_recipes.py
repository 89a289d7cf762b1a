"""Every recipe in ``configs/recipes/`` runs in smoke mode: the recipe as written (methods, optimizer, schedule,
precision, loss), with synthetic data of the same kind, a small model of the same family and 1 batch: the whole
recipe composes, compiles and takes a finite step. (A second batch would compile a second train step for the
recipes whose shapes change, progressive resizing's; the composition table runs every method through stage changes,
pairwise.)

What is shrunk is listed per model family in ``SMOKE``; everything else is the file's. The run must train through
``jaxcomposer.fit``, apply every method the recipe names, and end with finite evaluation metrics.
"""
from __future__ import annotations

import math
from pathlib import Path

import pytest

import jaxcomposer
from jaxcomposer import config as config_lib

RECIPES = sorted((Path(__file__).parents[1] / "configs" / "recipes").glob("*.yaml"))
pytestmark = pytest.mark.slow  # one compile per recipe

COMMON = ["max_duration=1ba", "eval_interval=1ba", "eval_subset_num_batches=1", "progress_bar=false",
          "log_to_console=false", "data.batch_size=8", "data.eval_batch_size=8", "data.synthetic_num_train=16",
          "data.synthetic_num_eval=8"]
SMOKE = {  # model.name -> what makes it small
    # one stage of one block: the methods still find their layers (the stem max-pool for BlurPool, a bottleneck
    # for StochasticDepth), and a cold compile of the Hot recipe takes a fraction of four stages' time
    "resnet": ["data.name=synthetic_images", "data.image_size=32", "data.eval_image_size=40",
               "data.synthetic_num_classes=10", "model.width=4", "model.layers=[1]"],
    "gpt2": ["data.name=synthetic_tokens", "data.seq_len=32", "data.synthetic_vocab_size=64", "model.d_model=32",
             "model.n_layers=2", "model.n_heads=2"],
    "bert": ["data.name=synthetic_tokens", "data.seq_len=32", "data.synthetic_vocab_size=64", "model.d_model=32",
             "model.n_layers=2", "model.n_heads=2", "model.d_ff=64"],
}


def test_every_recipe_is_covered_and_states_what_it_expects():
    assert len(RECIPES) >= 7
    for path in RECIPES:
        text = path.read_text()
        for field in ("# Command:", "# Hardware:", "# Expected:"):
            assert field in text, f"{path.name} lacks {field!r}"
        cfg = config_lib.load_config(path)  # validates as written
        assert cfg.model["name"] in SMOKE, path.name


@pytest.mark.parametrize("path", RECIPES, ids=[p.stem for p in RECIPES])
def test_recipe_smoke_run(path, tmp_path):
    name = config_lib.load_config(path).model["name"]
    result = jaxcomposer.fit(path, COMMON + SMOKE[name] + [f"run_dir={tmp_path}"])
    assert result.state.timestamp.batch.value == 1
    assert len(result.trainer.composed.names) == len(config_lib.load_config(path).algorithms)
    assert result.metrics and all(math.isfinite(v) for v in result.metrics.values()), result.metrics
