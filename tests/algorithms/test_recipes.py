"""Methods in one recipe with the core's own knobs: ``scale_schedule_ratio`` and decoupled weight decay reach every
method's idea of the run (``ctx.run.total_steps``, the stage, and the one clock ``ctx.step`` that SWA's sampling and
SWALR and LayerFreezing's depth read; docs/design.md, "The clock")."""
import jax
import numpy as np
import pytest

from jaxcomposer import Trainer, algorithms
from jaxcomposer.algorithms.swa import find_swa_state
from jaxcomposer.core.events import Callback
from jaxcomposer.data import ArrayLoader
from jaxcomposer.optim import CosineAnnealingScheduler, DecoupledSGDW
from tests.trainer.helpers import digits, leaves, resnet_task

# both tests read the same runs (a module fixture): keep them on one xdist worker
pytestmark = pytest.mark.xdist_group("test_recipes")


def _recipe():
    return [algorithms.ProgressiveResizing(initial_scale=0.5, delay_fraction=0.5, finetune_fraction=0.25),
            algorithms.SWA(swa_start="0.5dur", swa_end="0.75dur", update_interval="1ba", schedule_swa_lr=True,
                           swa_lr=0.01, anneal_steps=1),
            algorithms.LayerFreezing(freeze_start=0.25, freeze_level=1.0, update_interval="1ba"),
            algorithms.CutMix(alpha=1.0), algorithms.LabelSmoothing(0.1)]


def _trainer(max_duration, ssr=1.0):
    return Trainer(model=resnet_task(), train_dataloader=ArrayLoader(digits("train", 256), 32, seed=2),
                   max_duration=max_duration, scale_schedule_ratio=ssr, schedulers=[CosineAnnealingScheduler()],
                   optimizers=DecoupledSGDW(lr=0.1, momentum=0.9, weight_decay=5e-4), algorithms=_recipe(),
                   seed=4, progress_bar=False, devices=jax.devices()[:1])


class StemRecorder(Callback):
    """The stem's parameters after every batch (reading them changes nothing in the run)."""

    def __init__(self):
        self.seen = []

    def batch_end(self, state, logger):
        self.seen.append([np.asarray(x) for p, x in jax.tree_util.tree_flatten_with_path(
            state.train_state.params)[0] if "stem" in jax.tree_util.keystr(p)])


@pytest.fixture(scope="module")
def runs():
    """The recipe over 8 batches at ``scale_schedule_ratio=0.5`` and over 4 plain ones (stem recorded): one pair of
    fits for both tests."""
    scaled, plain, recorder = _trainer("8ba", ssr=0.5), _trainer("4ba"), StemRecorder()
    plain.callbacks.append(recorder)
    assert scaled.total_steps == plain.total_steps == 4
    scaled.fit()
    plain.fit()
    return scaled, plain, recorder


def test_scale_schedule_ratio_reaches_every_method(runs):
    scaled, plain, _ = runs
    # the scaled run *is* the 4-batch run: same resizing stages, SWA swap, freezing depth and LR, to the bit
    for a, b in zip(leaves(scaled.state.train_state), leaves(plain.state.train_state)):
        np.testing.assert_array_equal(a, b)
    # small images for half the run, then full size
    assert list(scaled.compiled_programs().values()) == [2]
    assert [round(scaled.state.learning_rate(s), 6) for s in range(4)][2:] == [0.01, 0.01]  # SWALR: 0.1 * (0.01 / 0.1)
    # SWA's plan is in the scaled run's steps: samples after batches 2 (0.5dur of 4) and 3, then the swap
    assert int(find_swa_state(scaled.state.train_state.opt_state).swa_n) == 2


def test_decoupled_weight_decay_never_touches_frozen_layers(runs):
    recorder = runs[2]
    # LayerFreezing (freeze_start=0.25) has frozen the stem for the last steps: decoupled weight decay, which moves
    # every other layer, must leave it bitwise alone; before freezing it did move
    assert recorder.seen[-1] and len(recorder.seen) == 4
    for a, b in zip(recorder.seen[-2], recorder.seen[-1]):
        np.testing.assert_array_equal(a, b)
    assert any(not np.array_equal(a, b) for a, b in zip(recorder.seen[0], recorder.seen[1]))
