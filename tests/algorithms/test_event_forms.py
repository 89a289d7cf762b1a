"""The built-in methods written as Composer Algorithms (``jaxcomposer/algorithms/event_forms.py``) train to the same
bits as their slot versions and compile as many steps: the event mechanism loses nothing against the slots."""
import numpy as np
import pytest
from flax import nnx

from jaxcomposer import Trainer
from jaxcomposer.algorithms import GradientClipping, LabelSmoothing, ProgressiveResizing
from jaxcomposer.algorithms.event_forms import (GradientClippingAlgorithm, LabelSmoothingAlgorithm,
                                                ProgressiveResizingAlgorithm)
from jaxcomposer.data import ArrayLoader
from jaxcomposer.models import ResNetCIFAR
from jaxcomposer.models.tasks import ComposerClassifier
from jaxcomposer.optim import DecoupledSGDW
from tests.trainer.helpers import digits, leaves, mlp_task

pytestmark = pytest.mark.xdist_group("event_forms")

BATCHES = 8


def _images():
    d = digits("train", BATCHES * 16)
    return {"input": np.asarray(d["input"]).reshape(-1, 8, 8, 1), "target": d["target"]}


def _cnn():
    return ComposerClassifier(ResNetCIFAR(depth=8, width=4, num_classes=10, in_channels=1, rngs=nnx.Rngs(0)),
                              num_classes=10)


# name -> (slot method, the same as an Algorithm, task, data); ProgressiveResizing's run passes two image sizes
COMPILES = {"loss: label smoothing": 1, "gradient: clipping": 1, "batch: progressive resizing": 2}
PAIRS = {
    "loss: label smoothing": (lambda: LabelSmoothing(0.2), lambda: LabelSmoothingAlgorithm(0.2), mlp_task,
                              lambda: digits("train", BATCHES * 16)),
    "gradient: clipping": (lambda: GradientClipping("norm", 0.5), lambda: GradientClippingAlgorithm("norm", 0.5),
                           mlp_task, lambda: digits("train", BATCHES * 16)),
    "batch: progressive resizing": (lambda: ProgressiveResizing(initial_scale=0.5, finetune_fraction=0.25,
                                                                delay_fraction=0.25),
                                    lambda: ProgressiveResizingAlgorithm(initial_scale=0.5, finetune_fraction=0.25,
                                                                         delay_fraction=0.25),
                                    _cnn, _images),
}


def _train(method, task, data):
    trainer = Trainer(model=task(), train_dataloader=ArrayLoader(data(), 16, shuffle=False),
                      max_duration=f"{BATCHES}ba", optimizers=DecoupledSGDW(lr=0.1, momentum=0.9), seed=0,
                      progress_bar=False, algorithms=[method()])
    trainer.fit()
    return trainer


@pytest.mark.parametrize("pair", list(PAIRS))
def test_an_algorithm_trains_to_the_bits_of_its_slot_version_with_as_many_compiles(pair):
    slot, algorithm, task, data = PAIRS[pair]
    by_slot, by_events = _train(slot, task, data), _train(algorithm, task, data)
    for a, b in zip(leaves(by_slot.state.train_state.params), leaves(by_events.state.train_state.params)):
        np.testing.assert_array_equal(a, b)
    assert by_events.compiled_programs()[1] == by_slot.compiled_programs()[1] == COMPILES[pair]
