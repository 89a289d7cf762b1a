"""ComposerModel guide (docs/source/composer_model.rst, "Using your own Model"): a ComposerModel with
``forward(batch)`` and ``loss(outputs, batch)``, a torch optimizer built from ``model.parameters()``.

The docs wrap ``torchvision.models.resnet18()``; torchvision is not installed here, so a tiny CNN stands in
(the class keeps the docs' name). The dataloader is synthetic: 32 3x32x32 images, four batches of 8.
"""
import torch
import torch.nn.functional as F
import torch.optim as optim
from torch.utils.data import DataLoader, TensorDataset

from jaxcomposer.models import ComposerModel
from jaxcomposer import Trainer


class ResNet18(ComposerModel):

    def __init__(self):
        super().__init__()
        self.model = torch.nn.Sequential(
            torch.nn.Conv2d(3, 8, 3, stride=2, padding=1), torch.nn.ReLU(),
            torch.nn.Conv2d(8, 16, 3, stride=2, padding=1), torch.nn.ReLU(),
            torch.nn.AdaptiveAvgPool2d(1), torch.nn.Flatten(), torch.nn.Linear(16, 10))

    def forward(self, batch): # batch is the output of the dataloader
        # specify how batches are passed through the model
        inputs, _ = batch
        return self.model(inputs)

    def loss(self, outputs, batch):
        # pass batches and `forward` outputs to the loss
        _, targets = batch
        return F.cross_entropy(outputs, targets)


torch.manual_seed(0)
train_dataloader = DataLoader(TensorDataset(torch.randn(32, 3, 32, 32), torch.randint(0, 10, (32,))), batch_size=8)

model = ResNet18()
optimizer = optim.Adam(model.parameters(), lr=0.0001)
params_before = [p.detach().clone() for p in model.parameters()]

trainer = Trainer(
    model=model,
    optimizers=optimizer,
    train_dataloader=train_dataloader,
    max_duration='2ep'
)
trainer.fit()

assert trainer.state.model is model
assert trainer.state.optimizers[0] is optimizer
assert int(trainer.state.timestamp.epoch) == 2 and int(trainer.state.timestamp.batch) == 8
# the module the user holds was trained: every parameter moved
for before, after in zip(params_before, model.parameters()):
    assert not torch.equal(before, after.detach())
# and the torch optimizer the user built did the steps (Adam's step count, one per batch)
first_param = next(model.parameters())
assert int(optimizer.state[first_param]['step']) == 8, optimizer.state[first_param]['step']
