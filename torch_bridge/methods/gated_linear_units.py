"""GatedLinearUnits on torch modules (Composer's ``apply_gated_linear_units``), in place.

HF BERT: ``BertIntermediate`` -> ``nn.Identity`` and ``BertOutput`` -> :class:`BERTGatedFFOutput`, exactly as
Composer. Our additions: HF GPT-2's ``GPT2MLP`` -> :class:`GatedGPT2MLP`, and the ``torch_bridge.mirrors.TorchGPT``
twin's ``TorchBlock`` (``fc`` -> ``Identity``, ``fc_proj`` -> :class:`GatedFFOutput`, its ``forward`` without the
inline GELU), as the native surgery does to ``Block``. The method card is in
:mod:`jaxcomposer.algorithms.gated_linear_units`.
"""
from __future__ import annotations

from typing import Callable

from types import MethodType

import torch
import torch.nn.functional as F
from torch import nn

from torch_bridge.surgery import replace_module_classes


class BERTGatedFFOutput(nn.Module):
    """Composer's layer: ``LayerNorm(wo(dropout(act(gated_layer(x)) * non_gated_layer(x))) + residual)``.

    Fresh layers with torch's default init, as Composer builds them; ``wo`` always has a bias.
    """

    def __init__(self, d_embed: int, d_ff: int, dropout_rate: float, act_fn: Callable, layernorm_eps: float,
                 gated_layer_bias: bool = False, non_gated_layer_bias: bool = False):
        super().__init__()
        self.gated_layer = nn.Linear(d_embed, d_ff, bias=gated_layer_bias)
        self.non_gated_layer = nn.Linear(d_embed, d_ff, bias=non_gated_layer_bias)
        self.wo = nn.Linear(d_ff, d_embed)
        self.dropout = nn.Dropout(dropout_rate)
        self.act = act_fn
        self.layernorm = nn.LayerNorm(d_embed, eps=layernorm_eps)

    def forward(self, hidden_states: torch.Tensor, residual_connection: torch.Tensor) -> torch.Tensor:
        h = self.act(self.gated_layer(hidden_states)) * self.non_gated_layer(hidden_states)
        return self.layernorm(self.wo(self.dropout(h)) + residual_connection)


class GatedFFOutput(nn.Module):
    """``wo(act(gated_layer(x)) * non_gated_layer(x))``: the torch twin of the native
    :class:`jaxcomposer.algorithms.gated_linear_units.GatedFFOutput` (same parameter names), fresh layers with torch's
    default init. It replaces ``fc_proj`` in ``torch_bridge.mirrors.TorchBlock``, whose ``drop`` follows it."""

    def __init__(self, d_embed: int, d_ff: int, act_fn: Callable, gated_layer_bias: bool = False,
                 non_gated_layer_bias: bool = False):
        super().__init__()
        self.gated_layer = nn.Linear(d_embed, d_ff, bias=gated_layer_bias)
        self.non_gated_layer = nn.Linear(d_embed, d_ff, bias=non_gated_layer_bias)
        self.wo = nn.Linear(d_ff, d_embed)
        self.act = act_fn

    def forward(self, hidden_states: torch.Tensor) -> torch.Tensor:
        return self.wo(self.act(self.gated_layer(hidden_states)) * self.non_gated_layer(hidden_states))


class GatedGPT2MLP(GatedFFOutput):
    """``GPT2MLP`` gated: ``dropout(wo(act(gated_layer(x)) * non_gated_layer(x)))`` (GPT-2's residual dropout
    stays after the projection, where ``GPT2MLP`` has it). Fresh layers with torch's default init."""

    def __init__(self, d_embed: int, d_ff: int, dropout_rate: float, act_fn: Callable,
                 gated_layer_bias: bool = False, non_gated_layer_bias: bool = False):
        super().__init__(d_embed, d_ff, act_fn, gated_layer_bias, non_gated_layer_bias)
        self.dropout = nn.Dropout(dropout_rate)

    def forward(self, hidden_states: torch.Tensor) -> torch.Tensor:
        return self.dropout(super().forward(hidden_states))


def gelu_tanh(x: torch.Tensor) -> torch.Tensor:
    """``TorchBlock``'s MLP activation (it calls it inline, so this is the twin's default ``act_fn``)."""
    return F.gelu(x, approximate="tanh")


