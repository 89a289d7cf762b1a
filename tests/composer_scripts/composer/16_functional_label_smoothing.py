"""Label Smoothing method card (composer/algorithms/label_smoothing/README.md, "Functional Interface"):
``cf.smooth_labels`` in a plain torch training loop.

The card's ``training_loop`` is run on a tiny linear classifier and 2 synthetic batches for 2 epochs.
"""
import torch
import torch.nn.functional as F
from torch.utils.data import DataLoader, TensorDataset

import composer.functional as cf

num_epochs = 2
smoothed = []


def training_loop(model, train_loader):
    opt = torch.optim.Adam(model.parameters())
    loss_fn = F.cross_entropy
    model.train()

    for epoch in range(num_epochs):
        for X, y in train_loader:
            y_hat = model(X)

            # note that if you were to modify the variable y here it is a good
            # idea to set y back to the original targets after computing the loss
            smoothed_targets = cf.smooth_labels(y_hat, y, smoothing=0.1)
            smoothed.append((y, smoothed_targets))

            loss = loss_fn(y_hat, smoothed_targets)
            loss.backward()
            opt.step()
            opt.zero_grad()


torch.manual_seed(0)
train_loader = DataLoader(TensorDataset(torch.randn(16, 6), torch.randint(0, 5, (16,))), batch_size=8)
model = torch.nn.Linear(6, 5)
weight_before = model.weight.detach().clone()
training_loop(model, train_loader)

assert len(smoothed) == 4
for y, smoothed_targets in smoothed:
    assert isinstance(smoothed_targets, torch.Tensor)
    assert smoothed_targets.shape == (8, 5), smoothed_targets.shape
    # targets * (1 - smoothing) + smoothing / n_classes
    expected = F.one_hot(y, 5).float() * 0.9 + 0.1 / 5
    assert torch.allclose(smoothed_targets, expected, atol=1e-6)
    assert torch.allclose(smoothed_targets.sum(dim=1), torch.ones(8))
assert not torch.equal(model.weight.detach(), weight_before)
