"""Schedulers guide (docs/source/trainer/schedulers.rst): a Composer scheduler
(``CosineAnnealingWithWarmupScheduler``, stepped every batch) watched by LRMonitor, then a PyTorch scheduler
(``CosineAnnealingLR``) with ``step_schedulers_every_batch=True``.

A tiny ComposerClassifier with torch SGD (lr 0.1), synthetic data: 4 batches per epoch, 2 epochs.
"""
import math

import torch
from torch.optim.lr_scheduler import CosineAnnealingLR
from torch.utils.data import DataLoader, TensorDataset

from composer import Trainer
from composer.callbacks import LRMonitor
from composer.loggers import InMemoryLogger
from composer.models import ComposerClassifier
from composer.optim import CosineAnnealingWithWarmupScheduler

torch.manual_seed(0)
train_dataloader = DataLoader(TensorDataset(torch.randn(32, 4), torch.randint(0, 3, (32,))), batch_size=8)


def make_model():
    return ComposerClassifier(torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.ReLU(), torch.nn.Linear(8, 3)),
                              num_classes=3)


model = make_model()
optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
logger = InMemoryLogger()
trainer = Trainer(model=model,
                  train_dataloader=train_dataloader,
                  max_duration='2ep',
                  optimizers=optimizer,
                  schedulers=CosineAnnealingWithWarmupScheduler(t_warmup='2ba', alpha_f=0.0),
                  callbacks=[LRMonitor()],
                  loggers=[logger])
trainer.fit()

lrs = [lr for _, lr in logger.data['lr-SGD/group0']]
assert len(lrs) == 8, lrs
peak = max(lrs)
assert all(0.0 <= lr <= 0.1 + 1e-9 for lr in lrs), lrs
assert peak >= 0.05, lrs  # warmed up to (about) the optimizer's lr
assert lrs[0] < peak  # warming up at the start
assert lrs.index(peak) <= 2  # the warmup is 2 batches
assert all(a >= b - 1e-9 for a, b in zip(lrs[lrs.index(peak):], lrs[lrs.index(peak) + 1:]))  # then cosine decay
assert lrs[-1] < 0.02, lrs  # near alpha_f * lr at the end

# A PyTorch scheduler, stepped every batch: after T_max=8 steps CosineAnnealingLR is back at eta_min=0
model = make_model()
optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
trainer = Trainer(
    model=model,
    train_dataloader=train_dataloader,
    max_duration='2ep',
    optimizers=optimizer,
    schedulers=CosineAnnealingLR(optimizer, T_max=8),
    step_schedulers_every_batch=True,
)
trainer.fit()
assert math.isclose(optimizer.param_groups[0]['lr'], 0.0, abs_tol=1e-9), optimizer.param_groups[0]['lr']
