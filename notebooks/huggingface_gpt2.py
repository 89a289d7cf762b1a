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
# # A Hugging Face GPT-2 trained on local text
#
# A `transformers.GPT2LMHeadModel` built from a small `GPT2Config` (nothing downloads), wrapped in Composer's
# `HuggingFaceModel`, trained by the `Trainer` on Python's own standard-library sources as bytes (vocabulary 256),
# with Composer's `DecoupledAdamW` built on the model's parameters. The torch model is exported once and trained as
# JAX; its trained weights are back in the torch module, which then generates text with Hugging Face's `generate`.
# `make notebooks` trains 600 batches (about 100 s on 2 CPU cores); the tests run it with
# `JAXCOMPOSER_SMOKE=1`.

# %%
import os

SMOKE = os.environ.get("JAXCOMPOSER_SMOKE") == "1"

import warnings

warnings.filterwarnings("ignore", message="IProgress not found")  # transformers imports tqdm's notebook bar

import numpy as np
import torch
import transformers
from torch.utils.data import DataLoader, TensorDataset

from jaxcomposer import Trainer, data
from jaxcomposer.loggers import InMemoryLogger, LivePlotLogger
from jaxcomposer.metrics import LanguageCrossEntropy, LanguagePerplexity
from jaxcomposer.models import HuggingFaceModel
from jaxcomposer.optim import CosineAnnealingWithWarmupScheduler, DecoupledAdamW

# %% [markdown]
# ## Data: the standard library's sources, 128 bytes at a time

# %%
SEQ = 128
train, evals, info = data.make_loaders("stdlib_text", batch_size=16, eval_batch_size=16, seq_len=SEQ, seed=0)
n_train, n_eval = (4, 1) if SMOKE else (600, 8)
rows = lambda loader, n: torch.from_numpy(
    np.concatenate([b["input_ids"][:, :SEQ] for b, _ in zip(loader, range(n))]).astype(np.int64))
train_ids, eval_ids = rows(train, n_train), rows(evals, n_eval)
as_batches = lambda ids, shuffle: DataLoader(
    TensorDataset(ids), batch_size=16, shuffle=shuffle,
    collate_fn=lambda xs: {"input_ids": torch.stack([x[0] for x in xs]), "labels": torch.stack([x[0] for x in xs])})
print(info.name, tuple(train_ids.shape), "training tokens:", train_ids.numel())
print(bytes(train_ids[0, :96].tolist()).decode("utf-8", "replace"))

# %% [markdown]
# ## The model and the run

# %%
torch.manual_seed(0)
config = transformers.GPT2Config(vocab_size=256, n_positions=SEQ, n_embd=128, n_layer=1 if SMOKE else 4, n_head=4,
                                 bos_token_id=0, eos_token_id=0)
model = transformers.GPT2LMHeadModel(config)
model.loss_type = "ForCausalLM"  # (Hugging Face's default; said here, it does not warn)
composer_model = HuggingFaceModel(model, tokenizer=None, use_logits=True,
                                  metrics=[LanguageCrossEntropy(), LanguagePerplexity()])
logger = InMemoryLogger()
trainer = Trainer(
    model=composer_model,
    train_dataloader=as_batches(train_ids, shuffle=True),
    eval_dataloader=as_batches(eval_ids, shuffle=False),
    max_duration="1ep", eval_interval="150ba" if not SMOKE else "1ep",
    optimizers=DecoupledAdamW(composer_model.parameters(), lr=2e-3, weight_decay=1e-4),
    schedulers=CosineAnnealingWithWarmupScheduler(t_warmup="0.05dur"),
    loggers=[logger, LivePlotLogger()], seed=0, run_name="gpt2-stdlib",
)
print(f"{sum(p.numel() for p in model.parameters()):,} parameters")
trainer.fit()
print({k: round(float(v.compute()), 3) for k, v in trainer.state.eval_metrics["eval"].items()})

# %% [markdown]
# ## The trained weights are in the torch model: generate with Hugging Face

# %%
model.eval()
torch.manual_seed(0)
prompt = torch.tensor([list(b"    def ")])
with torch.no_grad():
    out = model.generate(prompt, max_new_tokens=SEQ - prompt.shape[1], do_sample=True, top_k=8, pad_token_id=0)
print(bytes(out[0].tolist()).decode("utf-8", "replace"))
