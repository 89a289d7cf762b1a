"""Gradient accumulation with ``device_train_microbatch_size`` (the Trainer's API reference; "Using the Trainer"
tips): the batch of 16 is run as 4 microbatches of 4, and the update equals the one of the whole batch.

A tiny ComposerClassifier (no batch norm, no dropout) with torch SGD, synthetic data, 2 epochs of 2 batches; the
same run without microbatching is the reference.
"""
import torch
from torch.utils.data import DataLoader, TensorDataset

from jaxcomposer import Trainer
from jaxcomposer.models import ComposerClassifier

dataset = TensorDataset(torch.randn(32, 4), torch.randint(0, 3, (32,)))


def run(microbatch_size):
    torch.manual_seed(0)
    model = ComposerClassifier(torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.ReLU(), torch.nn.Linear(8, 3)),
                               num_classes=3)
    trainer = Trainer(
        model=model,
        train_dataloader=DataLoader(dataset, batch_size=16),
        max_duration='2ep',
        optimizers=torch.optim.SGD(model.parameters(), lr=0.5),
        device_train_microbatch_size=microbatch_size,
        seed=0,
    )
    trainer.fit()
    assert trainer.state.device_train_microbatch_size == microbatch_size
    assert int(trainer.state.timestamp.batch) == 4 and int(trainer.state.timestamp.sample) == 64
    return [p.detach().clone() for p in model.parameters()]


whole = run(16)
accumulated = run(4)
for a, b in zip(whole, accumulated):
    assert torch.allclose(a, b, atol=1e-5), (a - b).abs().max()
