"""ComposerModel guide (docs/source/composer_model.rst, "Metrics" and "Multiple Metrics"): ``eval_forward``,
``update_metric`` and ``get_metrics`` with torchmetrics' MulticlassAccuracy and Composer's CrossEntropy, logged
to an InMemoryLogger (docs/source/trainer/logging.rst).

The docs' torchvision ResNet-18 is replaced by a tiny CNN; the data by synthetic tensors (2 batches per epoch).
"""
import torch
import torch.nn.functional as F
from torch.utils.data import DataLoader, TensorDataset
from torchmetrics.classification import MulticlassAccuracy

from composer import Trainer
from composer.loggers import InMemoryLogger
from composer.metrics import CrossEntropy
from composer.models import ComposerModel


class ResNet18(ComposerModel):

    def __init__(self):
        super().__init__()
        self.model = torch.nn.Sequential(
            torch.nn.Conv2d(3, 8, 3, stride=2, padding=1), torch.nn.ReLU(),
            torch.nn.AdaptiveAvgPool2d(1), torch.nn.Flatten(), torch.nn.Linear(8, 10))
        self.train_cross_entropy = CrossEntropy()
        self.val_cross_entropy = CrossEntropy()
        self.train_accuracy = MulticlassAccuracy(num_classes=10, average='micro')
        self.val_accuracy = MulticlassAccuracy(num_classes=10, average='micro')

    def forward(self, batch):
        inputs, _ = batch
        return self.model(inputs)

    def loss(self, outputs, batch):
        _, targets = batch
        return F.cross_entropy(outputs, targets)

    def eval_forward(self, batch, outputs=None):
        if outputs is not None:
            return outputs
        inputs, _ = batch
        return self.model(inputs)

    def update_metric(self, batch, outputs, metric):
        _, targets = batch
        metric.update(outputs, targets)

    def get_metrics(self, is_train=False):
        # defines which metrics to use in each phase of training
        if is_train:
            metrics = {'CrossEntropy': self.train_cross_entropy, 'MulticlassAccuracy': self.train_accuracy}
        else:
            metrics = {'CrossEntropy': self.val_cross_entropy, 'MulticlassAccuracy': self.val_accuracy}
        return metrics


torch.manual_seed(0)
train_dataloader = DataLoader(TensorDataset(torch.randn(16, 3, 16, 16), torch.randint(0, 10, (16,))), batch_size=8)
eval_dataloader = DataLoader(TensorDataset(torch.randn(16, 3, 16, 16), torch.randint(0, 10, (16,))), batch_size=8)

model = ResNet18()
logger = InMemoryLogger()
trainer = Trainer(
    model=model,
    train_dataloader=train_dataloader,
    eval_dataloader=eval_dataloader,
    max_duration="2ep",
    optimizers=[torch.optim.SGD(model.parameters(), lr=0.01)],
    loggers=[logger],
)
trainer.fit()

# Get data from logger. If you are using multiple loggers, be sure to confirm
# which index in trainer.logger.destinations contains your desired logger.
logged_data = trainer.logger.destinations[0].data
assert logger in trainer.logger.destinations
assert len(logged_data['loss/train/total']) == 4  # one per batch
for key in ('metrics/eval/MulticlassAccuracy', 'metrics/eval/CrossEntropy'):
    assert len(logged_data[key]) == 2, (key, logged_data.get(key))  # evaluated once per epoch (eval_interval=1)
# training metrics are off by default (compute_training_metrics=False)
assert 'metrics/train/MulticlassAccuracy' not in logged_data

eval_metrics = trainer.state.eval_metrics['eval']
assert set(eval_metrics) == {'CrossEntropy', 'MulticlassAccuracy'}, eval_metrics.keys()
accuracy = float(eval_metrics['MulticlassAccuracy'].compute())
assert 0.0 <= accuracy <= 1.0
assert abs(float(logger.most_recent_values['metrics/eval/MulticlassAccuracy']) - accuracy) < 1e-6

timeseries = logger.get_timeseries('metrics/eval/MulticlassAccuracy')
assert list(timeseries['epoch']) == [1, 2], timeseries['epoch']
assert len(timeseries['metrics/eval/MulticlassAccuracy']) == 2
