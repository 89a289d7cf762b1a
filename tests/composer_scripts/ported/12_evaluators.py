"""Evaluation guide (docs/source/trainer/evaluation.rst, "Multiple Datasets"): two Evaluators with their own
labels and ``metric_names``, passed as a list in ``eval_dataloader``; ``eval_interval``.

The docs' GLUE dataloaders are synthetic 2-class tensors here; the model is a tiny ComposerClassifier (its
eval metrics: CrossEntropy and MulticlassAccuracy).
"""
import torch
from torch.utils.data import DataLoader, TensorDataset

from jaxcomposer import Trainer
from jaxcomposer.core import Evaluator
from jaxcomposer.loggers import InMemoryLogger
from jaxcomposer.models import ComposerClassifier

torch.manual_seed(0)


def synthetic_loader(n):
    return DataLoader(TensorDataset(torch.randn(n, 4), torch.randint(0, 2, (n,))), batch_size=8)


train_dataloader = synthetic_loader(16)
mrpc_dataloader = synthetic_loader(16)
mnli_dataloader = synthetic_loader(8)

glue_mrpc_task = Evaluator(
    label='glue_mrpc',
    dataloader=mrpc_dataloader,
    metric_names=['CrossEntropy', 'MulticlassAccuracy']
)

glue_mnli_task = Evaluator(
    label='glue_mnli',
    dataloader=mnli_dataloader,
    metric_names=['MulticlassAccuracy']
)

model = ComposerClassifier(torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.ReLU(), torch.nn.Linear(8, 2)),
                           num_classes=2)
logger = InMemoryLogger()
trainer = Trainer(
    model=model,
    train_dataloader=train_dataloader,
    max_duration="2ep",
    eval_dataloader=[glue_mrpc_task, glue_mnli_task],
    eval_interval="1ep",
    loggers=[logger],
)
trainer.fit()

assert set(trainer.state.eval_metrics) == {'glue_mrpc', 'glue_mnli'}, trainer.state.eval_metrics.keys()
assert set(trainer.state.eval_metrics['glue_mrpc']) == {'CrossEntropy', 'MulticlassAccuracy'}
assert set(trainer.state.eval_metrics['glue_mnli']) == {'MulticlassAccuracy'}
for key in ('metrics/glue_mrpc/CrossEntropy', 'metrics/glue_mrpc/MulticlassAccuracy',
            'metrics/glue_mnli/MulticlassAccuracy'):
    assert len(logger.data[key]) == 2, (key, sorted(logger.data))
assert 'metrics/glue_mnli/CrossEntropy' not in logger.data
assert 'metrics/eval/MulticlassAccuracy' not in logger.data
