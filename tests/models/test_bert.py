"""Native BERT: HF parameter counts, output parity with Hugging Face's BERT (both heads and the headless model),
exact weight conversion, GatedLinearUnits and ALiBi surgery, MLM masking, and the masked-LM task."""
from __future__ import annotations

import warnings

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import torch
import transformers
from flax import nnx

from torch_bridge.weights import from_torch_state_dict, to_torch_state_dict
from jaxcomposer.algorithms.alibi import AlibiBias, FrozenPositionEmbedding, alibi_head_slopes, apply_alibi
from jaxcomposer.errors import NoEffectWarning
from jaxcomposer.algorithms.gated_linear_units import BERTGatedFFOutput, Identity, apply_gated_linear_units
from jaxcomposer.data.mlm import mask_tokens
from jaxcomposer.models import BERT, BERT_SIZES, ComposerMaskedLM, bert, num_params, sharding
from jaxcomposer.models.bert import BertIntermediate, BertOutput, softmax_attention
from tests.torch_bridge.parity import LAYER_TOL, MODEL_TOL, assert_close_on_scale

# module-level caches (models, HF twins, jitted forwards): keep its tests on one xdist worker
pytestmark = pytest.mark.xdist_group("test_bert")

TINY = dict(vocab_size=64, max_position_embeddings=16, type_vocab_size=2, d_model=32, n_layers=2, n_heads=4, d_ff=64)
NUM_LABELS = 3
HF_HEADS = {"mlm": transformers.BertForMaskedLM, "classification": transformers.BertForSequenceClassification,
            None: transformers.BertModel}


def hf_config(**kw) -> transformers.BertConfig:
    return transformers.BertConfig(
        vocab_size=TINY["vocab_size"], hidden_size=TINY["d_model"], num_hidden_layers=TINY["n_layers"],
        num_attention_heads=TINY["n_heads"], intermediate_size=TINY["d_ff"],
        max_position_embeddings=TINY["max_position_embeddings"], type_vocab_size=TINY["type_vocab_size"],
        num_labels=NUM_LABELS, attn_implementation="eager", **kw)


def randomize(model: nnx.Module, seed: int) -> nnx.Module:
    """Numpy noise in every variable (biases, LN scales and the MLM bias too), so no mapping hides behind 0 or 1."""
    rng = np.random.default_rng(seed)
    for path, var in nnx.to_flat_state(nnx.state(model)):
        shape, leaf = var.get_value().shape, path[-1]
        noise = rng.standard_normal(shape)
        value = {"kernel": noise / np.sqrt(np.prod(shape[:-1])), "embedding": 0.5 * noise,
                 "scale": 1.0 + 0.1 * noise}.get(leaf, 0.1 * noise)
        var.set_value(jnp.asarray(value.astype(np.float32)))
    return model


_MODELS: dict = {}


def tiny(head):
    """A tiny randomized BERT per head, built once."""
    if head not in _MODELS:
        _MODELS[head] = randomize(BERT(**TINY, head=head, num_labels=NUM_LABELS, rngs=nnx.Rngs(0)), seed=1)
    return _MODELS[head]


@nnx.jit
def forward(model, ids, mask, types):
    return model(ids, train=False, attention_mask=mask, token_type_ids=types)


