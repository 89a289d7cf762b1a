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
# `configs/quickstart.yaml` two ways: as a config (`jaxcomposer.fit`, what `jaxcomposer fit` runs) and written out
# with the `Trainer`, Composer's names. The recipe: a plain ConvNet (three stride-2 convolutions, a linear head) on
# Fashion-MNIST with label smoothing, Composer's decoupled SGDW and a cosine schedule with warmup. It reaches about
# 91.5% test accuracy in 4 epochs. `make notebooks` runs it in full (about a minute on 2 CPU cores, as committed);
# the tests run it with `JAXCOMPOSER_SMOKE=1` (a few batches).

# %%
import os

SMOKE = os.environ.get("JAXCOMPOSER_SMOKE") == "1"

from flax import nnx

import jaxcomposer
from jaxcomposer import ComposerClassifier, DataSpec, Trainer, algorithms, data, models, optim
from jaxcomposer.loggers import LivePlotLogger

# %% [markdown]
# ## As a config
# Every option is checked before anything runs; `metrics` are the last evaluation's.

# %%
recipe = {
    "run_name": "quickstart", "seed": 17, "max_duration": "6ba" if SMOKE else "4ep", "eval_interval": "1ep",
    "steps_per_execution": 8, "progress_bar": False, "log_to_console": False, "run_dir": "runs",
    "model": {"name": "convnet", "channels": [16, 48, 96], "strides": [2, 2, 2], "head": "flatten"},
    "data": {"name": "fashion_mnist", "batch_size": 128, "eval_batch_size": 1000},
    "optimizer": {"name": "decoupled_sgdw", "lr": 0.2, "momentum": 0.9, "nesterov": True, "weight_decay": 5e-4},
    "schedulers": [{"name": "cosine_annealing_with_warmup", "t_warmup": "0.1dur"}],
    "algorithms": {"label_smoothing": {"smoothing": 0.1}},
}
result = jaxcomposer.fit(recipe)
print({name: round(float(value), 4) for name, value in result.metrics.items()})

# %% [markdown]
# ## The same run with the `Trainer`
# The loaders yield uint8 images; a `DataSpec` normalizes them inside the compiled step, as the config does. The
# progress bar and the `LivePlotLogger` update in place while it trains (the plot at each evaluation).

# %%
train, evals, info = data.make_loaders("fashion_mnist", batch_size=128, eval_batch_size=1000, seed=17)
normalize = data.NormalizeImages(info.mean, info.std)  # (digits, with their own statistics, where it is missing)
module = models.ConvNet(channels=(16, 48, 96), strides=(2, 2, 2), head="flatten", num_classes=info.num_classes,
                        image_size=info.input_shape[0], rngs=nnx.Rngs(17))
print(info.name, f"{models.num_params(module):,} parameters")

trainer = Trainer(
    model=ComposerClassifier(module, num_classes=info.num_classes),
    train_dataloader=DataSpec(train, batch_transforms=normalize),
    eval_dataloader=DataSpec(evals, batch_transforms=normalize),
    max_duration="6ba" if SMOKE else "4ep", eval_interval="1ep", steps_per_execution=8,
    eval_subset_num_batches=1 if SMOKE else -1,
    optimizers=optim.DecoupledSGDW(lr=0.2, momentum=0.9, nesterov=True, weight_decay=5e-4),
    schedulers=[optim.CosineAnnealingWithWarmupScheduler(t_warmup="0.1dur")],
    algorithms=[algorithms.LabelSmoothing(smoothing=0.1)],
    loggers=[LivePlotLogger()], seed=17, run_name="quickstart-trainer",
)
state = trainer.fit()

# %%
print({name: round(float(value), 4) for name, value in state.eval_metrics["eval"].items()})

# %% [markdown]
# ## Bad configs fail early and say why
# Every problem at once, with its dotted path and a suggestion, before anything is compiled or written.

# %%
try:
    jaxcomposer.load_config({"max_duraton": "3ep", "eval_interval": "10epochs"})
except jaxcomposer.ConfigError as e:
    print(e)
