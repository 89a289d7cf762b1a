"""Reproducibility (composer.utils.reproducibility's module docstring; ``seed_all`` as in
examples/early_stopping.ipynb): ``seed_all`` before the model is built and ``seed=`` passed to the Trainer give
identical runs; another seed gives another run.

A tiny ComposerClassifier, a shuffling synthetic dataloader, 2 epochs.
"""
import torch
from torch.utils.data import DataLoader, TensorDataset

from jaxcomposer import Trainer
from jaxcomposer.models import ComposerClassifier
from jaxcomposer.utils import reproducibility
from jaxcomposer.utils.reproducibility import seed_all

dataset = TensorDataset(torch.randn(32, 4), torch.randint(0, 3, (32,)))


def run(seed):
    reproducibility.seed_all(seed)
    model = ComposerClassifier(torch.nn.Sequential(torch.nn.Linear(4, 16), torch.nn.ReLU(), torch.nn.Dropout(0.5),
                                                   torch.nn.Linear(16, 3)), num_classes=3)
    initial = [p.detach().clone() for p in model.parameters()]
    trainer = Trainer(
        model=model,
        train_dataloader=DataLoader(dataset, batch_size=8, shuffle=True),
        max_duration='2ep',
        optimizers=torch.optim.SGD(model.parameters(), lr=0.1),
        seed=seed,
    )
    trainer.fit()
    assert trainer.state.seed == seed
    return initial, [p.detach().clone() for p in model.parameters()]


seed_all(42)
first_a = torch.rand(3)
seed_all(42)
first_b = torch.rand(3)
assert torch.equal(first_a, first_b)

initial_1, final_1 = run(42)
initial_2, final_2 = run(42)
initial_3, final_3 = run(7)
assert all(torch.equal(a, b) for a, b in zip(initial_1, initial_2))
assert all(torch.equal(a, b) for a, b in zip(final_1, final_2)), 'same seed, different weights'
assert not all(torch.equal(a, b) for a, b in zip(initial_1, initial_3))
assert not all(torch.equal(a, b) for a, b in zip(final_1, final_3))
assert not all(torch.equal(a, b) for a, b in zip(initial_1, final_1))  # it trained
