"""Callbacks guide (docs/source/trainer/callbacks.rst, "Custom Callbacks"): a Callback overriding per-event
methods and reading ``state.*``, and the ``run_event`` form of the same callback.

The docs' callback prints ``state.timestamp.epoch`` at EPOCH_END; here it also records what it reads so the
script can check it. Synthetic data: 2 batches per epoch, 2 epochs.
"""
import torch
import torch.nn.functional as F
from torch.utils.data import DataLoader, TensorDataset

from jaxcomposer import Callback, Event, Logger, State, Trainer
from jaxcomposer.models import ComposerClassifier


class EpochMonitor(Callback):

    def __init__(self):
        self.epochs = []
        self.batches = []
        self.losses = []
        self.lrs = []

    def epoch_end(self, state: State, logger: Logger):
        print(f'Epoch: {state.timestamp.epoch}')
        self.epochs.append(int(state.timestamp.epoch))

    def batch_end(self, state: State, logger: Logger):
        self.batches.append(int(state.timestamp.batch))
        self.losses.append(float(state.loss))
        self.lrs.append(state.optimizers[0].param_groups[0]['lr'])


class EventRecorder(Callback):

    def __init__(self):
        self.events = []

    def run_event(self, event: Event, state: State, logger: Logger):
        if event == Event.EPOCH_END:
            print(f'Epoch: {state.timestamp.epoch}')
        self.events.append(event)


torch.manual_seed(0)
train_dataloader = DataLoader(TensorDataset(torch.randn(16, 4), torch.randint(0, 3, (16,))), batch_size=8)
module = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.ReLU(), torch.nn.Linear(8, 3))
model = ComposerClassifier(module, num_classes=3)
optimizer = torch.optim.SGD(model.parameters(), lr=0.05)

epoch_monitor = EpochMonitor()
recorder = EventRecorder()
trainer = Trainer(
    model=model,
    train_dataloader=train_dataloader,
    optimizers=optimizer,
    max_duration='2ep',
    callbacks=[epoch_monitor, recorder],
)
trainer.fit()

assert epoch_monitor.epochs == [1, 2], epoch_monitor.epochs
assert epoch_monitor.batches == [1, 2, 3, 4], epoch_monitor.batches
assert len(epoch_monitor.losses) == 4 and all(loss > 0 for loss in epoch_monitor.losses)
assert epoch_monitor.lrs == [0.05] * 4, epoch_monitor.lrs
assert trainer.state.max_duration.value == 2 and trainer.state.max_duration.unit.value == 'ep'

events = recorder.events
assert events[0] == Event.INIT, events[:3]
assert events[-1] == Event.FIT_END, events[-3:]
assert events.count(Event.FIT_START) == 1
assert events.count(Event.EPOCH_START) == 2 and events.count(Event.EPOCH_END) == 2
assert events.count(Event.BATCH_START) == 4 and events.count(Event.BATCH_END) == 4
for event in (Event.AFTER_DATALOADER, Event.BEFORE_FORWARD, Event.AFTER_FORWARD, Event.BEFORE_LOSS,
              Event.AFTER_LOSS, Event.BEFORE_BACKWARD, Event.AFTER_BACKWARD, Event.BEFORE_TRAIN_BATCH,
              Event.AFTER_TRAIN_BATCH):
    assert events.count(event) == 4, (event, events.count(event))
# Composer's per-batch order
first_batch = events[events.index(Event.BATCH_START):events.index(Event.BATCH_END) + 1]
order = [Event.BATCH_START, Event.BEFORE_TRAIN_BATCH, Event.BEFORE_FORWARD, Event.AFTER_FORWARD,
         Event.BEFORE_LOSS, Event.AFTER_LOSS, Event.BEFORE_BACKWARD, Event.AFTER_BACKWARD,
         Event.AFTER_TRAIN_BATCH, Event.BATCH_END]
assert [e for e in first_batch if e in order] == order, first_batch
