"""The metric protocol, one table for every metric: values against an independent reference (torchmetrics, torch, or
a direct loop written after Composer's definition), and the properties the Trainer relies on: batches merge by
addition, padded examples count for nothing, updates are jit-safe and give the same sums with the batch sharded over
two devices."""
import functools

import jax
import numpy as np
import pytest
import torch
import torch.nn.functional as F
from jax.sharding import NamedSharding, PartitionSpec as P

from jaxcomposer import metrics as M
from jaxcomposer.metrics.base import batch_states, check_metrics, compute_all, sum_states

B, C, T, H, W = 12, 5, 6, 4, 4
rng = np.random.default_rng(0)


def _classes(shape, n=C, ignore=None, share=0.0):
    y = rng.integers(0, n, shape)
    if ignore is not None:
        y = np.where(rng.random(shape) < share, ignore, y)
    return y.astype(np.int32)


LOGITS = rng.normal(size=(B, C)).astype(np.float32)
LABELS = _classes((B,))
_z = rng.normal(size=(B, C)) * 3
SOFT = (np.exp(_z) / np.exp(_z).sum(-1, keepdims=True)).astype(np.float32)
TOKEN_LOGITS = rng.normal(size=(B, T, C)).astype(np.float32)
TOKENS = _classes((B, T), ignore=-100, share=0.3)
BINARY_LOGITS = rng.normal(size=(B, 2)).astype(np.float32)
BINARY_SCORES = rng.normal(size=(B,)).astype(np.float32)
BINARY = _classes((B,), n=2)
PIXEL_LOGITS = rng.normal(size=(B, H, W, C)).astype(np.float32)
PIXELS = _classes((B, H, W), ignore=-1, share=0.2)


# ------------------------------------------------------------------------------------------- references
def ref_accuracy(logits, y, k=1):
    import torchmetrics
    m = torchmetrics.classification.MulticlassAccuracy(num_classes=C, top_k=k, average="micro")
    return float(m(torch.tensor(logits), torch.tensor(y).long()))


def ref_cross_entropy(logits, y, ignore_index=-100):
    x, t = torch.tensor(logits), torch.tensor(y)
    if t.shape == x.shape:
        return float(-(t * x.log_softmax(-1)).sum(-1).mean())
    return float(F.cross_entropy(x.reshape(-1, x.shape[-1]), t.reshape(-1).long(), ignore_index=ignore_index))


def ref_masked_accuracy(logits, y, ignore_index=-100):
    keep = y != ignore_index
    return float((logits.argmax(-1) == y)[keep].mean())


def ref_f1(scores, y):
    import torchmetrics
    s = torch.tensor(scores)
    preds = s.argmax(-1) if s.ndim == 2 else s  # torchmetrics reads (B,) logits through a sigmoid
    return float(torchmetrics.classification.BinaryF1Score()(preds.float() if s.ndim == 2 else preds,
                                                             torch.tensor(y)))


def ref_miou(logits, y, num_classes=C, ignore_index=-1):
    """Composer's MIoU, per sample with histograms, in plain numpy."""
    inter, union = np.zeros(num_classes), np.zeros(num_classes)
    for pred, target in zip(logits.argmax(-1), y):
        keep = target != ignore_index
        pred, target = pred[keep], target[keep]
        hist = lambda v: np.bincount(v, minlength=num_classes)[:num_classes]
        i = hist(pred[pred == target])
        inter += i
        union += hist(pred) + hist(target) - i
    present = union != 0
    return float(100 * (inter[present] / union[present]).mean())


def ref_dice(batches, num_classes=C):
    """Composer's Dice over a list of (logits, targets) batches, with its per-batch loop."""
    scores = np.zeros(num_classes - 1)
    for logits, y in batches:
        pred = logits.argmax(-1)
        for i in range(1, num_classes):
            if (y != i).all():
                scores[i - 1] += 1 if (pred != i).all() else 0
                continue
            tp, fp = ((pred == i) & (y == i)).sum(), ((pred == i) & (y != i)).sum()
            fn = ((pred != i) & (y == i)).sum()
            scores[i - 1] += 2 * tp / (2 * tp + fp + fn)
    return round(float(np.mean(100 * scores / len(batches))), 2)


