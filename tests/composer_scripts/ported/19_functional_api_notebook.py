"""Functional API notebook (examples/functional_api.ipynb): the notebook's ``Net`` and ``train_and_eval`` loop,
ColOut added to the training transforms (``cf.colout_batch`` on each image), then
``cf.apply_squeeze_excite(model, latent_channels=64, min_channels=16)``.

Differences: CIFAR-10 (downloaded there) is replaced by 16 synthetic 3x32x32 images per split, wrapped in a small
Dataset that applies the transforms (torchvision's ``transforms.Compose`` is not installed); tqdm's notebook bar
is left out; ``num_epochs`` is 2.
"""
import torch
import torch.utils.data
import torch.nn as nn
import torch.nn.functional as F

import jaxcomposer.functional as cf # <-- Imports Composer's functional API
from jaxcomposer.algorithms.squeeze_excite import SqueezeExciteConv2d

batch_size = 8


class SyntheticCIFAR10(torch.utils.data.Dataset):
    def __init__(self, n, transform=None):
        self.images = torch.rand(n, 3, 32, 32)
        self.labels = torch.randint(0, 10, (n,))
        self.transform = transform

    def __len__(self):
        return len(self.labels)

    def __getitem__(self, index):
        image = (self.images[index] - 0.5) / 0.5  # transforms.Normalize((0.5, 0.5, 0.5), (0.5, 0.5, 0.5))
        if self.transform is not None:
            image = self.transform(image)
        return image, self.labels[index]


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv1 = nn.Conv2d(3, 16, kernel_size=(3, 3), stride=2)
        self.conv2 = nn.Conv2d(16, 32, kernel_size=(3, 3))
        self.norm = nn.BatchNorm2d(32)
        self.pool = nn.AdaptiveAvgPool2d(1)
        self.fc1 = nn.Linear(32, 128)
        self.fc2 = nn.Linear(128, 64)
        self.fc3 = nn.Linear(64, 10)

    def forward(self, x):
        x = F.relu(self.conv1(x))
        x = self.conv2(x)
        x = F.relu(self.norm(x))
        x = torch.flatten(self.pool(x), 1)
        x = F.relu(self.fc1(x))
        x = F.relu(self.fc2(x))
        x = self.fc3(x)
        return x


num_epochs = 2
accuracies = []


def train_and_eval(model, train_loader, test_loader):
    # set up the model and optimizer
    torch.manual_seed(42)
    device = 'cuda' if torch.cuda.is_available() else 'cpu'
    model = model.to(device)
    opt = torch.optim.Adam(model.parameters())
    # Run one or more epochs
    for epoch in range(num_epochs):
        print(f"---- Beginning epoch {epoch} ----")
        model.train()
        # Train on an epoch of minibatches
        for X, y in train_loader:
            X = X.to(device)
            y = y.to(device)
            y_hat = model(X)
            loss = F.cross_entropy(y_hat, y)
            print(f"train loss: {loss.item():.4f}")
            loss.backward()
            opt.step()
            opt.zero_grad()
        # Evaluate the model at the end of the epoch
        model.eval()
        num_right = 0
        eval_size = 0
        for X, y in test_loader:
            X = X.to(device)
            y = y.to(device)
            y_hat = model(X)
            num_right += (y_hat.argmax(dim=1) == y).sum().item()
            eval_size += len(y)
        acc_percent = 100 * num_right / eval_size
        accuracies.append(acc_percent)
        print(f"Epoch {epoch} validation accuracy: {acc_percent:.2f}%")


torch.manual_seed(0)
trainset = SyntheticCIFAR10(16)
testset = SyntheticCIFAR10(16)
trainloader = torch.utils.data.DataLoader(trainset, batch_size=batch_size, shuffle=True)
testloader = torch.utils.data.DataLoader(testset, batch_size=batch_size, shuffle=False)

model = Net()
train_and_eval(model, trainloader, testloader)

# Add ColOut to the transforms used during training
trainset = SyntheticCIFAR10(16, transform=cf.colout_batch)
trainloader = torch.utils.data.DataLoader(trainset, batch_size=batch_size, shuffle=True)
images, _ = next(iter(trainloader))
# 15% of the rows and of the columns dropped: int(0.85 * 32) = 27 of each kept
assert images.shape == (batch_size, 3, 27, 27), images.shape

model = Net()
# only use one data augmentation since our small model runs quickly
# and allows the dataloader little time to do anything fancy
train_and_eval(model, trainloader, testloader)

# squeeze-excite can add a lot of overhead for small
# conv2d operations, so only add it after convs with a
# minimum number of channels
cf.apply_squeeze_excite(model, latent_channels=64, min_channels=16)
# an SE block goes after a conv when min(in_channels, out_channels) >= min_channels: conv2 (16 -> 32), not conv1
assert isinstance(model.conv2, SqueezeExciteConv2d), type(model.conv2)
assert not isinstance(model.conv1, SqueezeExciteConv2d)

train_and_eval(model, trainloader, testloader)
assert len(accuracies) == 3 * num_epochs
assert all(0.0 <= a <= 100.0 for a in accuracies)
