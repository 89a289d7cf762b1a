"""What a user's script does with jaxcomposer's public names; mypy checks it (tests/test_public_api.py)."""
from typing import Iterable

import optax
from flax import nnx

import jaxcomposer
from jaxcomposer import ComposerClassifier, Event, Time, Trainer
from jaxcomposer import functional as cf
from jaxcomposer.algorithms import EMA, BlurPool, LabelSmoothing, MixUp, apply_blurpool
from jaxcomposer.callbacks import LRMonitor
from jaxcomposer.models import MLP
from jaxcomposer.optim import CosineAnnealingWithWarmupScheduler, DecoupledSGDW


def build(loader: Iterable[dict]) -> Trainer:
    model = ComposerClassifier(MLP(784, hidden=(32,), num_classes=10, rngs=nnx.Rngs(0)), num_classes=10)
    methods = [MixUp(alpha=0.2), LabelSmoothing(smoothing=0.1), EMA(half_life="10ba"), BlurPool()]
    return Trainer(model=model, train_dataloader=loader, max_duration="2ep", algorithms=methods,
                   optimizers=DecoupledSGDW(lr=0.1), schedulers=[CosineAnnealingWithWarmupScheduler("1ep")],
                   callbacks=[LRMonitor()], seed=0)


def read_back(trainer: Trainer) -> int:
    trainer.fit(duration="1ep")
    assert trainer.state.timestamp.batch >= Time.from_input("1ba").value
    return int(trainer.state.timestamp.epoch)


ALL_NAMES = (jaxcomposer.fit, jaxcomposer.Algorithm, jaxcomposer.Callback, jaxcomposer.State, jaxcomposer.Evaluator,
             jaxcomposer.DataSpec, jaxcomposer.algorithms.REGISTRY, cf.mixup_batch, cf.smooth_labels, apply_blurpool,
             Event.BATCH_END, optax.sgd)
