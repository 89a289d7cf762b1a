"""A small model zoo for bridge parity tests: every model is built from code or a config (nothing downloaded).

Each entry of ``ZOO`` is a :class:`ZooCase`: ``build()`` returns a seeded torch module (in train mode),
``inputs(batch)`` a tuple of example input tensors, ``targets(batch)`` integer CE targets shaped like the logits
without their last axis, ``has_bn`` whether the model carries BatchNorm buffers.
"""
from __future__ import annotations

import dataclasses
from typing import Callable

import torch
import torch.nn as nn
import torch.nn.functional as F


def _seed_bn_stats(module: nn.Module) -> nn.Module:
    """Non-trivial running stats so eval graphs really use them."""
    g = torch.Generator().manual_seed(123)
    with torch.no_grad():
        for m in module.modules():
            if isinstance(m, nn.modules.batchnorm._BatchNorm):
                m.running_mean.copy_(torch.rand(m.running_mean.shape, generator=g) - 0.5)
                m.running_var.copy_(torch.rand(m.running_var.shape, generator=g) + 0.5)
    return module


# ---------------------------------------------------------------------------------------------------- (a) CNN
class SmallCNN(nn.Module):
    """Conv-BN-ReLU-MaxPool x2, Dropout, Linear; NCHW ``(B, 3, 16, 16)`` -> ``(B, num_classes)``."""

    def __init__(self, in_ch: int = 3, num_classes: int = 10, width: int = 8, p: float = 0.25):
        super().__init__()
        self.conv1, self.bn1 = nn.Conv2d(in_ch, width, 3, padding=1, bias=False), nn.BatchNorm2d(width)
        self.conv2, self.bn2 = nn.Conv2d(width, 2 * width, 3, padding=1, bias=False), nn.BatchNorm2d(2 * width)
        self.pool, self.drop = nn.MaxPool2d(2), nn.Dropout(p)
        self.fc = nn.Linear(2 * width, num_classes)

    def forward(self, x):
        x = self.pool(F.relu(self.bn1(self.conv1(x))))
        x = self.pool(F.relu(self.bn2(self.conv2(x))))
        return self.fc(self.drop(torch.flatten(F.adaptive_avg_pool2d(x, 1), 1)))


class ConvBNReLU(nn.Module):
    """The first block of ``SmallCNN`` as its own module (for the per-layer check)."""

    def __init__(self, conv: nn.Conv2d, bn: nn.BatchNorm2d):
        super().__init__()
        self.conv, self.bn = conv, bn

    def forward(self, x):
        return F.relu(self.bn(self.conv(x)))


# ---------------------------------------------------------------------------------------------------- (b) ResNets
class BasicBlock(nn.Module):
    expansion = 1

    def __init__(self, cin: int, planes: int, stride: int = 1):
        super().__init__()
        self.conv1 = nn.Conv2d(cin, planes, 3, stride, 1, bias=False)
        self.bn1 = nn.BatchNorm2d(planes)
        self.conv2 = nn.Conv2d(planes, planes, 3, 1, 1, bias=False)
        self.bn2 = nn.BatchNorm2d(planes)
        self.shortcut = nn.Sequential()
        if stride != 1 or cin != planes:
            self.shortcut = nn.Sequential(nn.Conv2d(cin, planes, 1, stride, bias=False), nn.BatchNorm2d(planes))

    def forward(self, x):
        out = F.relu(self.bn1(self.conv1(x)))
        out = self.bn2(self.conv2(out))
        return F.relu(out + self.shortcut(x))


class Bottleneck(nn.Module):
    expansion = 4

    def __init__(self, cin: int, planes: int, stride: int = 1):
        super().__init__()
        out = planes * self.expansion
        self.conv1, self.bn1 = nn.Conv2d(cin, planes, 1, bias=False), nn.BatchNorm2d(planes)
        self.conv2, self.bn2 = nn.Conv2d(planes, planes, 3, stride, 1, bias=False), nn.BatchNorm2d(planes)
        self.conv3, self.bn3 = nn.Conv2d(planes, out, 1, bias=False), nn.BatchNorm2d(out)
        self.downsample = None
        if stride != 1 or cin != out:
            self.downsample = nn.Sequential(nn.Conv2d(cin, out, 1, stride, bias=False), nn.BatchNorm2d(out))

    def forward(self, x):
        identity = x if self.downsample is None else self.downsample(x)
        out = F.relu(self.bn1(self.conv1(x)))
        out = F.relu(self.bn2(self.conv2(out)))
        out = self.bn3(self.conv3(out))
        return F.relu(out + identity)


