# ---
# jupyter:
#   jupytext:
#     formats: ipynb,py:percent
#     text_representation:
#       extension: .py
#       format_name: percent
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
# host-side PIL operations driven by a numpy `Generator`, as they run in the input pipeline.
# The tests run this notebook with `JAXCOMPOSER_SMOKE=1`; it is fast either way.

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
