"""Trainer.eval and Trainer.predict (Trainer API reference, docs/source/trainer/evaluation.rst): evaluate after
fit on the eval_dataloader given to the Trainer and on another one, then collect predictions.

Synthetic data, a tiny ComposerClassifier (its default eval metrics: CrossEntropy and MulticlassAccuracy).
"""
import torch
from torch.utils.data import DataLoader, TensorDataset

from composer import Trainer
from composer.models import ComposerClassifier

torch.manual_seed(0)
train_dataloader = DataLoader(TensorDataset(torch.randn(16, 4), torch.randint(0, 3, (16,))), batch_size=8)
eval_dataloader = DataLoader(TensorDataset(torch.randn(16, 4), torch.randint(0, 3, (16,))), batch_size=8)
other_eval_dataloader = DataLoader(TensorDataset(torch.randn(24, 4), torch.randint(0, 3, (24,))), batch_size=8)
predict_dataloader = DataLoader(TensorDataset(torch.randn(20, 4), torch.zeros(20, dtype=torch.long)), batch_size=8)

module = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.ReLU(), torch.nn.Linear(8, 3))
model = ComposerClassifier(module, num_classes=3)
trainer = Trainer(
    model=model,
    train_dataloader=train_dataloader,
    eval_dataloader=eval_dataloader,
    max_duration="1ep",
    optimizers=torch.optim.Adam(model.parameters(), lr=1e-2),
)
trainer.fit()

trainer.eval()
metrics = trainer.state.eval_metrics['eval']
assert {'CrossEntropy', 'MulticlassAccuracy'} <= set(metrics), metrics.keys()
accuracy = float(metrics['MulticlassAccuracy'].compute())
assert 0.0 <= accuracy <= 1.0

# the same accuracy computed by hand on the eval set
with torch.no_grad():
    inputs, targets = eval_dataloader.dataset.tensors
    expected = (module(inputs).argmax(dim=1) == targets).float().mean().item()
assert abs(accuracy - expected) < 1e-6, (accuracy, expected)

trainer.eval(eval_dataloader=other_eval_dataloader)
assert 0.0 <= float(trainer.state.eval_metrics['eval']['MulticlassAccuracy'].compute()) <= 1.0

predictions = trainer.predict(predict_dataloader)
assert len(predictions) == 3  # one entry per batch: 8 + 8 + 4 samples
assert [tuple(p.shape) for p in predictions] == [(8, 3), (8, 3), (4, 3)], [p.shape for p in predictions]
with torch.no_grad():
    expected_logits = module(predict_dataloader.dataset.tensors[0])
assert torch.allclose(torch.cat([p.cpu() for p in predictions]), expected_logits, atol=1e-5)