# (id, metric, preds, targets, reference value over the whole batch, computed when a test asks: torchmetrics
# imports in seconds, and only the worker that runs these tests should pay that)
CASES = [
    ("accuracy", M.MulticlassAccuracy(num_classes=C), LOGITS, LABELS, lambda: ref_accuracy(LOGITS, LABELS)),
    ("accuracy-top2", M.MulticlassAccuracy(top_k=2), LOGITS, LABELS, lambda: ref_accuracy(LOGITS, LABELS, 2)),
    ("accuracy-soft", M.MulticlassAccuracy(), LOGITS, SOFT, lambda: ref_accuracy(LOGITS, SOFT.argmax(-1))),
    ("ce", M.CrossEntropy(), LOGITS, LABELS, lambda: ref_cross_entropy(LOGITS, LABELS)),
    ("ce-soft", M.CrossEntropy(), LOGITS, SOFT, lambda: ref_cross_entropy(LOGITS, SOFT)),
    ("lm-ce", M.LanguageCrossEntropy(), TOKEN_LOGITS, TOKENS, lambda: ref_cross_entropy(TOKEN_LOGITS, TOKENS)),
    ("lm-ce-mapping", M.LanguageCrossEntropy(), {"logits": TOKEN_LOGITS}, TOKENS,
     lambda: ref_cross_entropy(TOKEN_LOGITS, TOKENS)),
    ("perplexity", M.LanguagePerplexity(), TOKEN_LOGITS, TOKENS,
     lambda: float(np.exp(ref_cross_entropy(TOKEN_LOGITS, TOKENS)))),
    ("masked-accuracy", M.MaskedAccuracy(), TOKEN_LOGITS, TOKENS, lambda: ref_masked_accuracy(TOKEN_LOGITS, TOKENS)),
    ("f1-logits", M.BinaryF1Score(), BINARY_LOGITS, BINARY, lambda: ref_f1(BINARY_LOGITS, BINARY)),
    ("f1-scores", M.BinaryF1Score(), BINARY_SCORES, BINARY, lambda: ref_f1(BINARY_SCORES, BINARY)),
    ("miou", M.MIoU(C), PIXEL_LOGITS, PIXELS, lambda: ref_miou(PIXEL_LOGITS, PIXELS)),
    ("dice", M.Dice(C), PIXEL_LOGITS, np.maximum(PIXELS, 0),
     lambda: ref_dice([(PIXEL_LOGITS, np.maximum(PIXELS, 0))])),
    ("mean", M.MeanMetric(lambda p, t: (p.argmax(-1) == t) * 2.0, "Twice"), LOGITS, LABELS,
     lambda: 2 * ref_accuracy(LOGITS, LABELS)),
]
IDS = [c[0] for c in CASES]


@functools.cache
def expected(i) -> float:
    return CASES[i][4]()


PER_BATCH = {"dice"}  # Composer's Dice averages per batch: splitting a batch changes it by definition


def value(metric, states):
    return float(metric.compute(states))


@functools.cache
def jitted(i):
    metric = CASES[i][1]
    return jax.jit(lambda p, t, w: metric.update(metric.init(), p, t, w))


def run(i, parts, weight=None):
    """The metric of case i over batches ``parts`` (index arrays into its data), each through the jitted update."""
    _, metric, preds, target, _ = CASES[i]
    states = []
    for idx in parts:
        take = lambda a: jax.tree.map(lambda x: x[idx], a)
        w = np.ones(len(idx), np.float32) if weight is None else weight[idx]
        states.append({"m": jitted(i)(take(preds), take(target), w)})
    return value(metric, sum_states(states)["m"])


@pytest.mark.parametrize("i", range(len(CASES)), ids=IDS)
def test_matches_reference(i):
    assert run(i, [np.arange(B)]) == pytest.approx(expected(i), rel=1e-5, abs=1e-6)


@pytest.mark.parametrize("i", [i for i, c in enumerate(CASES) if c[0] not in PER_BATCH],
                         ids=[c for c in IDS if c not in PER_BATCH])
def test_batches_merge_by_addition(i):
    """Uneven batches (5, 4, 3) merged on the host give the whole batch's value."""
    assert run(i, [np.arange(0, 5), np.arange(5, 9), np.arange(9, B)]) == pytest.approx(expected(i), rel=1e-5,
                                                                                         abs=1e-6)


def test_dice_is_per_batch_as_composer():
    parts = [np.arange(0, 5), np.arange(5, B)]
    target = np.maximum(PIXELS, 0)
    per_batch = ref_dice([(PIXEL_LOGITS[p], target[p]) for p in parts])
    assert run(IDS.index("dice"), parts) == pytest.approx(per_batch, abs=1e-6)


