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
# # Train a PyTorch module with jaxcomposer (`torch_bridge`)
#
# A plain `torch.nn.Module` (written below, NCHW, BatchNorm and Dropout included) is exported once with
# `torch.export`, lowered op by op to JAX, and trained inside jaxcomposer's jitted step with a Composer recipe
# (label smoothing, EMA, gradient clipping). The trained weights then go back into the torch module, which
# predicts exactly what the JAX side does. `make notebooks` trains one epoch (about a minute on 2 CPU cores); the
# tests run it with `JAXCOMPOSER_SMOKE=1` (a few batches).

# %%
import os

SMOKE = os.environ.get("JAXCOMPOSER_SMOKE") == "1"

import matplotlib.pyplot as plt
import numpy as np
import torch
from torch import nn

import torch_bridge
from jaxcomposer import ComposerClassifier, Trainer, algorithms, data, optim
from jaxcomposer.loggers import InMemoryLogger

torch.manual_seed(17)

# %% [markdown]
# ## Data, in torch's layout
# Fashion-MNIST from Debian's `dataset-fashion-mnist` package (scikit-learn's digits if it is missing). The loaders
# yield uint8 NHWC batches; a small wrapper normalizes them on the host and transposes them to NCHW, the layout
# the torch module expects.

# %%
# smoke mode (the tests): smaller batches, so its few steps and one evaluation take seconds
train, evals, info = data.make_loaders("fashion_mnist", batch_size=32 if SMOKE else 128,
                                      eval_batch_size=200 if SMOKE else 1000, seed=17)
mean, std = (data.FASHION_MNIST_MEAN, data.FASHION_MNIST_STD) if info.name == "fashion_mnist" else \
    (data.DIGITS_MEAN, data.DIGITS_STD)


class NormalizedNCHW:
    def __init__(self, loader):
        self.loader = loader

    def __iter__(self):
        for batch in self.loader:
            x = data.normalize_images(batch["input"], mean, std)  # (B, H, W, C) float32
            yield {**batch, "input": np.ascontiguousarray(x.transpose(0, 3, 1, 2))}  # -> (B, C, H, W)

    def __len__(self):
        return len(self.loader)

    def __getattr__(self, name):  # set_state / set_epoch, so resume and repeated evaluation work as usual
        return getattr(self.loader, name)


train, evals = NormalizedNCHW(train), NormalizedNCHW(evals)
example = next(iter(train))
print(info)
print("a batch:", {k: (v.shape, v.dtype) for k, v in example.items()})


# %% [markdown]
# ## A PyTorch CNN
# Nothing bridge-specific here: two Conv-BN-ReLU-MaxPool stages, dropout and a linear head.

