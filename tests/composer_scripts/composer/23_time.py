"""Time guide (docs/source/trainer/time.rst): ``Time`` and ``TimeUnit``, time strings, ``max_duration`` in
batches, and the ``state.timestamp`` the Trainer keeps.

A tiny ComposerClassifier on synthetic data: 4 batches per epoch, trained for "6ba".
"""
import torch
from torch.utils.data import DataLoader, TensorDataset

from composer import Time, TimeUnit, Trainer
from composer.models import ComposerClassifier

t = Time(value=20, unit="ep")
assert t == Time(20, TimeUnit.EPOCH) == Time.from_timestring("20ep")
assert t.value == 20 and t.unit == TimeUnit.EPOCH
assert Time.from_timestring("10ba") + Time.from_timestring("5ba") == Time(15, TimeUnit.BATCH)
assert Time.from_timestring("10ba") < Time.from_timestring("20ba")
assert Time.from_timestring("0.5dur").unit == TimeUnit.DURATION
assert Time(3, TimeUnit.SAMPLE).to_timestring() == "3sp"

torch.manual_seed(0)
train_dataloader = DataLoader(TensorDataset(torch.randn(32, 4), torch.randint(0, 3, (32,))), batch_size=8)
model = ComposerClassifier(torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.ReLU(), torch.nn.Linear(8, 3)),
                           num_classes=3)
trainer = Trainer(model=model, train_dataloader=train_dataloader, max_duration="6ba")
assert trainer.state.max_duration == Time(6, TimeUnit.BATCH)
trainer.fit()

timestamp = trainer.state.timestamp
assert timestamp.batch == Time(6, TimeUnit.BATCH), timestamp
assert int(timestamp.epoch) == 1  # one full epoch of 4 batches, then 2 more
assert int(timestamp.batch_in_epoch) == 2
assert int(timestamp.sample) == 48 and int(timestamp.sample_in_epoch) == 16
assert trainer.state.get_elapsed_duration() == Time(1.0, TimeUnit.DURATION)