class ResNet(nn.Module):
    """torchvision-style ResNet: stem conv+BN+ReLU+MaxPool, four stages, adaptive avg pool, fc."""

    def __init__(self, block, layers, widths=(8, 16, 32, 64), num_classes: int = 10, in_ch: int = 3):
        super().__init__()
        stem = widths[0]
        self.conv1 = nn.Conv2d(in_ch, stem, 3, 1, 1, bias=False)
        self.bn1 = nn.BatchNorm2d(stem)
        self.maxpool = nn.MaxPool2d(3, 2, 1)
        cin, stages = stem, []
        for i, (w, n) in enumerate(zip(widths, layers)):
            blocks = []
            for j in range(n):
                blocks.append(block(cin, w, 2 if (i > 0 and j == 0) else 1))
                cin = w * block.expansion
            stages.append(nn.Sequential(*blocks))
        self.layer1, self.layer2, self.layer3, self.layer4 = stages
        self.avgpool = nn.AdaptiveAvgPool2d(1)
        self.fc = nn.Linear(cin, num_classes)

    def forward(self, x):
        x = self.maxpool(F.relu(self.bn1(self.conv1(x))))
        x = self.layer4(self.layer3(self.layer2(self.layer1(x))))
        return self.fc(torch.flatten(self.avgpool(x), 1))


def resnet18_tiny(num_classes: int = 10) -> ResNet:
    return ResNet(BasicBlock, [2, 2, 2, 2], (8, 16, 32, 64), num_classes)


def resnet50_tiny(num_classes: int = 10) -> ResNet:
    return ResNet(Bottleneck, [1, 1, 1, 1], (4, 8, 8, 16), num_classes)


