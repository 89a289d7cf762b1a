"""Trainer.predict's docstring (composer/trainer/trainer.py): a PredictionSaver callback that writes each
batch's ``state.outputs`` at PREDICT_BATCH_END, with ``return_outputs=False``.

``State`` is imported (the docstring's doctest setup provides it). The Trainer's ``...`` is filled in with a tiny
ComposerClassifier and a synthetic train_dataloader, which the docstring also predicts on.
"""
import os
import torch

from torch.utils.data import DataLoader, TensorDataset

from composer import Trainer, Callback, State
from composer.loggers import Logger
from composer.models import ComposerClassifier


class PredictionSaver(Callback):
    def __init__(self, folder: str):
        self.folder = folder
        os.makedirs(self.folder, exist_ok=True)

    def predict_batch_end(self, state: State, logger: Logger) -> None:
        name = f'batch_{int(state.predict_timestamp.batch)}.pt'
        filepath = os.path.join(self.folder, name)
        torch.save(state.outputs, filepath)

        # Also upload the files
        logger.upload_file(remote_file_name=name, file_path=filepath)


torch.manual_seed(0)
train_dataloader = DataLoader(TensorDataset(torch.randn(16, 4), torch.randint(0, 3, (16,))), batch_size=8)
predict_dl = train_dataloader
model = ComposerClassifier(torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.ReLU(), torch.nn.Linear(8, 3)),
                           num_classes=3)

trainer = Trainer(
    model=model,
    train_dataloader=train_dataloader,
    max_duration='1ep',
    callbacks=PredictionSaver('./predict_outputs'),
)

trainer.predict(predict_dl, return_outputs=False)

print(sorted(os.listdir('./predict_outputs')))
assert sorted(os.listdir('./predict_outputs')) == ['batch_1.pt', 'batch_2.pt']
outputs = torch.load('./predict_outputs/batch_1.pt')
assert tuple(outputs.shape) == (8, 3), outputs.shape
