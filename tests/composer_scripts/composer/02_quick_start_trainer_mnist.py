"""Quick Start, second block (docs/source/getting_started/quick_start.rst): the Trainer with a recipe.

The docs train ``mnist_model`` on torchvision's MNIST (``download=True``); the dataset is replaced by 32
synthetic 1x28x28 images (two batches of 16); the Trainer call is as in the docs.
"""
import torch
from torch.utils.data import DataLoader, TensorDataset

from composer import Trainer
from composer.models import mnist_model
from composer.algorithms import LabelSmoothing, CutMix, ChannelsLast

torch.manual_seed(0)
dataset = TensorDataset(torch.rand(32, 1, 28, 28), torch.randint(0, 10, (32,)))
train_dataloader = DataLoader(dataset, batch_size=16)

trainer = Trainer(
    model=mnist_model(num_classes=10),
    train_dataloader=train_dataloader,
    max_duration="2ep",
    algorithms=[
        LabelSmoothing(smoothing=0.1),
        CutMix(alpha=1.0),
        ChannelsLast(),
        ]
)
fc2_before = trainer.state.model.module.fc2.weight.detach().clone()
trainer.fit()

timestamp = trainer.state.timestamp
assert int(timestamp.epoch) == 2, timestamp
assert int(timestamp.batch) == 4, timestamp
assert int(timestamp.sample) == 64, timestamp
# ChannelsLast converted the model's 4-D weights to channels_last on Event.INIT
conv2_weight = trainer.state.model.module.conv2.weight
assert conv2_weight.is_contiguous(memory_format=torch.channels_last)
# and the model was trained in place
assert not torch.equal(trainer.state.model.module.fc2.weight.detach(), fc2_before)
