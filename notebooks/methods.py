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
# # What the data methods do to a batch
#
# Each row is one method's functional form (`jaxcomposer.functional`, Composer's names, explicit randomness)
# applied to the same eight Fashion-MNIST test images; the first row is the original batch. The in-step methods
# (MixUp, CutMix, CutOut, ColOut, ProgressiveResizing) are jax functions of a `key`; RandAugment and AugMix are
# host-side PIL operations driven by a numpy `Generator`, as they run in the input pipeline. The notebook ends with
# a small time-vs-accuracy comparison of a few recipes. `make notebooks` runs it in full (about 90 s on 2 CPU
# cores); the tests run it with `JAXCOMPOSER_SMOKE=1`.

# %%
import os

SMOKE = os.environ.get("JAXCOMPOSER_SMOKE") == "1"

import jax
import matplotlib.pyplot as plt
import numpy as np

from jaxcomposer import data, functional as F

# %% [markdown]
# ## A batch of images
# Fashion-MNIST from Debian's `dataset-fashion-mnist` package (scikit-learn's digits if it is missing), as NHWC
# floats in [0, 1].

# %%
if data.fashion_mnist_available():
    test = data.load_fashion_mnist("test")
    names = ["T-shirt", "Trouser", "Pullover", "Dress", "Coat", "Sandal", "Shirt", "Sneaker", "Bag", "Boot"]
else:
    test = data.load_digits("test")
    names = [str(i) for i in range(10)]
picks = np.array([np.flatnonzero(test["target"] == c)[0] for c in range(8)])
pixels = np.asarray(test["input"][picks])  # uint8 (8, H, W, 1)
images = pixels.astype(np.float32) / 255.0
labels = test["target"][picks]
key = jax.random.PRNGKey(0)
print(images.shape, [names[int(y)] for y in labels])

# %% [markdown]
# ## Each method on the batch
# MixUp returns the weight of the partner image's label (at most 0.5), CutMix the fraction of each image left
# unmixed (the weight of its own label, adjusted to the box actually pasted); the titles show them.

# %%
k_mix, k_cut, k_out, k_col, k_res = jax.random.split(key, 5)
mixed, _, mix_lam = F.mixup_batch(images, labels, alpha=1.0, key=k_mix)
cut, _, cut_lam, _ = F.cutmix_batch(images, labels, alpha=1.0, key=k_cut)
holes = F.cutout_batch(images, num_holes=1, length=0.5, key=k_out)
colout = F.colout_batch(images, p_row=0.15, p_col=0.15, key=k_col)
small, _ = F.resize_batch(images, labels, scale_factor=0.5, mode="resize")
rng = np.random.default_rng(0)
# (on uint8 pixels, as a data pipeline holds them; scaled to [0, 1] for display)
randaug = np.stack([F.randaugment_image(img, severity=9, depth=2, rng=rng) for img in pixels]) / 255.0
augmix = np.stack([F.augmix_image(img, severity=3, rng=rng) for img in pixels]) / 255.0

rows = [("original", images), (f"MixUp (partner {float(mix_lam):.2f})", mixed),
        (f"CutMix (own {float(cut_lam):.2f})", cut), ("CutOut", holes), ("ColOut", colout),
        ("ProgressiveResizing x0.5", small), ("RandAugment", randaug), ("AugMix", augmix)]
for title, batch in rows:
    print(f"{title:<28} {np.asarray(batch).shape}")

# %%
fig, axes = plt.subplots(len(rows), len(images), figsize=(1.4 * len(images), 1.5 * len(rows)))
for r, (title, batch) in enumerate(rows):
    for c in range(len(images)):
        ax = axes[r, c]
        ax.imshow(np.asarray(batch[c]).squeeze(-1), cmap="gray", vmin=0.0, vmax=1.0)
        ax.set_xticks([])
        ax.set_yticks([])
        if c == 0:
            ax.set_ylabel(title, rotation=0, ha="right", va="center", fontsize=8)
        if r == 0:
            ax.set_title(names[int(labels[c])], fontsize=8)
fig.tight_layout()
plt.show()