# %%
class SmallCNN(nn.Module):
    def __init__(self, in_channels: int, image_size: int, num_classes: int, width: int = 32, dropout: float = 0.25):
        super().__init__()
        self.features = nn.Sequential(
            nn.Conv2d(in_channels, width, 3, padding=1, bias=False), nn.BatchNorm2d(width), nn.ReLU(),
            nn.MaxPool2d(2),
            nn.Conv2d(width, 2 * width, 3, padding=1, bias=False), nn.BatchNorm2d(2 * width), nn.ReLU(),
            nn.MaxPool2d(2),
        )
        self.dropout = nn.Dropout(dropout)
        self.head = nn.Linear(2 * width * (image_size // 4) ** 2, num_classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.features(x).flatten(1)
        return self.head(self.dropout(x))


_, channels, height, _ = example["input"].shape
module = SmallCNN(in_channels=channels, image_size=height, num_classes=info.num_classes)
print(module)

# %% [markdown]
# ## Convert: `torch_bridge.from_torch`
# The train and eval graphs are exported with the example batch (batch dimension symbolic, so the eval batches
# of another size work too). Every op is checked for a lowering here, at conversion time. The result holds flat
# `params` and `buffers` dicts keyed by the module's `state_dict` names, in torch layouts.

# %%
bm = torch_bridge.from_torch(module, (torch.from_numpy(example["input"]),), dynamic_batch=True)
print(bm)
print("params:")
for name, value in bm.params.items():
    print(f"  {name:<32} {str(value.shape):<16} {value.dtype}")
print("buffers (BatchNorm statistics, updated by the train graph):")
for name, value in bm.buffers.items():
    print(f"  {name:<32} {str(value.shape):<16} {value.dtype}")

# %% [markdown]
# ## Train with the Trainer and a Composer recipe
# `ComposerClassifier` takes the bridged model like a native one. Dropout draws from the step's JAX key; BatchNorm
# statistics are carried as model state; EMA averages both weights and statistics and is what evaluation uses.

# %%
logger = InMemoryLogger()
trainer = Trainer(
    model=ComposerClassifier(bm, num_classes=info.num_classes),
    train_dataloader=train, eval_dataloader=evals,
    max_duration="5ba" if SMOKE else "1ep",
    optimizers=optim.DecoupledSGDW(lr=0.05, momentum=0.9, nesterov=True, weight_decay=5e-4),
    schedulers=[optim.CosineAnnealingScheduler()],
    algorithms=[algorithms.LabelSmoothing(0.1), algorithms.EMA(half_life="50ba"),
                algorithms.GradientClipping("norm", 1.0)],
    loggers=[logger], seed=17, progress_bar=False,
    eval_subset_num_batches=1 if SMOKE else -1,
)
state = trainer.fit()
print(state.eval_metrics["eval"])

# %%
loss = logger.get_timeseries("loss/train/total")
fig, ax = plt.subplots(figsize=(6, 3.5))
ax.plot(loss["batch"], loss["loss/train/total"])
ax.set(xlabel="batch", ylabel="training loss (label-smoothed)", title="SmallCNN (torch) trained by jaxcomposer")
plt.tight_layout()
plt.show()

# %% [markdown]
# ## Back to torch
# `bm.to_torch(params, buffers)` loads arrays into the original module (strictly, by `state_dict` name). Evaluation
# used the EMA weights, which live in the train state's extras under `'EMA'` (weights and BatchNorm statistics), so
# those are the ones to export. The torch module in eval mode then agrees with `trainer.predict` on a test batch.

# %%
ema = state.train_state.extras["EMA"]
assert bool(ema["started"]), "EMA has not started yet: export state.train_state.params / .model_state instead"
trained = bm.to_torch(ema["params"], ema["state"]).eval()

evals.set_state({"epoch": 0, "batch_index": 0})  # the first test batch (where every evaluation starts)
batch = next(iter(evals))
with torch.no_grad():
    torch_logits = trained(torch.from_numpy(batch["input"])).numpy()
jax_logits = np.asarray(trainer.predict([batch])[0])

max_abs_diff = float(np.abs(torch_logits - jax_logits).max())
agreement = float((torch_logits.argmax(-1) == jax_logits.argmax(-1)).mean())
print(f"{len(batch['input'])} test images: max |torch - jax| logit difference {max_abs_diff:.2e}, "
      f"argmax agreement {agreement:.2%}, torch accuracy {(torch_logits.argmax(-1) == batch['target']).mean():.2%}")
assert max_abs_diff < 1e-4, max_abs_diff
assert agreement >= 0.999, agreement


# %% [markdown]
# ## Unsupported ops fail at conversion time, and say where
# A module whose forward uses an op with no JAX lowering (here `torch.linalg.qr`) is refused by `from_torch`, before
# anything is compiled or trained; the error names each missing ATen op and the module and source line using it.

# %%
class Orthogonalize(nn.Module):
    def __init__(self):
        super().__init__()
        self.proj = nn.Linear(16, 4)

    def forward(self, x):
        return self.proj(torch.linalg.qr(x.T)[0].T)


try:
    torch_bridge.from_torch(Orthogonalize(), (torch.randn(2, 16),))
except torch_bridge.UnsupportedOpError as e:
    print(e)
else:
    raise AssertionError("from_torch should have refused torch.linalg.qr")
