"""Getting Started notebook (examples/getting_started.ipynb): composer_resnet_cifar with DecoupledSGDW and
LinearWithWarmupScheduler, an InMemoryLogger, then the same with LabelSmoothing, BlurPool and
ProgressiveResizing, then one more epoch with a ConstantScheduler.

Differences from the notebook: CIFAR-10 (downloaded there) is replaced by 16 synthetic 3x32x32 images per split
(two batches of 8), ``resnet_56`` by ``resnet_20`` and the epochs by 2 (+1); matplotlib plots are left out.
"""
import time

import torch
import torch.utils.data

import jaxcomposer as composer
from jaxcomposer.loggers import InMemoryLogger
from jaxcomposer.core.time import Time, Timestamp
from jaxcomposer import models
from jaxcomposer.algorithms.blurpool import BlurConv2d

torch.manual_seed(42) # For replicability

batch_size = 8
train_dataset = torch.utils.data.TensorDataset(torch.randn(16, 3, 32, 32), torch.randint(0, 10, (16,)))
test_dataset = torch.utils.data.TensorDataset(torch.randn(16, 3, 32, 32), torch.randint(0, 10, (16,)))
train_dataloader = torch.utils.data.DataLoader(train_dataset, batch_size=batch_size, shuffle=True)
test_dataloader = torch.utils.data.DataLoader(test_dataset, batch_size=batch_size, shuffle=True)

logger = InMemoryLogger()

model = models.composer_resnet_cifar(model_name='resnet_20', num_classes=10)

optimizer = composer.optim.DecoupledSGDW(
    model.parameters(), # Model parameters to update
    lr=0.05, # Peak learning rate
    momentum=0.9,
    weight_decay=2.0e-3 # If this looks large, it's because its not scaled by the LR as in non-decoupled weight decay
)

lr_scheduler = composer.optim.LinearWithWarmupScheduler(
    t_warmup="1ep", # Warm up over 1 epoch
    alpha_i=1.0, # Flat LR schedule achieved by having alpha_i == alpha_f
    alpha_f=1.0
)

train_epochs = "2ep"
device = "gpu" if torch.cuda.is_available() else "cpu" # select the device

trainer = composer.trainer.Trainer(
    model=model,
    train_dataloader=train_dataloader,
    eval_dataloader=test_dataloader,
    max_duration=train_epochs,
    optimizers=optimizer,
    schedulers=lr_scheduler,
    device=device,
    loggers=logger
)

start_time = time.perf_counter()
trainer.fit()
end_time = time.perf_counter()
print(f"It took {end_time - start_time:0.4f} seconds to train")

timeseries_raw = logger.get_timeseries("metrics/eval/MulticlassAccuracy")
assert list(timeseries_raw['epoch']) == [1, 2], timeseries_raw['epoch']
assert all(0.0 <= float(a) <= 1.0 for a in timeseries_raw["metrics/eval/MulticlassAccuracy"])
assert isinstance(trainer.state.timestamp, Timestamp)
assert trainer.state.max_duration == Time.from_timestring(train_epochs)

# Use algorithms to speed up training
label_smoothing = composer.algorithms.LabelSmoothing(0.1)
blurpool = composer.algorithms.BlurPool(
    replace_convs=True, # Blur before convs
    replace_maxpools=True, # Blur before max-pools
    blur_first=True # Blur before conv/max-pool
)
prog_resize = composer.algorithms.ProgressiveResizing(
    initial_scale=.6, # Size of images at the beginning of training = .6 * default image size
    finetune_fraction=0.34, # Train on default size images for 0.34 of total training time.
)
algorithms = [label_smoothing, blurpool, prog_resize]

model = models.composer_resnet_cifar(model_name="resnet_20", num_classes=10)
composer_logger = InMemoryLogger()
optimizer = composer.optim.DecoupledSGDW(
    model.parameters(),
    lr=0.05,
    momentum=0.9,
    weight_decay=2.0e-3
)
trainer = composer.trainer.Trainer(
    model=model,
    train_dataloader=train_dataloader,
    eval_dataloader=test_dataloader,
    max_duration=train_epochs,
    optimizers=optimizer,
    schedulers=lr_scheduler,
    device=device,
    loggers=composer_logger,
    algorithms=algorithms # Adding algorithms this time
)
start_time = time.perf_counter()
trainer.fit()
end_time = time.perf_counter()
three_epochs_accelerated_time = end_time - start_time
print(f"It took {three_epochs_accelerated_time:0.4f} seconds to train")

# BlurPool rewrote the model the user holds (the CIFAR ResNet's strided convolutions have 16+ input channels)
assert any(isinstance(m, BlurConv2d) for m in model.modules())
assert len(composer_logger.get_timeseries("metrics/eval/MulticlassAccuracy")['epoch']) == 2

# One more epoch at full size with a flat LR
train_epochs = "1ep"
lr_scheduler = composer.optim.scheduler.ConstantScheduler(alpha=1.0, t_max='1dur')
algorithms = [label_smoothing]
composer_logger_1ep = InMemoryLogger()
trainer = composer.trainer.Trainer(
    model=model,
    train_dataloader=train_dataloader,
    eval_dataloader=test_dataloader,
    max_duration=train_epochs,
    optimizers=optimizer,
    schedulers=lr_scheduler,
    device=device,
    loggers=composer_logger_1ep,
    algorithms=algorithms
)
trainer.fit()
assert int(trainer.state.timestamp.epoch) == 1 and int(trainer.state.timestamp.batch) == 2
assert len(composer_logger_1ep.data['metrics/eval/MulticlassAccuracy']) == 1
