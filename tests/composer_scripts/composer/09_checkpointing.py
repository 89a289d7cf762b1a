"""Checkpointing guide (docs/source/trainer/checkpointing.rst): ``save_folder``, ``save_filename``,
``save_latest_filename``, ``save_overwrite``, then resuming with ``load_path``.

Synthetic data (2 batches per epoch), a tiny ComposerClassifier with a torch SGD optimizer.
"""
import os

import torch
from torch.utils.data import DataLoader, TensorDataset

from composer import Trainer
from composer.models import ComposerClassifier


def make_model():
    torch.manual_seed(0)
    return ComposerClassifier(torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.ReLU(), torch.nn.Linear(8, 3)),
                              num_classes=3)


train_dataloader = DataLoader(TensorDataset(torch.randn(16, 4), torch.randint(0, 3, (16,))), batch_size=8)
model = make_model()

trainer = Trainer(
    model=model,
    train_dataloader=train_dataloader,
    max_duration="2ep",
    optimizers=torch.optim.SGD(model.parameters(), lr=0.1),
    save_folder="./path/to/checkpoints",
    save_filename="ep{epoch}",
    save_latest_filename="latest",
    save_overwrite=True,
)

trainer.fit()

# By default, checkpoints are saved every epoch: ep1 and ep2, and 'latest' links to the last one
files = set(os.listdir("./path/to/checkpoints"))
assert {"ep1", "ep2", "latest"} <= files, files
assert os.path.islink("./path/to/checkpoints/latest")
assert os.path.basename(os.readlink("./path/to/checkpoints/latest")) == "ep2"
final_weight = trainer.state.model.module[2].weight.detach().clone()

# Resume from the first epoch's checkpoint and train the second epoch again
model = make_model()
trainer = Trainer(
    model=model,
    train_dataloader=train_dataloader,
    max_duration="2ep",
    optimizers=torch.optim.SGD(model.parameters(), lr=0.1),
    load_path="./path/to/checkpoints/ep1",
)
assert int(trainer.state.timestamp.epoch) == 1, trainer.state.timestamp
assert int(trainer.state.timestamp.batch) == 2, trainer.state.timestamp
trainer.fit()
assert int(trainer.state.timestamp.epoch) == 2 and int(trainer.state.timestamp.batch) == 4
# same data order, same weights at ep1 and the same second epoch: the uninterrupted run's weights
assert torch.allclose(trainer.state.model.module[2].weight.detach(), final_weight, atol=1e-6)
