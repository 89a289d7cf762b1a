"""Callbacks guide (docs/source/trainer/callbacks.rst, "Using Callbacks"): SpeedMonitor and LRMonitor.

The docs log them to ``WandBLogger()``; an InMemoryLogger takes its place (no network). ``window_size`` is 2
instead of 100 so that the 6 batches of this run fill the window. Synthetic data, a tiny ComposerClassifier,
a torch SGD optimizer.
"""
import torch
from torch.utils.data import DataLoader, TensorDataset

from jaxcomposer import Trainer
from jaxcomposer.callbacks import SpeedMonitor, LRMonitor
from jaxcomposer.loggers import InMemoryLogger
from jaxcomposer.models import ComposerClassifier

torch.manual_seed(0)
train_dataloader = DataLoader(TensorDataset(torch.randn(48, 4), torch.randint(0, 3, (48,))), batch_size=8)
model = ComposerClassifier(torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.ReLU(), torch.nn.Linear(8, 3)),
                           num_classes=3)
optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
in_memory_logger = InMemoryLogger()

trainer = Trainer(model=model,
        train_dataloader=train_dataloader,
        optimizers=optimizer,
        eval_dataloader=None,
        max_duration='1ep',
        callbacks=[SpeedMonitor(window_size=2), LRMonitor()],
        loggers=[in_memory_logger])
trainer.fit()

data = in_memory_logger.data
# LRMonitor: one value per batch, under 'lr-{optimizer class}/group{index}'
assert 'lr-SGD/group0' in data, sorted(data)
assert [value for _, value in data['lr-SGD/group0']] == [0.1] * 6, data['lr-SGD/group0']
# SpeedMonitor: throughput once the window is full, wall-clock every batch
for key in ('throughput/batches_per_sec', 'throughput/samples_per_sec'):
    assert key in data, (key, sorted(data))
    assert all(value > 0 for _, value in data[key])
assert 'wall_clock/train' in data and len(data['wall_clock/train']) == 6, sorted(data)
assert 'wall_clock/total' in data
assert len(data['loss/train/total']) == 6
