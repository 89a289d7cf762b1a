"""MixUp method card (composer/algorithms/mixup/README.md, "Functional Interface"): ``cf.mixup_batch`` in a plain
torch loop, first with index labels interpolating the loss, then with dense labels interpolating the labels.

Both of the card's loops run on a tiny classifier over 2 synthetic batches for 2 epochs.
"""
import torch
import torch.nn.functional as F
from torch.utils.data import DataLoader, TensorDataset

import jaxcomposer.functional as cf

num_epochs = 2
seen = []


def training_loop(model, train_loader):
    opt = torch.optim.Adam(model.parameters())
    loss_fn = F.cross_entropy
    model.train()

    for epoch in range(num_epochs):
        for X, y in train_loader:
            X_mixed, y_perm, mixing = cf.mixup_batch(X, y, alpha=0.2)
            seen.append((X, y, X_mixed, y_perm, mixing))
            y_hat = model(X_mixed)
            loss = (1 - mixing) * loss_fn(y_hat, y) + mixing * loss_fn(y_hat, y_perm)
            loss.backward()
            opt.step()
            opt.zero_grad()


def dense_training_loop(model, train_loader):
    opt = torch.optim.Adam(model.parameters())
    loss_fn = F.cross_entropy
    model.train()

    for epoch in range(num_epochs):
        for X, y in train_loader:
            X_mixed, y_perm, mixing = cf.mixup_batch(X, y, alpha=0.2)
            y_mixed = (1 - mixing) * y + mixing * y_perm
            seen_dense.append(y_mixed)
            y_hat = model(X_mixed)
            loss = loss_fn(y_hat, y_mixed)
            loss.backward()
            opt.step()
            opt.zero_grad()


torch.manual_seed(0)
images, labels = torch.randn(16, 3, 8, 8), torch.randint(0, 4, (16,))
train_loader = DataLoader(TensorDataset(images, labels), batch_size=8)
model = torch.nn.Sequential(torch.nn.Flatten(), torch.nn.Linear(3 * 8 * 8, 4))
training_loop(model, train_loader)

assert len(seen) == 4
for X, y, X_mixed, y_perm, mixing in seen:
    mixing = float(mixing)
    assert 0.0 <= mixing <= 1.0
    assert X_mixed.shape == X.shape and isinstance(X_mixed, torch.Tensor)
    assert sorted(y_perm.tolist()) == sorted(y.tolist())  # a permutation of the batch's labels
    # each mixed example is (1 - mixing) * x_i + mixing * x_j for the j whose label y_perm[i] carries
    for i in range(X.shape[0]):
        assert any(torch.allclose(X_mixed[i], (1 - mixing) * X[i] + mixing * X[j], atol=1e-5)
                   and int(y_perm[i]) == int(y[j]) for j in range(X.shape[0])), i

seen_dense = []
dense_labels = F.one_hot(labels, 4).float()
dense_loader = DataLoader(TensorDataset(images, dense_labels), batch_size=8)
dense_training_loop(model, dense_loader)
assert len(seen_dense) == 4
for y_mixed in seen_dense:
    assert y_mixed.shape == (8, 4)
    assert torch.allclose(y_mixed.sum(dim=1), torch.ones(8), atol=1e-6)
