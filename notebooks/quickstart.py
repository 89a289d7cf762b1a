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

# %% [markdown]
# # jaxcomposer quickstart
#
# The run of `configs/quickstart.yaml`, written out with the `Trainer`: a small ResNet on Fashion-MNIST with
# label smoothing and EMA, a cosine schedule with warmup, and Composer's decoupled SGDW. It reaches about 91-92% test
# accuracy (how long that takes on a CPU: `benchmarks/README.md`). The tests run this notebook with
# `JAXCOMPOSER_SMOKE=1` (a few batches), so it stays executable.

# %%
import os

SMOKE = os.environ.get("JAXCOMPOSER_SMOKE") == "1"

import matplotlib.pyplot as plt
from flax import nnx

from jaxcomposer import ComposerClassifier, Trainer, algorithms, data, models, optim
from jaxcomposer.loggers import InMemoryLogger

# %% [markdown]
# ## Data
# Fashion-MNIST from Debian's `dataset-fashion-mnist` package (digits if it is missing), normalized on the host
# so that methods such as CutOut and MixUp see the same values a PyTorch pipeline would hold.

# %%
# smoke mode (the tests): smaller batches, so its few steps and one evaluation take seconds
train, evals, info = data.make_loaders("fashion_mnist", batch_size=32 if SMOKE else 128,
                                      eval_batch_size=200 if SMOKE else 1000, seed=17)
mean, std = (data.FASHION_MNIST_MEAN, data.FASHION_MNIST_STD) if info.name == "fashion_mnist" else \
    (data.DIGITS_MEAN, data.DIGITS_STD)


class Normalized:
    def __init__(self, loader):
        self.loader = loader

    def __iter__(self):
        for batch in self.loader:
            yield {**batch, "input": data.normalize_images(batch["input"], mean, std)}

    def __len__(self):
        return len(self.loader)

    def __getattr__(self, name):
        return getattr(self.loader, name)


train, evals = Normalized(train), Normalized(evals)
print(info)

# %% [markdown]
# ## Model and recipe

# %%
module = models.ResNetCIFAR(depth=8, width=16, num_classes=info.num_classes, in_channels=1, stem_stride=2,
                            rngs=nnx.Rngs(17))
model = ComposerClassifier(module, num_classes=info.num_classes)
print(f"{models.num_params(module):,} parameters")

recipe = [algorithms.LabelSmoothing(smoothing=0.1), algorithms.EMA(half_life="100ba", update_interval="1ba")]
logger = InMemoryLogger()
trainer = Trainer(
    model=model, train_dataloader=train, eval_dataloader=evals,
    max_duration="4ba" if SMOKE else "4ep",
    optimizers=optim.DecoupledSGDW(lr=0.2, momentum=0.9, nesterov=True, weight_decay=5e-4),
    schedulers=[optim.CosineAnnealingWithWarmupScheduler(t_warmup="0.1dur")],
    algorithms=recipe, loggers=[logger], seed=17,
    eval_subset_num_batches=1 if SMOKE else -1,
)

# %%
state = trainer.fit()
print(state.eval_metrics["eval"])

# %% [markdown]
# ## Loss and accuracy

# %%
loss = logger.get_timeseries("loss/train/total")  # Composer's: the values and each log's timestamp fields
acc = logger.get_timeseries("metrics/eval/MulticlassAccuracy")
fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(10, 3.5))
ax1.plot(loss["batch"], loss["loss/train/total"])
ax1.set(xlabel="batch", ylabel="training loss")
ax2.plot(acc["batch"], acc["metrics/eval/MulticlassAccuracy"], marker="o")
ax2.set(xlabel="batch", ylabel="test accuracy (EMA weights)")
plt.tight_layout()
plt.show()

# %% [markdown]
# ## Bad configs fail early and say why
# Every problem at once, with its dotted path and a suggestion, before anything is compiled or written.

# %%
import jaxcomposer

try:
    jaxcomposer.load_config({"max_duraton": "3ep", "eval_interval": "10epochs"})
except jaxcomposer.ConfigError as e:
    print(e)
