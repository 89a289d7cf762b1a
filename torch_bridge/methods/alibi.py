"""Alibi on torch modules (Composer's ``apply_alibi``), in place.

HF GPT-2: ``GPT2Model.wpe`` is zeroed and frozen (a persistent buffer of ``max_sequence_length`` rows, so the bridge
does not train it), and each ``GPT2Attention`` gets a ``forward`` computing eager attention with ALiBi's bias
(transformers 5 has no ``_attn`` method for Composer's patch to replace). Our ``torch_bridge.mirrors.TorchGPT``
twin gets the same treatment, so a torch twin and the native GPT with ALiBi compute the same function. The method
card is in :mod:`jaxcomposer.algorithms.alibi`.
"""
from __future__ import annotations

from types import MethodType

import torch
import torch.nn.functional as F
from torch import nn

from jaxcomposer.algorithms.alibi import alibi_head_slopes
from torch_bridge.surgery import replace_module_classes


def alibi_causal_bias(slopes: torch.Tensor, t: int, t_keys: int | None = None) -> torch.Tensor:
    """``(1, H, t, t_keys)``: ``-slope_h * (i - j)`` where key ``j <= i``, ``-inf``-like (dtype minimum) above the
    diagonal, so it is the whole causal mask too. The ``t`` queries are the last ``t`` of the ``t_keys`` positions
    (a key/value cache holds the earlier ones)."""
    t_keys = t if t_keys is None else t_keys
    keys = torch.arange(t_keys, device=slopes.device)
    distance = (keys[t_keys - t:, None] - keys[None, :]).to(slopes.dtype)
    bias = -slopes[None, :, None, None] * distance[None, None]
    return bias.masked_fill((distance < 0)[None, None], torch.finfo(slopes.dtype).min)


def _freeze_zero_positions(embedding: nn.Embedding, max_sequence_length: int) -> None:
    """Composer's ``zero_and_freeze_expand_position_embeddings``: zeros of ``(max_sequence_length, d)``, not
    trained. A persistent buffer under the same name keeps the ``state_dict`` key and, unlike a ``Parameter`` with
    ``requires_grad=False``, stays out of the bridge's trained params."""
    old = embedding.weight
    del embedding.weight
    embedding.register_buffer("weight", torch.zeros((max_sequence_length, old.shape[1]), dtype=old.dtype,
                                                    device=old.device))
    embedding.num_embeddings = max_sequence_length


def _register_slopes(module: nn.Module, n_heads: int) -> None:
    device = next(module.parameters()).device
    # non-persistent: a function of the head count, so a constant of the exported graph, not a checkpoint entry
    module.register_buffer("alibi_slopes", torch.tensor(alibi_head_slopes(n_heads), dtype=torch.float32,
                                                        device=device), persistent=False)


def _gpt2_alibi_forward(self, hidden_states, cache=None, attention_mask=None, encoder_hidden_states=None,
                        encoder_attention_mask=None, output_attentions=False, **kwargs):
    """``GPT2Attention.forward`` with ALiBi: eager attention, the bias added to the scaled logits before the
    causal mask, the padding mask and the softmax (Composer's ``_attn``)."""
    if encoder_hidden_states is not None or self.is_cross_attention:
        raise NotImplementedError("Alibi: the converted GPT2Attention supports causal self-attention, not "
                                  "cross-attention.")
    b, t, d = hidden_states.shape
    q, k, v = self.c_attn(hidden_states).split(self.split_size, dim=2)
    q, k, v = (z.view(b, t, self.num_heads, self.head_dim).transpose(1, 2) for z in (q, k, v))
    if cache is not None:  # generation: earlier keys and values come from the cache
        cache = getattr(cache, "self_attention_cache", cache)
        k, v = cache.update(k, v, self.layer_idx)
    scores = torch.matmul(q, k.transpose(-1, -2)) * self.scaling
    scores = scores + alibi_causal_bias(self.alibi_slopes, t, k.shape[-2]).to(scores.dtype)
    if attention_mask is not None:
        if attention_mask.dtype == torch.bool:
            scores = scores.masked_fill(~attention_mask, torch.finfo(scores.dtype).min)
        else:
            scores = scores + attention_mask
    weights = F.softmax(scores, dim=-1).type(v.dtype)
    weights = F.dropout(weights, p=self.attn_dropout.p, training=self.training)
    out = torch.matmul(weights, v).transpose(1, 2).reshape(b, t, d)
    return self.resid_dropout(self.c_proj(out)), weights


def _twin_alibi_forward(self, x: torch.Tensor) -> torch.Tensor:
    """``torch_bridge.mirrors.TorchCausalSelfAttention.forward`` with ALiBi (the bias carries the causal mask)."""
    b, t, d = x.shape
    q, k, v = self.qkv(x).split(d, dim=-1)
    q, k, v = (z.view(b, t, self.n_heads, d // self.n_heads).transpose(1, 2) for z in (q, k, v))
    y = F.scaled_dot_product_attention(q, k, v, attn_mask=alibi_causal_bias(self.alibi_slopes, t).to(q.dtype))
    return self.proj(y.transpose(1, 2).reshape(b, t, d))


def _policies(max_sequence_length: int) -> dict:
    from torch_bridge.mirrors import TorchCausalSelfAttention, TorchGPT

    policies = {}

    def positions(attribute: str):
        def convert(module: nn.Module, index: int):
            _freeze_zero_positions(getattr(module, attribute), max_sequence_length)
            if isinstance(module, TorchGPT):
                module.seq_len = max_sequence_length  # its length check: positions come from the bias now
            return module
        return convert

    def attention(heads_attribute: str, forward):
        def convert(module: nn.Module, index: int):
            if hasattr(module, "alibi_slopes"):
                return None  # converted before: not counted, not patched twice
            _register_slopes(module, int(getattr(module, heads_attribute)))
            module.forward = MethodType(forward, module)
            return module
        return convert

    policies[TorchGPT] = positions("wpe")
    policies[TorchCausalSelfAttention] = attention("n_heads", _twin_alibi_forward)
    try:
        from transformers.models.gpt2.modeling_gpt2 import GPT2Attention, GPT2Model
    except ImportError:  # no transformers: no HF model can be in the module either
        return policies
    policies[GPT2Model] = positions("wpe")
    policies[GPT2Attention] = attention("num_heads", _gpt2_alibi_forward)
    return policies


def apply_alibi_torch(model: nn.Module, max_sequence_length: int) -> tuple[nn.Module, int]:
    """Converts ``model`` in place; ``(model, number of attention modules converted)``."""
    policies = _policies(max_sequence_length)
    # replace_module_classes never visits the root: a bare TorchGPT / GPT2Model passed in is converted here
    for cls, convert in policies.items():
        if isinstance(model, cls):
            convert(model, 0)
    _, replaced = replace_module_classes(model, policies)
    attention_classes = tuple(c for c in policies if "Attention" in c.__name__)
    return model, sum(isinstance(m, attention_classes) for m in replaced)


SURGERY = {"Alibi": apply_alibi_torch}
