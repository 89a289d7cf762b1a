# ---
# jupyter:
#   jupytext:
#     formats: ipynb,py:percent
#     text_representation:
#       extension: .py
#       format_name: percent
#       format_version: '1.3'
#       jupytext_version: 1.19.6
#   kernelspec:
#     display_name: Python 3
#     language: python
#     name: python3
# ---

# %%

# %% [markdown]
# # Porting a Composer script: change the imports
#
# A Composer training script, as Composer's docs write it (a torch model, a torch `DataLoader`, a torch optimizer
# built on `model.parameters()`, Composer's algorithms, callbacks, logger and scheduler), next to the same script
# with `composer` replaced by `jaxcomposer` in its imports. Nothing else changes: the model stays a torch module
# (the Trainer runs it through `torch_bridge`), and what the script reads back (`trainer.state.*`, the logged
# keys, the trained weights in its own module) is what Composer gives. Seconds on 2 CPU cores.

# %%
import difflib
import os

SMOKE = os.environ.get("JAXCOMPOSER_SMOKE") == "1"

COMPOSER_SCRIPT = '''
import torch
from torch.utils.data import DataLoader, TensorDataset

from composer import Trainer
from composer.algorithms import LabelSmoothing, ChannelsLast
from composer.callbacks import LRMonitor
from composer.loggers import InMemoryLogger
from composer.models import mnist_model
from composer.optim import CosineAnnealingWithWarmupScheduler

torch.manual_seed(0)
images, labels = torch.rand(256, 1, 28, 28), torch.randint(0, 10, (256,))
images[torch.arange(256), 0, labels * 2, :] = 1.0  # a bright row per class: something to learn
train_dataloader = DataLoader(TensorDataset(images[:192], labels[:192]), batch_size=32, shuffle=True)
eval_dataloader = DataLoader(TensorDataset(images[192:], labels[192:]), batch_size=64)

model = mnist_model(num_classes=10)
logger = InMemoryLogger()
trainer = Trainer(
    model=model,
    train_dataloader=train_dataloader,
    eval_dataloader=eval_dataloader,
    max_duration="12ep",
    optimizers=torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9),
    schedulers=CosineAnnealingWithWarmupScheduler(t_warmup="1ep"),
    algorithms=[LabelSmoothing(smoothing=0.1), ChannelsLast()],
    callbacks=[LRMonitor()],
    loggers=[logger],
    progress_bar=False,
    seed=0,
)
trainer.fit()
'''
OURS = COMPOSER_SCRIPT.replace("from composer", "from jaxcomposer")
RUN = OURS.replace('max_duration="12ep"', 'max_duration="1ep"') if SMOKE else OURS  # (the tests' quick run)
print("".join(difflib.unified_diff(COMPOSER_SCRIPT.splitlines(True), OURS.splitlines(True), "composer",
                                   "jaxcomposer", n=0)))

# %% [markdown]
# ## Run the ported script

# %%
namespace = {}
exec(RUN, namespace)
trainer, logger, model = namespace["trainer"], namespace["logger"], namespace["model"]
print("timestamp:", trainer.state.timestamp.epoch, "epochs,", trainer.state.timestamp.batch, "batches")
print("eval:", {k: round(float(v.compute()), 4) for k, v in trainer.state.eval_metrics["eval"].items()})
print("logged keys:", sorted(logger.data)[:6], "...")
print("the user's module holds the trained weights:", trainer.state.model.module is model.module,
      type(model.module).__name__)

# %% [markdown]
# ## What it logged, as Composer logs it

# %%
import matplotlib.pyplot as plt

lr = logger.get_timeseries("lr-SGD/group0")
loss = logger.get_timeseries("loss/train/total")
fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(9, 3))
ax1.plot(loss["batch"], loss["loss/train/total"])
ax1.set(xlabel="batch", ylabel="training loss")
ax2.plot(lr["batch"], lr["lr-SGD/group0"])
ax2.set(xlabel="batch", ylabel="learning rate (LRMonitor)")
plt.tight_layout()
plt.show()