# %% [markdown]
# What to notice: MixUp blends whole images, CutMix pastes a box of a partner image (its label weight is the box's
# actual area), CutOut blanks a box, ColOut drops rows and columns (the images shrink, so the step is cheaper),
# ProgressiveResizing trains early epochs on smaller images, RandAugment applies `depth` random PIL operations at
# a fixed severity, and AugMix blends several augmentation chains with the original.
# Time cost and accuracy of each method: `benchmarks/methods_fashion_mnist.py`.

# %% [markdown]
# # What the model-rewriting methods do to a model
#
# The surgery methods' functional forms take a model and return the rewritten one (a Flax NNX module comes back as
# a new module and the original is left as it was; a torch module is edited in place, as Composer does). Below, each
# is applied to the quickstart's ResNet-8 (width 16) or to a small GPT, with thresholds small enough for these
# models, and the table shows what changed: trainable parameters before and after, and the modules the surgery put
# in. No training and no compile happen here.

# %%
import collections
import warnings

from flax import nnx

from jaxcomposer.models import GPT, ResNetCIFAR


def resnet():
    return ResNetCIFAR(depth=8, width=16, num_classes=10, in_channels=1, stem_stride=2, dropout=0.1,
                       rngs=nnx.Rngs(0))


def gpt():
    return GPT(vocab_size=256, seq_len=64, d_model=64, n_layers=2, n_heads=4, dropout=0.1, rngs=nnx.Rngs(0))


def n_params(model) -> int:
    return sum(x.size for x in jax.tree_util.tree_leaves(nnx.state(model, nnx.Param)))


def module_types(model) -> collections.Counter:
    return collections.Counter(type(m).__name__ for _, m in nnx.iter_graph(model) if isinstance(m, nnx.Module))


surgeries = [  # (method, model builder, functional form with this model's arguments)
    ("BlurPool", resnet, lambda m: F.apply_blurpool(m, min_channels=16)),
    ("SqueezeExcite", resnet, lambda m: F.apply_squeeze_excite(m, latent_channels=8, min_channels=32)),
    ("StochasticDepth", resnet, lambda m: F.apply_stochastic_depth(m, "ResNetBasicBlock", drop_rate=0.2)),
    ("GhostBatchNorm", resnet, lambda m: F.apply_ghost_batchnorm(m, ghost_batch_size=32)),
    ("WeightStandardization", resnet, lambda m: F.apply_weight_standardization(m, n_last_layers_ignore=0)[0]),
    ("Factorize", resnet, lambda m: F.apply_factorization(m, min_channels=32, latent_channels=0.25,
                                                           min_features=32, latent_features=0.25)),
    ("GyroDropout", resnet, lambda m: F.apply_gyro_dropout(m, iters_per_epoch=469, max_epoch=4, p=0.1, sigma=256,
                                                            tau=16)),
    ("GatedLinearUnits", gpt, lambda m: F.apply_gated_linear_units(m)),
    ("Alibi", gpt, lambda m: F.apply_alibi(m, max_sequence_length=256)),
    ("LowPrecisionLayerNorm", gpt, lambda m: F.apply_low_precision_layernorm(m, precision="amp_bf16")),
    ("FusedLayerNorm", gpt, lambda m: F.apply_fused_layernorm(m)),
]
print(f"{'method':<22} {'model':<10} {'params before':>13} {'after':>9}  modules put in")
for name, build, surgery in surgeries:
    before = build()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # e.g. Factorize's note on layers it leaves alone
        after = surgery(before)
    added = module_types(after) - module_types(before)
    print(f"{name:<22} {type(before).__name__:<10} {n_params(before):>13,} {n_params(after):>9,}  "
          + ", ".join(f"{n} x{c}" for c, n in sorted(((c, n) for n, c in added.items()), reverse=True)))

# %% [markdown]
# What to notice: BlurPool, StochasticDepth, GhostBatchNorm, WeightStandardization, GyroDropout and
# LowPrecisionLayerNorm change how existing weights are used, not how many there are; SqueezeExcite adds two small
# dense layers per wide conv; Factorize replaces wide layers by low-rank pairs (fewer parameters, fewer FLOPs);
# GatedLinearUnits adds a third matrix to each MLP; Alibi drops the learned position embeddings from training (its
# table stays, zeroed, as model state) and lifts the sequence-length cap; FusedLayerNorm computes the same norm in
# fewer passes. ChannelsLast is not in the table: NNX models are channels-last (NHWC) already, and on a torch model
# it only changes how the bridge lays out convolutions. The method cards
# (`jaxcomposer methods NAME`) say when each one helps.

