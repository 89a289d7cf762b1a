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
# # Scale out on one machine: the same run on 1 and on 8 devices
#
# JAX can split this CPU into 8 devices (set before JAX starts, as the first cell does), which is how a run's
# sharding is tried before it meets a GPU pod: the same small GPT trains on one device and then with
# `parallelism_config={"fsdp": ...}` over all eight, every parameter and optimizer moment sharded across them. The
# batches, the random keys and the update are the same, so the two runs compute the same losses and weights up to
# the order their floating-point sums run in (rounding differences that training then carries along). Seconds on
# 2 CPU cores; the tests run it with `JAXCOMPOSER_SMOKE=1`.

# %%
import os

flags = [f for f in os.environ.get("XLA_FLAGS", "").split() if "xla_force_host_platform_device_count" not in f]
os.environ["XLA_FLAGS"] = " ".join(flags + ["--xla_force_host_platform_device_count=8"])  # before JAX starts
SMOKE = os.environ.get("JAXCOMPOSER_SMOKE") == "1"

import jax
import numpy as np
from flax import nnx

from jaxcomposer import Trainer, data
from jaxcomposer.loggers import InMemoryLogger
from jaxcomposer.models import GPT
from jaxcomposer.models.tasks import ComposerCausalLM
from jaxcomposer.optim import DecoupledAdamW

print(jax.device_count(), "devices:", jax.devices()[:2], "...")

# %%
train, _, info = data.make_loaders("stdlib_text", batch_size=16, eval_batch_size=16, seq_len=64, seed=0)
steps = "4ba" if SMOKE else "30ba"


def run(devices, parallelism_config=None):
    logger = InMemoryLogger()
    trainer = Trainer(
        model=ComposerCausalLM(GPT(vocab_size=256, seq_len=64, d_model=128, n_layers=2, n_heads=4,
                                   rngs=nnx.Rngs(0))),
        train_dataloader=train, max_duration=steps, optimizers=DecoupledAdamW(lr=1e-3), seed=0,
        devices=devices, parallelism_config=parallelism_config, loggers=[logger], progress_bar=False,
    )
    trainer.fit()
    losses = np.array([float(v) for v in logger.get_timeseries("loss/train/total")["loss/train/total"]])
    return trainer, losses


one, one_losses = run(jax.devices()[:1])
eight, eight_losses = run(jax.devices(), {"fsdp": {"sharding_strategy": "FULL_SHARD"}})
print("1 device: ", one.parallelism.describe())
print("8 devices:", eight.parallelism.describe())

# %% [markdown]
# ## Where the weights live, and what the runs computed

# %%
path, kernel = max(jax.tree_util.tree_leaves_with_path(eight.state.train_state.params), key=lambda pv: pv[1].size)
print(f"the largest weight, {jax.tree_util.keystr(path)} {kernel.shape}, is held as "
      f"{len(kernel.addressable_shards)} shards of shape {kernel.addressable_shards[0].data.shape}")
print("final loss: 1 device %.6f, 8 devices %.6f" % (one_losses[-1], eight_losses[-1]))
print("largest loss difference over the run:", float(np.max(np.abs(one_losses - eight_losses))))
leaves = lambda t: [np.asarray(x) for x in jax.tree_util.tree_leaves(t)]
print("largest weight difference:", max(float(np.max(np.abs(a - b)))
                                        for a, b in zip(leaves(one.state.train_state.params),
                                                        leaves(eight.state.train_state.params))))

# %%
import matplotlib.pyplot as plt

fig, ax = plt.subplots(figsize=(6, 3))
ax.plot(one_losses, label="1 device")
ax.plot(eight_losses, "--", label="8 devices, FSDP")
ax.set(xlabel="batch", ylabel="training loss")
ax.legend()
plt.tight_layout()
plt.show()
