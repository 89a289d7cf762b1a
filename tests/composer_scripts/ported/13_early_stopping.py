"""Early stopping (EarlyStopper's docstring, docs/source/notes/early_stopping.rst, examples/early_stopping.ipynb):
EarlyStopper on an Evaluator's metric, then ThresholdStopper.

To make the stop deterministic on random data: the EarlyStopper asks for an improvement larger than
``min_delta=1.0`` (an accuracy can never improve that much), so with ``patience=1`` (stop once more than one
epoch has passed since the best value, set at epoch 1) it stops after the third epoch's evaluation; the
ThresholdStopper (``comp=torch.less``) stops once the eval CrossEntropy is below 100, i.e. after the first epoch. ``max_duration`` is 10 epochs for both. Synthetic data, 2 batches per epoch.
"""
import torch
from torch.utils.data import DataLoader, TensorDataset

from jaxcomposer import Evaluator, Trainer
from jaxcomposer.callbacks import EarlyStopper, ThresholdStopper
from jaxcomposer.models import ComposerClassifier

torch.manual_seed(0)
train_dataloader = DataLoader(TensorDataset(torch.randn(16, 4), torch.randint(0, 3, (16,))), batch_size=8)
eval_dataloader = DataLoader(TensorDataset(torch.randn(16, 4), torch.randint(0, 3, (16,))), batch_size=8)
model = ComposerClassifier(torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.ReLU(), torch.nn.Linear(8, 3)),
                           num_classes=3)
optimizer = torch.optim.SGD(model.parameters(), lr=0.1)

# constructing trainer object with this callback
early_stopper = EarlyStopper('MulticlassAccuracy', 'my_evaluator', patience=1, min_delta=1.0)
evaluator = Evaluator(
    dataloader = eval_dataloader,
    label = 'my_evaluator',
    metric_names = ['MulticlassAccuracy']
)
trainer = Trainer(
    model=model,
    train_dataloader=train_dataloader,
    eval_dataloader=evaluator,
    optimizers=optimizer,
    max_duration="10ep",
    callbacks=[early_stopper],
)
trainer.fit()
assert int(trainer.state.timestamp.epoch) == 3, trainer.state.timestamp
assert int(trainer.state.timestamp.batch) == 6, trainer.state.timestamp

threshold_stopper = ThresholdStopper("CrossEntropy", "ce_evaluator", threshold=100.0, comp=torch.less)
ce_evaluator = Evaluator(dataloader=eval_dataloader, label='ce_evaluator', metric_names=['CrossEntropy'])
trainer = Trainer(
    model=model,
    train_dataloader=train_dataloader,
    eval_dataloader=ce_evaluator,
    max_duration="10ep",
    optimizers=optimizer,
    callbacks=[threshold_stopper],  # Instruct the trainer to use our threshold stopper callback
)
trainer.fit()
assert int(trainer.state.timestamp.epoch) == 1, trainer.state.timestamp
assert int(trainer.state.timestamp.batch) == 2, trainer.state.timestamp
