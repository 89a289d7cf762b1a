"""Logging guide (docs/source/trainer/logging.rst): ``FileLogger(filename="log.txt")`` passed in ``loggers``.

The docs pair it with WandB/MLflow/Comet/Neptune loggers, left out here (no network). ``trainer.close()`` flushes
and closes the loggers before the file is read. Synthetic data, a tiny ComposerClassifier.
"""
import os

import torch
from torch.utils.data import DataLoader, TensorDataset

from composer import Trainer
from composer.loggers import FileLogger
from composer.models import ComposerClassifier

torch.manual_seed(0)
train_dataloader = DataLoader(TensorDataset(torch.randn(16, 4), torch.randint(0, 3, (16,))), batch_size=8)
eval_dataloader = DataLoader(TensorDataset(torch.randn(16, 4), torch.randint(0, 3, (16,))), batch_size=8)
model = ComposerClassifier(torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.ReLU(), torch.nn.Linear(8, 3)),
                           num_classes=3)

file_logger = FileLogger(filename="log.txt")

trainer = Trainer(
    model=model,
    train_dataloader=train_dataloader,
    eval_dataloader=eval_dataloader,
    max_duration="2ep",
    loggers=[file_logger],
)
trainer.fit()
trainer.close()

assert os.path.isfile("log.txt")
with open("log.txt") as f:
    text = f.read()
assert "loss/train/total" in text, text[:2000]
assert "metrics/eval/MulticlassAccuracy" in text, text[:2000]
assert text.count("loss/train/total") >= 4  # one line per batch (log_interval=1)