@pytest.mark.parametrize("i", range(len(CASES)), ids=IDS)
def test_padded_examples_count_for_nothing(i):
    """The eval step's padding: garbage examples with weight 0 leave the value as it was."""
    _, metric, preds, target, _ = CASES[i]
    pad = lambda a: jax.tree.map(lambda x: np.concatenate([x, x[:3][::-1]]), a)  # other rows' values as garbage
    weight = np.r_[np.ones(B), np.zeros(3)].astype(np.float32)
    state = jitted(i)(pad(preds), pad(target), weight)
    assert value(metric, sum_states([{"m": state}])["m"]) == pytest.approx(expected(i), rel=1e-5, abs=1e-6)


def test_sharded_batch_sums_over_devices():
    """The batch split over the two test devices (as the Trainer's eval step shards it) gives the same sums."""
    devices = jax.devices()[:2]
    assert len(devices) == 2
    mesh = jax.sharding.Mesh(np.asarray(devices), ("data",))
    data = NamedSharding(mesh, P("data"))
    metrics = {c[0]: c[1] for c in CASES if c[0] in ("accuracy", "lm-ce", "miou", "f1-logits")}
    inputs = {c[0]: (c[2], c[3]) for c in CASES}

    def step(batch, w):
        return {k: batch_states({k: m}, *batch[k], w)[k] for k, m in metrics.items()}

    batch = {k: inputs[k] for k in metrics}
    w = np.ones(B, np.float32)
    whole = jax.jit(step)(batch, w)
    sharded = jax.jit(step, in_shardings=(data, data))(jax.device_put(batch, data), jax.device_put(w, data))
    for k in metrics:
        for a, b in zip(jax.tree.leaves(whole[k]), jax.tree.leaves(sharded[k])):
            np.testing.assert_allclose(a, b, rtol=1e-6, err_msg=k)


def test_host_sums_are_float64_and_exact_beyond_float32():
    """2^25 + 1 examples: float32 would lose the 1."""
    metric = M.MulticlassAccuracy()
    parts = [{"m": {"correct": np.float32(2 ** 25), "total": np.float32(2 ** 25)}},
             {"m": {"correct": np.float32(0), "total": np.float32(1)}}]
    total = sum_states(parts)["m"]
    assert total["total"].dtype == np.float64 and total["total"] == 2 ** 25 + 1
    assert compute_all({"m": metric}, {"m": total})["m"] == pytest.approx(2 ** 25 / (2 ** 25 + 1), rel=1e-12)


def test_names_are_composers():
    assert [m.name for m in (M.MulticlassAccuracy(), M.CrossEntropy(), M.BinaryF1Score(), M.LanguageCrossEntropy(),
                             M.LanguagePerplexity(), M.MaskedAccuracy(), M.MIoU(3), M.Dice(3))] == [
        "MulticlassAccuracy", "CrossEntropy", "BinaryF1Score", "LanguageCrossEntropy", "LanguagePerplexity",
        "MaskedAccuracy", "MIoU", "Dice"]
    assert M.MeanMetric(lambda p, t: p, "Score").name == "Score"


def test_bad_metrics_are_refused_with_the_replacement():
    import torchmetrics
    with pytest.raises(TypeError, match=r"MulticlassAccuracy is not a jaxcomposer metric.*jaxcomposer\.metrics\."
                                        r"MulticlassAccuracy\(\)"):
        check_metrics([torchmetrics.classification.MulticlassAccuracy(num_classes=3)], "val_metrics")
    with pytest.raises(ValueError, match="two metrics are named 'CrossEntropy'"):
        check_metrics([M.CrossEntropy(), M.CrossEntropy(ignore_index=0)], "val_metrics")
    assert list(check_metrics({"ce0": M.CrossEntropy(), "ce1": M.CrossEntropy(0)}, "x")) == ["ce0", "ce1"]
    with pytest.raises(ValueError, match="only 'micro'"):
        M.MulticlassAccuracy(average="macro")
    with pytest.raises(ValueError, match="num_classes=3"):
        M.MulticlassAccuracy(num_classes=3).update(M.MulticlassAccuracy().init(), LOGITS, LABELS, np.ones(B))
    with pytest.raises(ValueError, match="class_axis=1"):
        M.MIoU(C).update(M.MIoU(C).init(), PIXEL_LOGITS.transpose(0, 3, 1, 2), PIXELS, np.ones(B))
    nchw = M.MIoU(C, class_axis=1)
    state = nchw.update(nchw.init(), PIXEL_LOGITS.transpose(0, 3, 1, 2), PIXELS, np.ones(B, np.float32))
    assert float(nchw.compute(state)) == pytest.approx(ref_miou(PIXEL_LOGITS, PIXELS), rel=1e-5)
