"""Finetuning Hugging Face models (examples/finetune_huggingface.ipynb): a BERT sequence classifier wrapped in
HuggingFaceModel with CrossEntropy and MulticlassAccuracy, torch AdamW and LinearLR, trained with
``train_subset_num_batches``, ``precision='fp32'`` and ``seed=17``; then ``state.eval_metrics`` and predictions.

Differences from the notebook (nothing downloads): the pretrained ``bert-base-uncased`` is a tiny
``BertForSequenceClassification`` built from a ``BertConfig``, there is no tokenizer (``tokenizer=None``), and
SST-2 is replaced by 32 random token sequences (train) and 16 (eval) collated with ``default_data_collator``;
``train_subset_num_batches`` is 2 instead of 150.
"""
import os

import torch
import transformers
from torch.utils.data import DataLoader

# Create a BERT sequence classification model using Hugging Face transformers
config = transformers.BertConfig(vocab_size=100, hidden_size=32, num_hidden_layers=2, num_attention_heads=2,
                                 intermediate_size=64, max_position_embeddings=64, num_labels=2)
torch.manual_seed(0)
model = transformers.BertForSequenceClassification(config)
tokenizer = None


def synthetic_sst2(n, seq_len=16):
    return [{
        'input_ids': torch.randint(1, 100, (seq_len,)),
        'token_type_ids': torch.zeros(seq_len, dtype=torch.long),
        'attention_mask': torch.ones(seq_len, dtype=torch.long),
        'labels': int(torch.randint(0, 2, ())),
    } for _ in range(n)]


train_dataset = synthetic_sst2(32)
eval_dataset = synthetic_sst2(16)

data_collator = transformers.data.data_collator.default_data_collator
train_dataloader = DataLoader(train_dataset, batch_size=8, shuffle=False, drop_last=False, collate_fn=data_collator)
eval_dataloader = DataLoader(eval_dataset,batch_size=8, shuffle=False, drop_last=False, collate_fn=data_collator)

from torchmetrics.classification import MulticlassAccuracy
from jaxcomposer.models.huggingface import HuggingFaceModel
from jaxcomposer.metrics import CrossEntropy

metrics = [CrossEntropy(), MulticlassAccuracy(num_classes=2, average='micro')]
# Package as a trainer-friendly Composer model
composer_model = HuggingFaceModel(model, tokenizer=tokenizer, metrics=metrics, use_logits=True)

from torch.optim import AdamW
from torch.optim.lr_scheduler import LinearLR

optimizer = AdamW(
    params=composer_model.parameters(),
    lr=3e-5, betas=(0.9, 0.98),
    eps=1e-6, weight_decay=3e-6
)
linear_lr_decay = LinearLR(
    optimizer, start_factor=1.0,
    end_factor=0, total_iters=150
)

from jaxcomposer import Trainer

classifier_before = model.classifier.weight.detach().clone()
# Create Trainer Object
trainer = Trainer(
    model=composer_model, # This is the model from the HuggingFaceModel wrapper class.
    train_dataloader=train_dataloader,
    eval_dataloader=eval_dataloader,
    max_duration="1ep",
    optimizers=optimizer,
    schedulers=[linear_lr_decay],
    device='gpu' if torch.cuda.is_available() else 'cpu',
    train_subset_num_batches=2,
    precision='fp32',
    seed=17
)
# Start training
trainer.fit()

print(trainer.state.eval_metrics)
assert set(trainer.state.eval_metrics['eval']) == {'CrossEntropy', 'MulticlassAccuracy'}
assert 0.0 <= float(trainer.state.eval_metrics['eval']['MulticlassAccuracy'].compute()) <= 1.0
assert float(trainer.state.eval_metrics['eval']['CrossEntropy'].compute()) > 0.0
assert int(trainer.state.timestamp.batch) == 2  # train_subset_num_batches
assert trainer.state.seed == 17
assert not torch.equal(model.classifier.weight.detach(), classifier_before)  # the HF model was trained in place

eval_batch = next(iter(eval_dataloader))

# Move batch to gpu
eval_batch = {k: v.cuda() if torch.cuda.is_available() else v for k, v in eval_batch.items()}
with torch.no_grad():
    predictions = composer_model(eval_batch)["logits"].argmax(dim=1)
assert predictions.shape == (8,) and set(predictions.tolist()) <= {0, 1}

torch.save(trainer.state.model.state_dict(), 'model.pt')
assert os.path.getsize('model.pt') > 0