def _twin_block_forward(self, x: torch.Tensor) -> torch.Tensor:
    """``TorchBlock.forward`` without the activation between ``fc`` (now ``Identity``) and ``fc_proj`` (now
    :class:`GatedFFOutput`): the native ``Block`` with ``mlp_act`` the identity."""
    x = x + self.drop(self.attn(self.ln1(x)))
    return x + self.drop(self.fc_proj(self.fc(self.ln2(x))))


def _convert_twin_blocks(model: nn.Module, act_fn: Callable | None, gated_layer_bias: bool,
                         non_gated_layer_bias: bool) -> int:
    from torch_bridge.mirrors import TorchBlock

    blocks = [m for m in model.modules() if isinstance(m, TorchBlock) and isinstance(m.fc, nn.Linear)]
    for block in blocks:
        device = block.fc.weight.device
        block.fc_proj = GatedFFOutput(block.fc.in_features, block.fc.out_features, act_fn or gelu_tanh,
                                      gated_layer_bias, non_gated_layer_bias).to(device)
        block.fc = nn.Identity()
        block.forward = MethodType(_twin_block_forward, block)
    return len(blocks)


def _hf_classes():
    try:
        from transformers.models.bert.modeling_bert import BertIntermediate, BertOutput
        from transformers.models.gpt2.modeling_gpt2 import GPT2MLP
    except ImportError:  # no transformers: no HF model can be in the module either
        return None
    return BertIntermediate, BertOutput, GPT2MLP


def _one_activation(acts: list, where: str) -> Callable:
    # As Composer: the activations' types must agree (two GELU instances are one activation)
    kinds = {type(a) for a in acts}
    if len(kinds) > 1:
        raise ValueError(f"GatedLinearUnits: the model's {where} modules use different activation functions "
                         f"({sorted(k.__name__ for k in kinds)}); this is unsupported, pass act_fn explicitly.")
    act = acts[0]
    if act is None:
        raise ValueError("GatedLinearUnits: the model's activation function is None; pass act_fn explicitly.")
    return act


def apply_gated_linear_units_torch(model: nn.Module, act_fn: Callable | None = None, gated_layer_bias: bool = False,
                                   non_gated_layer_bias: bool = False) -> tuple[nn.Module, int]:
    """Converts ``model`` in place; ``(model, number of MLPs converted)``."""
    count = _convert_twin_blocks(model, act_fn, gated_layer_bias, non_gated_layer_bias)
    classes = _hf_classes()
    if classes is None:
        return model, count
    bert_intermediate, bert_output, gpt2_mlp = classes
    intermediates = [m for m in model.modules() if isinstance(m, bert_intermediate)]
    gpt2_mlps = [m for m in model.modules() if isinstance(m, gpt2_mlp)]
    if intermediates:
        act = act_fn if act_fn is not None else _one_activation([m.intermediate_act_fn for m in intermediates],
                                                                "BertIntermediate")

        def to_gated_output(layer: nn.Module, index: int) -> BERTGatedFFOutput:
            return BERTGatedFFOutput(d_embed=layer.dense.out_features, d_ff=layer.dense.in_features,
                                     dropout_rate=layer.dropout.p, act_fn=act, layernorm_eps=layer.LayerNorm.eps,
                                     gated_layer_bias=gated_layer_bias, non_gated_layer_bias=non_gated_layer_bias)

        _, replaced = replace_module_classes(model, {bert_intermediate: lambda layer, index: nn.Identity(),
                                                     bert_output: to_gated_output})
        count += len(replaced) // 2
    if gpt2_mlps:
        act = act_fn if act_fn is not None else _one_activation([m.act for m in gpt2_mlps], "GPT2MLP")

        def to_gated_mlp(mlp: nn.Module, index: int) -> GatedGPT2MLP:
            d_embed, d_ff = mlp.c_fc.weight.shape  # Conv1D stores (in, out)
            return GatedGPT2MLP(d_embed, d_ff, mlp.dropout.p, act, gated_layer_bias, non_gated_layer_bias)

        _, replaced = replace_module_classes(model, {gpt2_mlp: to_gated_mlp})
        count += len(replaced)
    return model, count


SURGERY = {"GatedLinearUnits": apply_gated_linear_units_torch}
