"""BlurPool method card (composer/algorithms/blurpool/README.md, "Functional Interface"): ``cf.apply_blurpool``
after the optimizer is created (so the optimizer is passed in), then a plain torch training loop.

The card's loop runs 10 epochs on its ``train_loader``; here a small CNN (a max-pool and a strided convolution on
16 channels) trains 2 epochs on 2 synthetic batches.
"""
import jaxcomposer.functional as cf
import torch
import torch.nn.functional as F
from torch.utils.data import DataLoader, TensorDataset

from jaxcomposer.algorithms.blurpool import BlurConv2d, BlurMaxPool2d

num_epochs = 2


def training_loop(model, train_loader):
    opt = torch.optim.Adam(model.parameters())

    # only need to pass in opt if apply_blurpool is used after optimizer
    # creation; otherwise only the model needs to be passed in
    cf.apply_blurpool(
        model,
        optimizers=opt,
        replace_convs=True,
        replace_maxpools=True,
        blur_first=True
    )

    loss_fn = F.cross_entropy
    model.train()

    for epoch in range(num_epochs):
        for X, y in train_loader:
            y_hat = model(X)
            loss = loss_fn(y_hat, y)
            loss.backward()
            opt.step()
            opt.zero_grad()
    return opt


torch.manual_seed(0)
model = torch.nn.Sequential(
    torch.nn.Conv2d(3, 16, 3, padding=1), torch.nn.ReLU(),
    torch.nn.MaxPool2d(2),
    torch.nn.Conv2d(16, 32, 3, stride=2, padding=1), torch.nn.ReLU(),
    torch.nn.AdaptiveAvgPool2d(1), torch.nn.Flatten(), torch.nn.Linear(32, 10))
train_loader = DataLoader(TensorDataset(torch.randn(16, 3, 16, 16), torch.randint(0, 10, (16,))), batch_size=8)
strided_weight_before = model[3].weight.detach().clone()

opt = training_loop(model, train_loader)

assert isinstance(model[2], BlurMaxPool2d), type(model[2])
assert isinstance(model[3], BlurConv2d), type(model[3])
# the optimizer now holds the surgically replaced modules' parameters, and trained them
optimizer_params = {id(p) for group in opt.param_groups for p in group['params']}
assert all(id(p) in optimizer_params for p in model.parameters())
blurred_conv_weight = next(m for m in model[3].modules() if isinstance(m, torch.nn.Conv2d)).weight
assert blurred_conv_weight.shape == strided_weight_before.shape
assert not torch.equal(blurred_conv_weight.detach(), strided_weight_before)