def batch(b=3, t=12, seed=0):
    """Token ids with padding (id 0) behind the attention mask, and token types 0 then 1 (two segments)."""
    rng = np.random.default_rng(seed)
    ids = rng.integers(1, TINY["vocab_size"], size=(b, t))
    mask = np.ones((b, t), np.int64)
    for row, n_pad in zip(range(b), (0, 4, 7)):
        if n_pad:
            mask[row, -n_pad:] = 0
            ids[row, -n_pad:] = 0
    types = np.zeros((b, t), np.int64)
    types[:, t // 2:] = 1
    return ids, mask, types


def hf_outputs(hf, ids, mask, types):
    with torch.no_grad():
        out = hf(input_ids=torch.from_numpy(ids), attention_mask=torch.from_numpy(mask),
                 token_type_ids=torch.from_numpy(types))
    return (out.last_hidden_state, out.pooler_output) if isinstance(hf, transformers.BertModel) else out.logits


def ours_outputs(model, ids, mask, types):
    return forward(model, jnp.asarray(ids, jnp.int32), jnp.asarray(mask, jnp.int32), jnp.asarray(types, jnp.int32))


def assert_outputs_close(got, want, where):
    if isinstance(want, tuple):
        assert isinstance(got, tuple) and len(got) == 2
        assert_close_on_scale(got[0], want[0], MODEL_TOL, f"{where} sequence output")
        assert_close_on_scale(got[1], want[1], MODEL_TOL, f"{where} pooled output")
    else:
        assert_close_on_scale(got, want, MODEL_TOL, where)


# ------------------------------------------------------------------------------------------- sizes and layout


@pytest.mark.parametrize("head", ["mlm", "classification", None])
def test_base_parameter_counts_equal_hugging_face(head):
    d, n_layers, n_heads, d_ff, counts = BERT_SIZES["bert-base-uncased"]
    config = transformers.BertConfig(hidden_size=d, num_hidden_layers=n_layers, num_attention_heads=n_heads,
                                     intermediate_size=d_ff, num_labels=2)
    with torch.device("meta"):
        theirs = sum(p.numel() for p in HF_HEADS[head](config).parameters())  # tied weights counted once
    ours = num_params(nnx.eval_shape(lambda: bert("bert-base-uncased", head=head)))
    assert ours == theirs == counts[head]


def test_large_parameter_counts_match_the_table():
    # the headless model (the heads on top are checked at base size, against HF's)
    count = BERT_SIZES["bert-large-uncased"][4][None]
    assert num_params(nnx.eval_shape(lambda: bert("bert-large-uncased", head=None))) == count


@pytest.mark.parametrize("head", ["mlm", "classification", None])
def test_partition_rules_cover_every_parameter(head):
    axes = sharding.logical_axes(tiny(head))  # strict: raises on an unmatched path or a wrong rank
    assert axes["embeddings/word_embeddings/embedding"] == ("vocab", "embed")
    assert axes["layers/1/attention/query/kernel"] == ("embed", "heads")
    assert axes["layers/1/attention_output/dense/kernel"] == ("heads", "embed")
    assert axes["layers/1/output/dense/kernel"] == ("mlp", "embed")
    glu = apply_gated_linear_units(tiny(head))
    assert sharding.logical_axes(glu)["layers/0/output/gated_layer/kernel"] == ("embed", "mlp")


def test_init_follows_hugging_face():
    m = BERT(**TINY, rngs=nnx.Rngs(3))
    word = np.asarray(m.embeddings.word_embeddings.embedding.get_value())
    np.testing.assert_array_equal(word[0], 0.0)  # the padding row (pad_token_id=0)
    assert 0.015 < word[1:].std() < 0.025
    np.testing.assert_array_equal(np.asarray(m.layers[0].attention.query.bias.get_value()), 0.0)
    np.testing.assert_array_equal(np.asarray(m.layers[0].output.ln.scale.get_value()), 1.0)
    np.testing.assert_array_equal(np.asarray(m.mlm.bias.get_value()), 0.0)
    assert m.layers[0].output.ln.epsilon == 1e-12
    assert BERT(**TINY, head="classification", num_labels=5, rngs=nnx.Rngs(0)).num_classes == 5


def test_bad_arguments_name_the_argument():
    with pytest.raises(ValueError, match="head must be one of"):
        BERT(**TINY, head="nsp", rngs=nnx.Rngs(0))
    with pytest.raises(ValueError, match="size must be one of"):
        bert("bert-huge")
    with pytest.raises(ValueError, match="attention_mask must have the shape"):
        tiny("mlm")(jnp.ones((2, 5), jnp.int32), train=False, attention_mask=jnp.ones((2, 4)))
    with pytest.raises(ValueError, match="exceeds max_position_embeddings=16"):
        tiny("mlm")(jnp.ones((1, 17), jnp.int32), train=False)


# ------------------------------------------------------------------------------------ parity with Hugging Face


@pytest.mark.parametrize("head", ["mlm", "classification", None])
def test_outputs_equal_hugging_face_with_padding_and_token_types(head):
    model = tiny(head)
    hf = HF_HEADS[head](hf_config()).eval()
    hf.load_state_dict(to_torch_state_dict(model), strict=True)
    ids, mask, types = batch()
    assert_outputs_close(ours_outputs(model, ids, mask, types), hf_outputs(hf, ids, mask, types), f"{head}")


def test_layers_equal_hugging_face():
    """Embeddings and the first encoder layer on their own, at the per-layer tolerance."""
    model = tiny("mlm")
    hf = transformers.BertForMaskedLM(hf_config()).eval()
    hf.load_state_dict(to_torch_state_dict(model), strict=True)
    ids, mask, types = batch()
    with torch.no_grad():
        emb_t = hf.bert.embeddings(input_ids=torch.from_numpy(ids), token_type_ids=torch.from_numpy(types))
        add_mask = (1.0 - torch.from_numpy(mask)[:, None, None, :].float()) * torch.finfo(torch.float32).min
        layer_t = hf.bert.encoder.layer[0](emb_t, attention_mask=add_mask)
        layer_t = layer_t[0] if isinstance(layer_t, tuple) else layer_t
    emb = model.embeddings(jnp.asarray(ids), jnp.asarray(types), train=False, key=None)
    assert_close_on_scale(emb, emb_t, LAYER_TOL, "embeddings")
    layer = model.layers[0](jnp.asarray(emb_t.numpy()), jnp.asarray(mask != 0)[:, None, None, :], train=False,
                            keys=[None] * 3)
    assert_close_on_scale(layer, layer_t, LAYER_TOL, "layer 0")


def test_hugging_face_state_dicts_load_and_match_outputs():
    """HF's own weights (perturbed from its init) into ours, through the name and wrapper handling."""
    torch.manual_seed(0)
    ids, mask, types = batch(seed=1)
    for head in ("mlm", "classification", None):
        hf = HF_HEADS[head](hf_config()).eval()
        with torch.no_grad():
            for p in hf.parameters():
                p.add_(0.05 * torch.randn(p.shape))
        sd = hf.state_dict()
        if head == "mlm":  # an older checkpoint's buffers and Composer's wrapper prefix
            sd = {"model." + k: v for k, v in {**sd, "bert.embeddings.position_ids": torch.arange(16)[None]}.items()}
        template = BERT(**TINY, head=head, num_labels=NUM_LABELS, rngs=nnx.Rngs(0))
        ours = from_torch_state_dict(template, sd)
        assert_outputs_close(ours_outputs(ours, ids, mask, types), hf_outputs(hf, ids, mask, types), f"HF {head}")


def test_round_trip_through_hugging_face_is_bitwise():
    for head in ("mlm", "classification", None):
        model = tiny(head)
        sd = to_torch_state_dict(model)
        hf = HF_HEADS[head](hf_config())
        hf.load_state_dict(sd, strict=True)
        assert set(sd) == set(hf.state_dict())  # including both tied keys of the MLM head
        back = from_torch_state_dict(BERT(**TINY, head=head, num_labels=NUM_LABELS, rngs=nnx.Rngs(9)),
                                     hf.state_dict())
        for (path, a), (_, b) in zip(nnx.to_flat_state(nnx.state(model)), nnx.to_flat_state(nnx.state(back))):
            np.testing.assert_array_equal(np.asarray(a.get_value()), np.asarray(b.get_value()), err_msg=str(path))


def test_named_models_build_from_a_state_dict():
    """``from_torch_state_dict("bert-base-uncased", ...)``: the name's builder with keywords passed through (here
    shrunk to the tiny shapes, so no 440 MB state dict is needed)."""
    sd = to_torch_state_dict(tiny("classification"))
    loaded = from_torch_state_dict("bert-base-uncased", sd, head="classification", num_labels=NUM_LABELS, **TINY)
    ids, mask, types = batch()
    np.testing.assert_array_equal(np.asarray(ours_outputs(loaded, ids, mask, types)),
                                  np.asarray(ours_outputs(tiny("classification"), ids, mask, types)))
    with pytest.raises(ValueError, match="bert.embeddings.word_embeddings.weight"):  # tiny weights, base shapes
        from_torch_state_dict("bert-large-uncased", sd, head="classification", num_labels=NUM_LABELS)


def test_mismatched_state_dicts_raise_naming_the_key():
    sd = to_torch_state_dict(tiny("mlm"))
    missing = {k: v for k, v in sd.items() if k != "bert.encoder.layer.1.output.dense.bias"}
    with pytest.raises(ValueError, match=r"missing key 'bert\.encoder\.layer\.1\.output\.dense\.bias'"):
        from_torch_state_dict(tiny("mlm"), missing)
    wrong = {**sd, "cls.predictions.transform.dense.weight": torch.zeros(32, 16)}
    with pytest.raises(ValueError, match=r"'cls\.predictions\.transform\.dense\.weight': expected shape \(32, 32\)"):
        from_torch_state_dict(tiny("mlm"), wrong)
    untied = {**sd, "cls.predictions.decoder.bias": sd["cls.predictions.bias"] + 1.0}
    with pytest.raises(ValueError, match=r"'cls\.predictions\.decoder\.bias'"):
        from_torch_state_dict(tiny("mlm"), untied)


# ------------------------------------------------------------------------------------- attention and dropout


def test_softmax_attention_equals_dot_product_attention():
    """The training path (plain softmax, for attention-probability dropout) agrees with the evaluation path."""
    rng = np.random.default_rng(0)
    q, k, v = (jnp.asarray(rng.standard_normal((2, 6, 4, 8)), jnp.float32) for _ in range(3))
    bias = AlibiBias(tuple(alibi_head_slopes(4)), symmetric=True)(6)
    mask = jnp.asarray(np.array([[1] * 6, [1] * 3 + [0] * 3], bool))[:, None, None, :]
    want = jax.nn.dot_product_attention(q, k, v, bias=bias, mask=mask)
    assert_close_on_scale(softmax_attention(q, k, v, bias, mask), want, LAYER_TOL, "attention")


def test_training_dropout_is_keyed():
    model = BERT(**TINY, dropout=0.0, attention_dropout=0.5, rngs=nnx.Rngs(0))
    ids = jnp.asarray(batch()[0], jnp.int32)
    a, b = (model(ids, train=True, key=jax.random.key(s)) for s in (0, 0))
    c = model(ids, train=True, key=jax.random.key(1))
    np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
    assert not np.allclose(np.asarray(a), np.asarray(c))
    with pytest.raises(ValueError, match="needs a PRNG key"):
        model(ids, train=True)


# -------------------------------------------------------------------------------------------------- methods


def test_gated_linear_units_convert_every_layer_as_composer():
    model = tiny("mlm")
    glu = apply_gated_linear_units(model, seed=0)
    layers = list(glu.layers)
    assert all(isinstance(layer.intermediate, Identity) for layer in layers)
    assert all(isinstance(layer.output, BERTGatedFFOutput) for layer in layers)
    graph = [m for _, m in nnx.iter_graph(glu)]
    assert not any(isinstance(m, BertIntermediate) for m in graph)
    assert sum(isinstance(m, BertOutput) for m in graph) == TINY["n_layers"]  # only the attention outputs remain
    assert isinstance(model.layers[0].intermediate, BertIntermediate)  # the original is untouched (a clone)
    out = layers[0].output
    assert out.dropout.rate == 0.1 and out.layernorm.epsilon == 1e-12 and out.wo.use_bias
    assert out.gated_layer.bias is None and out.non_gated_layer.bias is None
    d, d_ff, n = TINY["d_model"], TINY["d_ff"], TINY["n_layers"]
    assert num_params(glu) - num_params(model) == n * (d * d_ff - d_ff)  # + a d x d_ff matrix, - intermediate bias
    # the gated output is Composer's formula: layernorm(wo(act(gated(x)) * non_gated(x)) + residual)
    x, res = (jnp.asarray(np.random.default_rng(s).standard_normal((2, 5, d)), jnp.float32) for s in (0, 1))
    g = jax.nn.gelu(x @ out.gated_layer.kernel[...], approximate=False) * (x @ out.non_gated_layer.kernel[...])
    h = g @ out.wo.kernel[...] + out.wo.bias[...][None, None] + res
    want = (h - h.mean(-1, keepdims=True)) / jnp.sqrt(h.var(-1, keepdims=True) + 1e-12)
    assert_close_on_scale(out(x, res, train=False, key=None), want, LAYER_TOL, "BERTGatedFFOutput")
    ids, mask, types = (jnp.asarray(a, jnp.int32) for a in batch())
    jitted = forward(glu, ids, mask, types)
    assert_close_on_scale(jitted, glu(ids, train=False, attention_mask=mask, token_type_ids=types), LAYER_TOL,
                          "GLU jit vs eager")
    # training: the gated output's dropout draws from its layer's key
    a, b = (glu(ids, train=True, key=jax.random.key(s), attention_mask=mask) for s in (0, 1))
    assert not np.allclose(np.asarray(a), np.asarray(b))
    with pytest.warns(NoEffectWarning):
        apply_gated_linear_units(glu)


def test_alibi_zeroes_positions_and_adds_a_symmetric_bias():
    model = tiny("classification")
    new = apply_alibi(model, max_sequence_length=24)
    table = new.embeddings.position_embeddings.embedding
    assert isinstance(table, FrozenPositionEmbedding) and not isinstance(table, nnx.Param)
    np.testing.assert_array_equal(np.asarray(table.get_value()), np.zeros((24, TINY["d_model"])))
    assert num_params(model) - num_params(new) == TINY["max_position_embeddings"] * TINY["d_model"]
    biases = [layer.attention.attention_bias for layer in new.layers]
    assert len(biases) == TINY["n_layers"] and all(b == AlibiBias(tuple(alibi_head_slopes(4)), True) for b in biases)
    assert model.layers[0].attention.attention_bias is None  # the original is untouched
    assert sharding.logical_axes(new)["embeddings/position_embeddings/embedding"] == ("positions", "embed")
    bias = np.asarray(biases[0](7))
    np.testing.assert_array_equal(bias, bias.transpose(0, 1, 3, 2))
    i, j = np.meshgrid(np.arange(7), np.arange(7), indexing="ij")
    want = -np.asarray(alibi_head_slopes(4), np.float32)[None, :, None, None] * np.abs(i - j)[None, None]
    np.testing.assert_allclose(bias, want, rtol=1e-6)
    # longer than the original 16 positions: ALiBi extrapolates; jit == eager
    ids, mask, types = batch(t=20)
    ids, mask, types = (jnp.asarray(a, jnp.int32) for a in (ids, mask, types))
    jitted = forward(new, ids, mask, types)
    assert jitted.shape == (3, NUM_LABELS)
    assert_close_on_scale(jitted, new(ids, train=False, attention_mask=mask, token_type_ids=types), LAYER_TOL,
                          "ALiBi jit vs eager")
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        with pytest.raises(NoEffectWarning):
            apply_alibi(new, max_sequence_length=24)


# ------------------------------------------------------------------------------------- masking and the task


SPECIAL = (0, 1, 2)  # [PAD], [CLS], [SEP] in these tests; [MASK] is 3
VOCAB = 1000


def _mlm_batch(b=64, t=128, seed=0):
    rng = np.random.default_rng(seed)
    ids = rng.integers(4, VOCAB, size=(b, t))
    ids[:, 0], ids[:, -1] = 1, 2
    ids[: b // 2, -20:] = 0  # padding
    return ids


def test_mask_tokens_statistics_and_special_tokens():
    ids = _mlm_batch()
    inputs, labels = mask_tokens(ids, np.random.default_rng(0), mask_token_id=3, vocab_size=VOCAB,
                                 special_token_ids=SPECIAL)
    special = np.isin(ids, SPECIAL)
    selected = labels != -100
    np.testing.assert_array_equal(inputs[special], ids[special])  # special tokens untouched, never labels
    assert not selected[special].any()
    np.testing.assert_array_equal(labels[selected], ids[selected])
    np.testing.assert_array_equal(inputs[~selected], ids[~selected])

    def within(k, n, p):  # 5 standard deviations of a binomial(n, p)
        assert abs(k - n * p) <= 5 * np.sqrt(n * p * (1 - p)), (k, n, p)

    n_sel = int(selected.sum())
    within(n_sel, int((~special).sum()), 0.15)
    # a random replacement may draw the original token or [MASK] (1/VOCAB each), as HF's
    within(int((inputs[selected] == 3).sum()), n_sel, 0.8 + 0.1 / VOCAB)
    within(int((inputs[selected] == ids[selected]).sum()), n_sel, 0.1 + 0.1 / VOCAB)
    assert (inputs[selected] != 3).sum() > 0 and np.array_equal(ids, _mlm_batch())  # input not modified


def test_mask_tokens_equals_hugging_faces_collator_for_a_seed():
    class Tokenizer:  # what the collator's numpy path reads off a tokenizer when the special mask is given
        mask_token, mask_token_id, pad_token, pad_token_id = "[MASK]", 3, "[PAD]", 0

        def __len__(self):
            return VOCAB

    ids = _mlm_batch(b=8, t=32, seed=3)
    special = np.isin(ids, SPECIAL)
    collator = transformers.DataCollatorForLanguageModeling(Tokenizer(), return_tensors="np")
    collator.generator = np.random.default_rng(7)
    want_inputs, want_labels = collator.numpy_mask_tokens(ids.copy(), special_tokens_mask=special.astype(np.int64))
    inputs, labels = mask_tokens(ids, np.random.default_rng(7), mask_token_id=3, vocab_size=VOCAB,
                                 special_tokens_mask=special)
    np.testing.assert_array_equal(inputs, want_inputs)
    np.testing.assert_array_equal(labels, want_labels)


def test_mask_tokens_rejects_bad_arguments():
    with pytest.raises(ValueError, match="mlm_probability must be a probability"):
        mask_tokens(_mlm_batch(2, 4), np.random.default_rng(0), mask_token_id=3, vocab_size=9, mlm_probability=1.5)
    with pytest.raises(TypeError, match="rng must be a numpy.random.Generator"):
        mask_tokens(_mlm_batch(2, 4), 0, mask_token_id=3, vocab_size=9)


def test_masked_lm_task_loss_metrics_and_inputs():
    model = tiny("mlm")
    task = ComposerMaskedLM(model)
    ids, mask, _ = batch()
    labels = np.full(ids.shape, -100)
    labels[0, [1, 4, 5]] = ids[0, [1, 4, 5]]
    labels[1, 2] = ids[1, 2]  # row 2 has no masked position: loss 0
    b = {"input_ids": jnp.asarray(ids, jnp.int32), "attention_mask": jnp.asarray(mask, jnp.int32),
         "labels": jnp.asarray(labels, jnp.int32)}
    logits, _ = task.forward(task.params, task.state, b, train=False)
    np.testing.assert_array_equal(np.asarray(logits), np.asarray(model(b["input_ids"], train=False,
                                                                       attention_mask=b["attention_mask"])))
    lg = np.asarray(logits, np.float64)
    logp = lg - np.log(np.exp(lg - lg.max(-1, keepdims=True)).sum(-1, keepdims=True)) - lg.max(-1, keepdims=True)
    ce = {(r, c): -logp[r, c, labels[r, c]] for r, c in zip(*np.nonzero(labels != -100))}
    want = [np.mean([v for (r, _), v in ce.items() if r == row]) if row < 2 else 0.0 for row in range(3)]
    np.testing.assert_allclose(np.asarray(task.loss(logits, b)), want, rtol=1e-5, atol=1e-6)
    metrics = task.get_metrics()
    preds, targets = task.metric_inputs(logits, b)
    weight = jnp.ones((3,))
    values = {name: float(m.compute(m.update(m.init(), preds, targets, weight))) for name, m in metrics.items()}
    assert set(values) == {"LanguageCrossEntropy", "MaskedAccuracy"}
    ce_metric, acc_metric = values["LanguageCrossEntropy"], values["MaskedAccuracy"]
    np.testing.assert_allclose(ce_metric, np.mean(list(ce.values())), rtol=1e-5)
    hits = [lg[r, c].argmax() == labels[r, c] for r, c in ce]
    np.testing.assert_allclose(acc_metric, np.mean(hits), rtol=1e-6)
    assert task.num_tokens(b) == ids.size
