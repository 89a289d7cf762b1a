"""Algorithms guide (docs/source/trainer/algorithms.rst) and the method cards' "Composer Trainer" sections
(label_smoothing, blurpool, mixup and channels_last READMEs): algorithm objects passed in ``algorithms``.

A small CNN in a ComposerClassifier, synthetic 3x16x16 images (2 batches per epoch), 2 epochs.
"""
import torch
from torch.utils.data import DataLoader, TensorDataset

from jaxcomposer.algorithms import BlurPool, ChannelsLast, LabelSmoothing, MixUp
from jaxcomposer.algorithms.blurpool import BlurConv2d, BlurMaxPool2d
from jaxcomposer.models import ComposerClassifier
from jaxcomposer.trainer import Trainer

torch.manual_seed(0)
module = torch.nn.Sequential(
    torch.nn.Conv2d(3, 16, 3, padding=1), torch.nn.ReLU(),
    torch.nn.MaxPool2d(2),
    torch.nn.Conv2d(16, 32, 3, stride=2, padding=1), torch.nn.ReLU(),
    torch.nn.AdaptiveAvgPool2d(1), torch.nn.Flatten(), torch.nn.Linear(32, 10))
model = ComposerClassifier(module, num_classes=10)
train_dataloader = DataLoader(TensorDataset(torch.randn(16, 3, 16, 16), torch.randint(0, 10, (16,))), batch_size=8)
eval_dataloader = DataLoader(TensorDataset(torch.randn(16, 3, 16, 16), torch.randint(0, 10, (16,))), batch_size=8)
head_before = module[7].weight.detach().clone()

label_smoothing = LabelSmoothing(smoothing=0.1)
blurpool = BlurPool(replace_convs=True,
                    replace_maxpools=True)
mixup = MixUp(
    alpha=0.2,
    interpolate_loss=True
)
channels_last = ChannelsLast()

trainer = Trainer(model=model,
                  train_dataloader=train_dataloader,
                  eval_dataloader=eval_dataloader,
                  max_duration='2ep',
                  algorithms=[label_smoothing, blurpool, mixup, channels_last])

trainer.fit()

assert int(trainer.state.timestamp.epoch) == 2 and int(trainer.state.timestamp.batch) == 4
assert trainer.state.algorithms == [label_smoothing, blurpool, mixup, channels_last]
# BlurPool's surgery happened on the user's module, at Event.INIT
assert isinstance(module[2], BlurMaxPool2d), type(module[2])
assert isinstance(module[3], BlurConv2d), type(module[3])
# ChannelsLast: 4-D weights in channels_last memory format
conv_weight = module[0].weight
assert conv_weight.is_contiguous(memory_format=torch.channels_last)
# trained
assert not torch.equal(module[7].weight.detach(), head_before)
assert 0.0 <= float(trainer.state.eval_metrics['eval']['MulticlassAccuracy'].compute()) <= 1.0