# %% [markdown]
# # Time against accuracy, in small
#
# The quickstart's ConvNet (with an average-pooling head, which any image size fits) trained for two epochs of
# Fashion-MNIST under a few recipes, each run timed on this machine: the points towards the upper left (less time,
# more accuracy) are the recipes worth their time here. One seed and two epochs: a sketch of what
# `benchmarks/methods_fashion_mnist.py` measures with seeds, time budgets and more methods.

# %%
import time

from jaxcomposer import Callback, ComposerClassifier, DataSpec, Trainer, algorithms, models, optim


class TrainingClock(Callback):
    """Seconds from the end of the first compiled call to the last batch: training, without compiling or eval."""

    def batch_end(self, state, logger):
        now = time.perf_counter()
        self.first = getattr(self, "first", now)
        self.seconds = now - self.first


train_loader, eval_loader, info = data.make_loaders("fashion_mnist", batch_size=128, eval_batch_size=1000, seed=0)
normalize = data.NormalizeImages(info.mean, info.std)
recipes = {
    "baseline": [],
    "label smoothing": [algorithms.LabelSmoothing(smoothing=0.1)],
    "MixUp": [algorithms.MixUp(alpha=0.2)],
    "CutOut": [algorithms.CutOut(length=0.25)],
    "ColOut": [algorithms.ColOut(p_row=0.15, p_col=0.15)],
    "LS + CutOut": [algorithms.LabelSmoothing(smoothing=0.1), algorithms.CutOut(length=0.25)],
}
if SMOKE:  # the tests' quick run: two recipes show the mechanics
    recipes = dict(list(recipes.items())[:2])
points = {}
for name, methods in recipes.items():
    trainer = Trainer(
        model=ComposerClassifier(models.ConvNet(channels=(16, 48, 96), num_classes=info.num_classes, head="avg",
                                                rngs=nnx.Rngs(0)),  # (avg: ColOut trains on smaller images)
                                 num_classes=info.num_classes),
        train_dataloader=DataSpec(train_loader, batch_transforms=normalize),
        eval_dataloader=DataSpec(eval_loader, batch_transforms=normalize),
        max_duration="3ba" if SMOKE else "2ep", eval_interval="2ep", eval_subset_num_batches=1 if SMOKE else -1,
        optimizers=optim.DecoupledSGDW(lr=0.2, momentum=0.9, nesterov=True, weight_decay=5e-4),
        schedulers=[optim.CosineAnnealingScheduler()], algorithms=methods, seed=0, progress_bar=False,
        steps_per_execution=1 if SMOKE else 8, callbacks=[clock := TrainingClock()],
    )
    trainer.fit()  # (the final weights are evaluated at the end)
    seconds, accuracy = clock.seconds, float(trainer.state.eval_metrics["eval"]["MulticlassAccuracy"])
    points[name] = (seconds, accuracy)
    print(f"{name:<16} {seconds:6.1f} s  accuracy {accuracy:.4f}")

fig, ax = plt.subplots(figsize=(6, 3.5))
for name, (seconds, accuracy) in points.items():
    ax.scatter(seconds, accuracy)
    ax.annotate(name, (seconds, accuracy), textcoords="offset points", xytext=(4, 4), fontsize=8)
ax.set(xlabel="training time (s, without compiling)", ylabel="test accuracy",
       title=f"ConvNet, {'3 batches' if SMOKE else '2 epochs'} of {info.name}")
ax.grid(alpha=0.3)
plt.tight_layout()
plt.show()

# %% [markdown]
# What to notice: ColOut trains this small ConvNet on about 23-pixel images and tests it on 28-pixel ones, and the
# model does not carry over across that change of scale: measured separately, the same run scores about 0.83 on
# test images shrunk the way it trained and under 0.5 at full size (and a model trained at full size scores about
# 0.52 on shrunk images). Composer's small accuracy cost is for ResNets on CIFAR-10 and ImageNet; its recipes use
# `p_row = p_col = 0.05`.
