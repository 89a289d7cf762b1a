"""HuggingFaceModel on a causal LM (composer.models.HuggingFaceModel API reference; the metrics of
examples/pretrain_finetune_huggingface.ipynb for language modeling): a GPT-2 LM head model with Composer's
LanguageCrossEntropy and LanguagePerplexity (``use_logits=True``; labels are shifted for causal LMs),
DecoupledAdamW, an InMemoryLogger.

Nothing downloads: a tiny ``GPT2LMHeadModel`` built from a ``GPT2Config``, no tokenizer, random token ids.
"""
import math

import torch
import transformers
from torch.utils.data import DataLoader

from composer import Trainer
from composer.loggers import InMemoryLogger
from composer.metrics import LanguageCrossEntropy, LanguagePerplexity
from composer.models import HuggingFaceModel
from composer.optim import DecoupledAdamW

config = transformers.GPT2Config(vocab_size=128, n_positions=32, n_embd=32, n_layer=2, n_head=2)
torch.manual_seed(0)
model = transformers.GPT2LMHeadModel(config)


def synthetic_text(n, seq_len=16):
    samples = []
    for _ in range(n):
        input_ids = torch.randint(0, 128, (seq_len,))
        samples.append({'input_ids': input_ids, 'attention_mask': torch.ones(seq_len, dtype=torch.long),
                        'labels': input_ids.clone()})
    return samples


collate_fn = transformers.data.data_collator.default_data_collator
train_dataloader = DataLoader(synthetic_text(16), batch_size=8, collate_fn=collate_fn)
eval_dataloader = DataLoader(synthetic_text(8), batch_size=8, collate_fn=collate_fn)

metrics = [LanguageCrossEntropy(), LanguagePerplexity()]
composer_model = HuggingFaceModel(model, tokenizer=None, metrics=metrics, use_logits=True)
optimizer = DecoupledAdamW(composer_model.parameters(), lr=1e-3)
logger = InMemoryLogger()

trainer = Trainer(
    model=composer_model,
    train_dataloader=train_dataloader,
    eval_dataloader=eval_dataloader,
    max_duration='1ep',
    optimizers=optimizer,
    loggers=[logger],
)
trainer.fit()

eval_metrics = trainer.state.eval_metrics['eval']
assert set(eval_metrics) == {'LanguageCrossEntropy', 'LanguagePerplexity'}, eval_metrics.keys()
cross_entropy = float(eval_metrics['LanguageCrossEntropy'].compute())
perplexity = float(eval_metrics['LanguagePerplexity'].compute())
assert math.isclose(perplexity, math.exp(cross_entropy), rel_tol=1e-4), (perplexity, cross_entropy)
# random tokens over a 128-word vocabulary: the loss of a barely trained model is near log(128)
assert 3.5 < cross_entropy < 6.0, cross_entropy

# the same cross entropy by hand: shifted labels, mean over the predicted tokens
batch = next(iter(eval_dataloader))
model.eval()
with torch.no_grad():
    logits = model(input_ids=batch['input_ids'], attention_mask=batch['attention_mask']).logits
expected = torch.nn.functional.cross_entropy(logits[:, :-1].reshape(-1, 128), batch['labels'][:, 1:].reshape(-1))
assert abs(cross_entropy - expected.item()) < 1e-3, (cross_entropy, expected.item())

assert len(logger.data['loss/train/total']) == 2
assert 'metrics/eval/LanguagePerplexity' in logger.data