# ---------------------------------------------------------------------------------------------------- (c) GPT
class GPTBlock(nn.Module):
    def __init__(self, d: int, heads: int, p: float):
        super().__init__()
        self.heads, self.p = heads, p
        self.ln1, self.attn, self.proj = nn.LayerNorm(d), nn.Linear(d, 3 * d), nn.Linear(d, d)
        self.ln2, self.drop = nn.LayerNorm(d), nn.Dropout(p)
        self.mlp = nn.Sequential(nn.Linear(d, 4 * d), nn.GELU(approximate="tanh"), nn.Linear(4 * d, d))

    def forward(self, x):
        b, t, c = x.shape
        q, k, v = self.attn(self.ln1(x)).split(c, dim=2)
        q, k, v = (z.view(b, t, self.heads, c // self.heads).transpose(1, 2) for z in (q, k, v))
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True, dropout_p=self.p if self.training else 0.0)
        x = x + self.drop(self.proj(y.transpose(1, 2).contiguous().view(b, t, c)))
        return x + self.drop(self.mlp(self.ln2(x)))


class TinyGPT(nn.Module):
    """GPT with SDPA(is_causal=True) and an LM head tied to the token embedding; ``(B, T)`` -> ``(B, T, V)``."""

    def __init__(self, vocab: int = 64, block: int = 16, d: int = 32, heads: int = 2, layers: int = 2,
                 p: float = 0.1):
        super().__init__()
        self.wte, self.wpe, self.drop = nn.Embedding(vocab, d), nn.Embedding(block, d), nn.Dropout(p)
        self.blocks = nn.ModuleList([GPTBlock(d, heads, p) for _ in range(layers)])
        self.ln_f, self.lm_head = nn.LayerNorm(d), nn.Linear(d, vocab, bias=False)
        self.lm_head.weight = self.wte.weight

    def forward(self, idx):
        pos = torch.arange(idx.shape[1], device=idx.device)
        x = self.drop(self.wte(idx) + self.wpe(pos))
        for blk in self.blocks:
            x = blk(x)
        return self.lm_head(self.ln_f(x))


# ---------------------------------------------------------------------------------------------------- (d) HF
class HFGPT2(nn.Module):
    """``GPT2LMHeadModel`` returning ``.logits`` (no KV cache)."""

    def __init__(self, vocab: int = 128, n_positions: int = 32):
        super().__init__()
        from transformers import GPT2Config, GPT2LMHeadModel
        self.model = GPT2LMHeadModel(GPT2Config(vocab_size=vocab, n_positions=n_positions, n_embd=32, n_layer=2,
                                                n_head=2))

    def forward(self, input_ids):
        return self.model(input_ids, use_cache=False).logits


class HFBert(nn.Module):
    """``BertForSequenceClassification`` returning ``.logits``; ``attention_mask`` optional (then a 2nd input)."""

    def __init__(self, vocab: int = 128, num_labels: int = 3):
        super().__init__()
        from transformers import BertConfig, BertForSequenceClassification
        self.model = BertForSequenceClassification(BertConfig(
            vocab_size=vocab, hidden_size=32, num_hidden_layers=2, num_attention_heads=2, intermediate_size=64,
            max_position_embeddings=32, num_labels=num_labels))

    def forward(self, input_ids, attention_mask=None):
        return self.model(input_ids=input_ids, attention_mask=attention_mask).logits


class HFLlama(nn.Module):
    """``LlamaForCausalLM`` (RMSNorm, rotary positions, grouped-query attention, SwiGLU) returning ``.logits``."""

    def __init__(self, vocab: int = 128):
        super().__init__()
        from transformers import LlamaConfig, LlamaForCausalLM
        self.model = LlamaForCausalLM(LlamaConfig(
            vocab_size=vocab, hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
            num_key_value_heads=2, max_position_embeddings=32))

    def forward(self, input_ids):
        return self.model(input_ids, use_cache=False).logits


class HFT5(nn.Module):
    """``T5ForConditionalGeneration`` (encoder-decoder, relative position buckets) on (input_ids, decoder ids)."""

    def __init__(self, vocab: int = 128):
        super().__init__()
        from transformers import T5Config, T5ForConditionalGeneration
        self.model = T5ForConditionalGeneration(T5Config(
            vocab_size=vocab, d_model=32, d_kv=8, d_ff=64, num_layers=2, num_heads=4, decoder_start_token_id=0))

    def forward(self, input_ids, decoder_input_ids):
        return self.model(input_ids=input_ids, decoder_input_ids=decoder_input_ids, use_cache=False).logits


class HFViT(nn.Module):
    """``ViTForImageClassification`` on 16-px images in 4-px patches, returning ``.logits``."""

    def __init__(self, num_labels: int = 10):
        super().__init__()
        from transformers import ViTConfig, ViTForImageClassification
        self.model = ViTForImageClassification(ViTConfig(
            image_size=16, patch_size=4, num_channels=3, hidden_size=32, num_hidden_layers=2, num_attention_heads=2,
            intermediate_size=64, num_labels=num_labels))

    def forward(self, pixel_values):
        return self.model(pixel_values=pixel_values).logits


class LSTMClassifier(nn.Module):
    """Embedding, a 2-layer bidirectional ``nn.LSTM`` (one ``aten.lstm`` op, a scan per layer and direction in the
    bridge) with inter-layer dropout, mean over time, linear head."""

    def __init__(self, vocab: int = 64, num_classes: int = 5):
        super().__init__()
        self.embed = nn.Embedding(vocab, 16)
        self.rnn = nn.LSTM(16, 24, num_layers=2, bidirectional=True, batch_first=True, dropout=0.1)
        self.head = nn.Linear(48, num_classes)

    def forward(self, tokens):
        out, _ = self.rnn(self.embed(tokens))
        return self.head(out.mean(1))


# ---------------------------------------------------------------------------------------------------- registry
@dataclasses.dataclass(frozen=True)
class ZooCase:
    build: Callable[[], nn.Module]
    inputs: Callable[[int], tuple]
    targets: Callable[[int], torch.Tensor]
    has_bn: bool = False


def _gen(seed: int) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


def _seeded(fn):
    def build():
        torch.manual_seed(0)
        return _seed_bn_stats(fn())
    return build


def _images(b, c=3, hw=16):
    return (torch.randn(b, c, hw, hw, generator=_gen(1)),)


def _tokens(vocab, t):
    return lambda b: (torch.randint(0, vocab, (b, t), generator=_gen(3)),)


def _seq2seq_tokens(vocab, t_in, t_out):
    return lambda b: (torch.randint(0, vocab, (b, t_in), generator=_gen(3)),
                      torch.randint(0, vocab, (b, t_out), generator=_gen(6)))


def _padded_tokens(vocab, t):
    def make(b):
        ids = torch.randint(1, vocab, (b, t), generator=_gen(3))
        lengths = torch.randint(t // 2, t + 1, (b,), generator=_gen(5))
        lengths[0] = t // 2  # at least one sequence is really padded
        mask = (torch.arange(t)[None, :] < lengths[:, None]).long()
        return ids * mask, mask
    return make


def _class_targets(n):
    return lambda b: torch.randint(0, n, (b,), generator=_gen(2))


def _token_targets(vocab, t):
    return lambda b: torch.randint(0, vocab, (b, t), generator=_gen(4))


ZOO: dict[str, ZooCase] = {
    "cnn": ZooCase(_seeded(SmallCNN), _images, _class_targets(10), has_bn=True),
    "resnet18": ZooCase(_seeded(resnet18_tiny), _images, _class_targets(10), has_bn=True),
    "resnet50": ZooCase(_seeded(resnet50_tiny), _images, _class_targets(10), has_bn=True),
    "gpt": ZooCase(_seeded(TinyGPT), _tokens(64, 16), _token_targets(64, 16)),
    "hf_gpt2": ZooCase(_seeded(HFGPT2), _tokens(128, 16), _token_targets(128, 16)),
    "hf_bert": ZooCase(_seeded(HFBert), _tokens(128, 16), _class_targets(3)),
    "hf_bert_mask": ZooCase(_seeded(HFBert), _padded_tokens(128, 16), _class_targets(3)),
    "hf_llama": ZooCase(_seeded(HFLlama), _tokens(128, 16), _token_targets(128, 16)),
    "hf_t5": ZooCase(_seeded(HFT5), _seq2seq_tokens(128, 12, 8), _token_targets(128, 8)),
    "hf_vit": ZooCase(_seeded(HFViT), _images, _class_targets(10)),
    "lstm": ZooCase(_seeded(LSTMClassifier), _tokens(64, 12), _class_targets(5)),
}


class TorchMLP(nn.Module):
    """No BN, no dropout: microbatched updates must equal full-batch ones."""

    def __init__(self, d_in: int = 3 * 8 * 8, hidden: int = 32, num_classes: int = 4):
        super().__init__()
        self.net = nn.Sequential(nn.Flatten(), nn.Linear(d_in, hidden), nn.Tanh(), nn.Linear(hidden, num_classes))

    def forward(self, x):
        return self.net(x)
