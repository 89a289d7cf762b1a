"""Parity of the loss lowerings (torch_bridge/ops/loss.py) with the ATen ops themselves: values, dtypes and shapes
eagerly and under ``jax.jit``, gradients against torch autograd, and whole modules whose forward returns a loss,
bridged with ``from_torch`` (the graphs ``F.cross_entropy`` & co. export to, dynamic batch, train and eval)."""
import math

import jax
import jax.numpy as jnp
import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

import torch_bridge.ops.loss as loss_ops
from tests.torch_bridge.parity import (LAYER_TOL, MODEL_TOL, JitTable, assert_close_on_scale,
                                      assert_signature_matches_schema, check_parity, grads_against_torch)
from torch_bridge import from_torch
from torch_bridge.ops.registry import core_aten_overloads, lookup, registered_ops

aten = torch.ops.aten
_g = torch.Generator().manual_seed(0)
NONE, MEAN, SUM = 0, 1, 2
REDUCTIONS = (NONE, MEAN, SUM)


def F32(*s):  # noqa: N802 - float32 normal
    return torch.randn(s, generator=_g)


def P(*s):  # noqa: N802 - in (0.02, 0.98): probabilities for BCE
    return torch.rand(*s, generator=_g) * 0.96 + 0.02


def W(*s):  # noqa: N802 - positive weights
    return torch.rand(*s, generator=_g) + 0.25


def PROBS(*s, dim=1):  # noqa: N802 - class probabilities along dim
    return torch.softmax(F32(*s) * 2, dim=dim)


def LOGP(*s, dim=1):  # noqa: N802 - log-probabilities along dim
    return torch.log_softmax(F32(*s) * 2, dim=dim)


def LABELS(*s, c, ignore=None, every=3):  # noqa: N802 - int64 class indices, every `every`-th one ignored
    t = torch.randint(0, c, s, generator=_g)
    if ignore is not None:
        t.view(-1)[::every] = ignore
    return t


def SIGNS(*s):  # noqa: N802 - +-1 float
    return torch.randint(0, 2, s, generator=_g).float() * 2 - 1


EXACT, LOOSE, HALF = (1e-6, 1e-6), (1e-5, 1e-5), (2e-3, 2e-3)
BF16 = (1e-2, 1e-2)  # about one bfloat16 rounding step (2^-7) of the result
ROWS = []


def row(op, *args, tol=LOOSE, **kwargs):
    ROWS.append(pytest.param(op, args, kwargs, tol, id=f"{op}-{len(ROWS)}"))


# ---------------------------------------------------------------------------------------------------------------
# value rows
# ---------------------------------------------------------------------------------------------------------------
N, C = 6, 5
ce = aten.cross_entropy_loss.default
masked_logits = F32(N, C) * 3
masked_logits[0, 0] = -math.inf          # an ignored row whose gathered (class 0) log-probability is -inf
masked_logits[1, 3] = -math.inf          # a kept row with a masked class (not its target)
masked_target = LABELS(N, c=C, ignore=-100)
masked_target[0], masked_target[1] = -100, 2
for red in REDUCTIONS:
    row(ce, F32(N, C) * 3, LABELS(N, c=C), None, red)
    row(ce, F32(N, C) * 3, LABELS(N, c=C, ignore=-100), None, red)                        # ignore_index
    row(ce, F32(N, C) * 3, LABELS(N, c=C, ignore=-100), W(C), red)                        # weighted mean
    row(ce, F32(N, C) * 3, LABELS(N, c=C), None, red, -100, 0.1)                          # label smoothing
    row(ce, F32(N, C) * 3, LABELS(N, c=C, ignore=-100), W(C), red, -100, 0.1)             # all three
    row(ce, F32(N, C) * 3, LABELS(N, c=C, ignore=2, every=2), W(C), red, 2, 0.2)          # ignore a real class
    row(ce, F32(N, C, 3, 2) * 3, LABELS(N, 3, 2, c=C, ignore=-100), None, red)            # segmentation (N,C,H,W)
    row(ce, F32(N, C, 3, 2) * 3, LABELS(N, 3, 2, c=C, ignore=-100), W(C), red, -100, 0.1)
    row(ce, F32(2, C, 4) * 3, LABELS(2, 4, c=C, ignore=-100), W(C), red, -100, 0.1)       # (N, C, d1)
    row(ce, F32(2, C, 2, 2, 2), LABELS(2, 2, 2, 2, c=C), None, red)                       # (N, C, d1, d2, d3)
    row(ce, F32(C) * 3, LABELS(c=C), W(C), red, -100, 0.1)                                # unbatched (C,)
    row(ce, F32(N, C) * 3, PROBS(N, C), None, red)                                        # probability targets
    row(ce, F32(N, C) * 3, PROBS(N, C), W(C), red, -100, 0.2)
    row(ce, F32(N, C, 3, 2) * 3, PROBS(N, C, 3, 2), W(C), red, -100, 0.1)
    row(ce, F32(C) * 3, PROBS(C, dim=0), W(C), red, -100, 0.1)
    row(ce, masked_logits, masked_target, W(C), red)                                      # -inf logits
row(ce, F32(N, C), torch.full((N,), -100), None, MEAN)                                    # all ignored: NaN
row(ce, F32(N, C), torch.full((N,), -100), W(C), MEAN, -100, 0.1)
row(ce, F32(N, C), torch.full((N,), -100), None, SUM, -100, 0.1)                          # ... sum: 0
row(ce, F32(N, C), LABELS(N, c=C).to(torch.uint8), None, MEAN)                            # uint8 targets
row(ce, F32(N, C), PROBS(N, C).half(), None, NONE)                                        # f32 x f16 probs: f32
row(ce, F32(N, C).half(), LABELS(N, c=C, ignore=-100), None, MEAN, -100, 0.1, tol=HALF)   # half in, half out
row(ce, F32(N, C).bfloat16(), LABELS(N, c=C), None, SUM, tol=BF16)
row(ce, F32(0, C), LABELS(0, c=C), None, MEAN)                                            # empty batch: NaN

for op in (aten.nll_loss_nd.default, aten.nll_loss.default):
    for red in REDUCTIONS:
        row(op, LOGP(N, C), LABELS(N, c=C, ignore=-100), W(C), red)
        row(op, LOGP(N, C), LABELS(N, c=C), None, red)
    row(op, LOGP(C, dim=0), LABELS(c=C), W(C), NONE)
    row(op, LOGP(C, dim=0), torch.tensor(-100), W(C), MEAN)
for red in REDUCTIONS:
    row(aten.nll_loss_nd.default, LOGP(2, C, 4), LABELS(2, 4, c=C, ignore=-100), W(C), red)
    row(aten.nll_loss_nd.default, LOGP(2, C, 3, 2), LABELS(2, 3, 2, c=C, ignore=1), None, red, 1)
    row(aten.nll_loss2d.default, LOGP(2, C, 3, 2), LABELS(2, 3, 2, c=C, ignore=-100), W(C), red)
for op in (aten.nll_loss_forward.default,):
    for red in REDUCTIONS:
        row(op, LOGP(N, C), LABELS(N, c=C, ignore=-100), W(C), red, -100)                   # (output, total_weight)
        row(op, LOGP(C, dim=0), LABELS(c=C), W(C), red, -100)
        row(op, LOGP(C, dim=0), torch.tensor(-100), None, red, -100)
for red in REDUCTIONS:
    row(aten.nll_loss2d_forward.default, LOGP(2, C, 3, 2), LABELS(2, 3, 2, c=C, ignore=-100), W(C), red, -100)

# regression losses: same shapes, broadcasting (as the aten ops do), mixed dtypes, 0-dim
ties = F32(4, 5)
for op, extra in ((aten.mse_loss.default, ()), (aten.l1_loss.default, ()), (aten.smooth_l1_loss.default, (0.5,)),
                  (aten.smooth_l1_loss.default, (0.0,)), (aten.smooth_l1_loss.default, (2.5,)),
                  (aten.huber_loss.default, (0.7,)), (aten.huber_loss.default, (3.0,)),
                  (aten.soft_margin_loss.default, ())):
    for red in REDUCTIONS:
        row(op, F32(4, 5) * 2, F32(4, 5) * 2, red, *extra)
    row(op, F32(4, 5) * 2, F32(5) * 2, NONE, *extra)                                      # target broadcast
    row(op, F32(4, 5) * 2, F32(5) * 2, MEAN, *extra)
    row(op, ties, torch.where(torch.arange(5) % 2 == 0, ties, F32(4, 5)), SUM, *extra)    # x == t in places
    row(op, F32(4, 5).half(), F32(4, 5), MEAN, *extra, tol=HALF)                          # promotion or not
    row(op, F32(4, 5), F32(4, 5).half(), NONE, *extra, tol=HALF)
    row(op, F32(), F32(), NONE, *extra)
row(aten.mse_loss.default, F32(3, 1, 4), F32(5, 1), NONE)                                 # both sides broadcast
row(aten.mse_loss.default, F32(4, 5), F32().double(), MEAN)                               # 0-dim f64: stays f32
row(aten.soft_margin_loss.default, F32(4, 5) * 40, SIGNS(4, 5), NONE)                     # exp overflow: inf

# binary cross entropy
bce, bcel = aten.binary_cross_entropy.default, aten.binary_cross_entropy_with_logits.default
edge = torch.tensor([[0.0, 1.0, 0.5, 1e-30], [1.0, 0.0, 1 - 1e-7, 0.3]])                  # clamped logs: -100
for red in REDUCTIONS:
    row(bce, P(4, 5), P(4, 5), None, red)
    row(bce, P(4, 5), torch.randint(0, 2, (4, 5), generator=_g).float(), W(4, 5), red)
    row(bce, P(4, 5), P(4, 5), W(5), red)                                                 # weight broadcast
    row(bce, edge, torch.tensor([[0.0, 1.0, 0.3, 1.0], [0.0, 1.0, 0.0, 0.5]]), None, red)
    row(bcel, F32(4, 5) * 3, P(4, 5), None, None, red)
    row(bcel, F32(4, 5) * 3, P(4, 5), W(4, 5), None, red)
    row(bcel, F32(4, 5) * 3, P(4, 5), None, W(5) * 3, red)                                # pos_weight per class
    row(bcel, F32(4, 5) * 3, P(4, 5), W(5), W(5) * 3, red)
    row(bcel, F32(2, 5, 3) * 30, P(2, 5, 3), W(1, 5, 1), W(3), red)                        # large logits: stable
row(bce, P(4, 5), P(5), None, NONE)                                                       # target broadcast
row(bce, P(4, 5), P(4, 5), W(5).half(), MEAN)                                             # weight: input's dtype
row(bce, P(4, 5).half(), P(4, 5).half(), None, MEAN, tol=HALF)
row(bcel, F32(5) * 3, P(4, 5), None, None, NONE)                                          # input broadcast
row(bcel, F32(4, 5), P(4, 5).half(), None, None, MEAN, tol=HALF)                          # target's dtype: f16
row(bcel, F32(4, 5).half(), P(4, 5), None, None, NONE, tol=HALF)                          # ... f32
row(aten.log_sigmoid.default, F32(4, 5) * 30)
row(aten.log_sigmoid.default, F32(4, 5).half() * 5, tol=HALF)

# divergences and margin losses
for red in REDUCTIONS:
    kl_target = PROBS(4, 5)
    kl_target[0, :2] = 0.0                                                                # xlogy(0, 0) = 0
    row(aten.kl_div.default, LOGP(4, 5), kl_target, red)
    row(aten.kl_div.default, LOGP(4, 5), LOGP(4, 5), red, log_target=True)
    for log_input, full in ((True, False), (False, False), (True, True), (False, True)):
        x = F32(4, 5) if log_input else W(4, 5)
        row(aten.poisson_nll_loss.default, x, torch.poisson(W(4, 5) * 2, generator=_g), log_input, full, 1e-8, red)
    row(aten.margin_ranking_loss.default, F32(6), F32(6), SIGNS(6), 0.3, red)
    row(aten.hinge_embedding_loss.default, F32(4, 5) * 2, SIGNS(4, 5), 1.0, red)
    row(aten.cosine_embedding_loss.default, F32(6, 4), F32(6, 4), SIGNS(6), 0.2, red)
    row(aten.triplet_margin_loss.default, F32(6, 4), F32(6, 4), F32(6, 4), 1.0, 2.0, 1e-6, False, red)
    row(aten.triplet_margin_loss.default, F32(6, 4), F32(6, 4), F32(6, 4), 0.5, 1.0, 1e-6, True, red)
row(aten.kl_div.default, LOGP(4, 5), PROBS(5, dim=0), NONE)                               # broadcast
row(aten.kl_div.default, LOGP(4, 5).half(), PROBS(4, 5), MEAN, tol=HALF)
row(aten.poisson_nll_loss.default, F32(4, 5), torch.zeros(4, 5), False, True, 1e-8, NONE)  # Stirling: t <= 1
row(aten.margin_ranking_loss.default, F32(6), F32(6).half(), SIGNS(6), 0.0, NONE)
row(aten.hinge_embedding_loss.default, F32(4, 5).half(), SIGNS(4, 5), 0.5, NONE, tol=HALF)  # input's dtype
row(aten.cosine_embedding_loss.default, F32(4), F32(4), torch.tensor(-1.0), -0.5, NONE)   # unbatched
row(aten.cosine_embedding_loss.default, F32(6, 4), torch.zeros(6, 4), SIGNS(6), 0.0, MEAN)  # zero vector
row(aten.triplet_margin_loss.default, F32(4), F32(4), F32(4), 1.0, 3.0, 1e-6, True, NONE)
# broadcast_tensors takes a list of tensors: traced, as a graph's tensors are
row(aten.broadcast_tensors.default, [F32(4, 5), F32(5)], tol=EXACT)
row(aten.broadcast_tensors.default, [F32(3, 1, 5), F32(4, 1), LABELS(1, c=3)], tol=EXACT)
row(aten.broadcast_tensors.default, [F32(2, 3), F32().half()], tol=EXACT)  # shapes change, dtypes stay
row(aten.broadcast_tensors.default, [F32(2, 3)], tol=EXACT)


TABLE = JitTable(ROWS)
# the table compiles once per xdist worker that runs one of its rows: keep its rows on one worker
pytestmark = pytest.mark.xdist_group("test_ops_loss")


@pytest.mark.parametrize(("op", "args", "kwargs", "tol"), ROWS)
def test_parity(op, args, kwargs, tol):
    check_parity(op, args, kwargs, tol, TABLE)


# ---------------------------------------------------------------------------------------------------------------
# gradients: jax.grad of the lowering against torch autograd, at the per-op tolerance
# ---------------------------------------------------------------------------------------------------------------
GRAD_ROWS = []


def grad_row(name, op, *args, wrt=0, **kwargs):
    GRAD_ROWS.append(pytest.param(op, args, kwargs, wrt, id=f"{name}-{len(GRAD_ROWS)}"))


for red in REDUCTIONS:
    grad_row("ce", ce, F32(N, C) * 3, LABELS(N, c=C), None, red)
    grad_row("ce-ignore-weight-smooth", ce, F32(N, C) * 3, LABELS(N, c=C, ignore=-100), W(C), red, -100, 0.1)
    grad_row("ce-smooth", ce, F32(N, C) * 3, LABELS(N, c=C, ignore=-100), None, red, -100, 0.2)
    grad_row("ce-4d", ce, F32(2, C, 3, 2) * 3, LABELS(2, 3, 2, c=C, ignore=-100), W(C), red, -100, 0.1)
    grad_row("ce-unbatched", ce, F32(C), LABELS(c=C), W(C), red, -100, 0.1)
    grad_row("ce-probs", ce, F32(N, C) * 3, PROBS(N, C), W(C), red, -100, 0.1)
    grad_row("ce-neg-inf-ignored", ce, masked_logits, masked_target, W(C), red, -100, 0.1)
    grad_row("nll_nd", aten.nll_loss_nd.default, LOGP(N, C), LABELS(N, c=C, ignore=-100), W(C), red)
    grad_row("nll_nd-3d", aten.nll_loss_nd.default, LOGP(2, C, 4), LABELS(2, 4, c=C, ignore=-100), None, red)
    grad_row("mse", aten.mse_loss.default, F32(4, 5), F32(4, 5), red)
    grad_row("l1", aten.l1_loss.default, ties, torch.where(torch.arange(5) % 2 == 0, ties, F32(4, 5)), red)
    grad_row("smooth_l1", aten.smooth_l1_loss.default, F32(4, 5) * 2, F32(4, 5), red, 0.5)
    grad_row("smooth_l1-beta0", aten.smooth_l1_loss.default, F32(4, 5) * 2, F32(4, 5), red, 0.0)
    grad_row("huber", aten.huber_loss.default, F32(4, 5) * 2, F32(4, 5), red, 0.7)
    grad_row("bce", bce, P(4, 5), P(4, 5), W(5), red)
    grad_row("bce-edge", bce, edge, torch.tensor([[0.0, 1.0, 0.3, 1.0], [0.0, 1.0, 0.0, 0.5]]), None, red)
    grad_row("bce_logits", bcel, F32(4, 5) * 3, P(4, 5), W(4, 5), W(5) * 3, red)
    grad_row("bce_logits-large", bcel, F32(4, 5) * 40, P(4, 5), None, None, red)
    grad_row("kl_div", aten.kl_div.default, LOGP(4, 5), kl_target, red)
    grad_row("kl_div-log", aten.kl_div.default, LOGP(4, 5), LOGP(4, 5), red, log_target=True)
    grad_row("soft_margin", aten.soft_margin_loss.default, F32(4, 5) * 2, SIGNS(4, 5), red)
    grad_row("poisson", aten.poisson_nll_loss.default, W(4, 5), torch.zeros(4, 5) + 3, False, True, 1e-8, red)
    grad_row("margin_ranking", aten.margin_ranking_loss.default, F32(6), F32(6), SIGNS(6), 0.3, red)
    grad_row("hinge", aten.hinge_embedding_loss.default, F32(4, 5) * 2, SIGNS(4, 5), 1.0, red)
    grad_row("cosine", aten.cosine_embedding_loss.default, F32(6, 4), F32(6, 4), SIGNS(6), 0.2, red)
    grad_row("triplet", aten.triplet_margin_loss.default, F32(6, 4), F32(6, 4), F32(6, 4), 1.0, 2.0, 1e-6, True,
             red)
grad_row("log_sigmoid", aten.log_sigmoid.default, F32(4, 5) * 30)
tie = torch.tensor([1.0, 2.0, 0.5, -1.0, 3.0, -2.5])  # clamp_min(v, 0) at v == 0 exactly: torch passes the gradient
grad_row("margin_ranking-tie", aten.margin_ranking_loss.default, tie, tie - 0.5, torch.ones(6), 0.5, NONE)
grad_row("hinge-tie", aten.hinge_embedding_loss.default, torch.ones(2, 3), -torch.ones(2, 3), 1.0, SUM)
grad_row("ce-all-ignored", ce, F32(N, C), torch.full((N,), -100), W(C), MEAN, -100, 0.1)  # NaN loss, zero grad
grad_row("nll-all-ignored", aten.nll_loss_nd.default, LOGP(N, C), torch.full((N,), -100), None, MEAN)
# targets that carry gradients (distillation: soft targets from a network)
grad_row("ce-probs-target", ce, F32(N, C) * 3, PROBS(N, C), None, MEAN, -100, 0.1, wrt=1)
grad_row("mse-target", aten.mse_loss.default, F32(4, 5), F32(4, 5), SUM, wrt=1)
grad_row("kl_div-target", aten.kl_div.default, LOGP(4, 5), PROBS(4, 5), SUM, wrt=1)
grad_row("kl_div-log-target", aten.kl_div.default, LOGP(4, 5), LOGP(4, 5), MEAN, log_target=True, wrt=1)
grad_row("bce-target", bce, P(4, 5), P(4, 5), None, MEAN, wrt=1)
grad_row("bce_logits-target", bcel, F32(4, 5), P(4, 5), None, W(5), SUM, wrt=1)


@pytest.mark.parametrize(("op", "args", "kwargs", "wrt"), GRAD_ROWS)
def test_grad_parity(op, args, kwargs, wrt):
    ((got,), (want,)) = grads_against_torch(op, args, kwargs, [wrt])
    assert bool(jnp.isfinite(got).all()) == bool(torch.isfinite(want).all()), "NaN/inf where torch has none"
    assert_close_on_scale(got, want, LAYER_TOL, f"d/d(arg {wrt})")


# ---------------------------------------------------------------------------------------------------------------
# whole modules: from_torch of a forward that returns its loss
# ---------------------------------------------------------------------------------------------------------------
class Classifier(nn.Module):
    """A forward that returns its loss, as Composer's ``ComposerModel.loss`` or an HF model given ``labels``."""

    def __init__(self, loss, conv=False):
        super().__init__()
        torch.manual_seed(0)
        if conv:  # per-pixel logits (N, 5, H, W), as segmentation models give
            self.net = nn.Sequential(nn.Conv2d(3, 8, 3, padding=1), nn.ReLU(), nn.Conv2d(8, 5, 1))
        else:
            self.net = nn.Sequential(nn.Linear(8, 16), nn.GELU(), nn.Linear(16, 5))
        self.loss = loss

    def forward(self, x, y):
        return self.loss(self.net(x), y)


def _ce(logits, y):
    return F.cross_entropy(logits, y, ignore_index=-100, label_smoothing=0.1)


def _lm(logits, y):  # Hugging Face: flatten (B, T, V) logits and (B, T) labels, -100 on padding
    return F.cross_entropy(logits.view(-1, logits.shape[-1]), y.view(-1))


def _regression(out, y):  # every elementwise loss of the functional API in one graph, each with its options
    p = torch.sigmoid(out)
    return (F.mse_loss(out, y) + F.l1_loss(out, y, reduction="sum") + F.smooth_l1_loss(out, y, beta=0.5)
            + F.huber_loss(out, y, delta=0.7) + F.soft_margin_loss(out, y.sign())
            + F.binary_cross_entropy(p, torch.sigmoid(y), weight=torch.linspace(0.5, 1.5, 5))
            + F.binary_cross_entropy_with_logits(out, torch.sigmoid(y), pos_weight=torch.linspace(1, 3, 5))
            + F.kl_div(F.log_softmax(out, -1), F.softmax(y, -1), reduction="batchmean")
            + F.kl_div(F.log_softmax(out, -1), F.log_softmax(y, -1), reduction="sum", log_target=True)
            + F.nll_loss(F.log_softmax(out, -1), (y[:, 0].abs() * 3).long().clamp(max=4), reduction="none").mean())


def _segmentation(logits, y):  # (N, C, H, W) logits, (N, H, W) labels with 255 for "void", class weights
    return F.cross_entropy(logits, y, weight=torch.linspace(0.5, 2.0, 5), ignore_index=255, label_smoothing=0.05)


def _metric(out, y):  # the margin / embedding / count losses
    labels = (y[:, 0].abs() * 3).long().clamp(max=4)
    return (F.poisson_nll_loss(out, y.abs()) + F.poisson_nll_loss(out.abs() + 0.1, y.abs() * 3, log_input=False,
                                                                   full=True)
            + F.margin_ranking_loss(out[:, 0], out[:, 1], y[:, 0].sign(), margin=0.2)
            + F.hinge_embedding_loss(out, y.sign(), margin=0.5) + F.cosine_embedding_loss(out, y, y[:, 1].sign())
            + F.triplet_margin_loss(out, y, out.flip(0), swap=True)
            + F.multilabel_soft_margin_loss(out, (y > 0).float())
            + F.multi_margin_loss(out, labels))


_x = torch.randn(12, 8, generator=_g)
_y = LABELS(12, c=5, ignore=-100, every=4)
_pixels = LABELS(4, 6, 6, c=5, ignore=255, every=7)
MODULES = {  # name: (loss, example inputs, per-pixel net)
    "cross_entropy": (_ce, (_x, _y), False),
    "soft_targets": (lambda o, y: F.cross_entropy(o, y, label_smoothing=0.2), (_x, PROBS(12, 5)), False),
    "hf_lm": (_lm, (torch.randn(3, 4, 8, generator=_g), LABELS(3, 4, c=5, ignore=-100, every=3)), False),
    "segmentation": (_segmentation, (torch.randn(4, 3, 6, 6, generator=_g), _pixels), True),
    "regression": (_regression, (_x, F32(12, 5)), False),
    "metric": (_metric, (_x, F32(12, 5)), False),
}


def _torch_loss_and_grads(module, args):
    module.zero_grad()
    out = module(*args)
    out.backward()
    return out.detach(), {k: p.grad.clone() for k, p in module.named_parameters()}


@pytest.mark.parametrize("name", list(MODULES))
def test_module_returning_its_loss(name):
    loss, (x, y), conv = MODULES[name]
    module = Classifier(loss, conv)
    bm = from_torch(module, (x, y), dynamic_batch=True)
    for train in (True, False):
        for n in (len(x), len(x) // 2):  # the exported batch and another one (dynamic batch)
            module.train(train)
            want, want_grads = _torch_loss_and_grads(module, (x[:n], y[:n]))

            def f(params, xb, yb):
                return bm.apply(params, bm.buffers, jax.random.key(0), xb, yb, train=train)[0]

            got, grads = jax.jit(jax.value_and_grad(f))(bm.params, x[:n].numpy(), y[:n].numpy())
            where = f"{name} train={train} batch={n}"
            assert got.shape == () and got.dtype == jnp.float32, where
            assert_close_on_scale(got, want, MODEL_TOL, f"{where} loss")
            assert set(grads) == set(want_grads)
            for k, g in grads.items():
                assert_close_on_scale(g, want_grads[k], MODEL_TOL, f"{where} d/d{k}")


# ---------------------------------------------------------------------------------------------------------------
# coverage and call convention
# ---------------------------------------------------------------------------------------------------------------
LOSS_OPS = """
binary_cross_entropy.default binary_cross_entropy_with_logits.default broadcast_tensors.default
cosine_embedding_loss.default cross_entropy_loss.default hinge_embedding_loss.default huber_loss.default
kl_div.default l1_loss.default log_sigmoid.default margin_ranking_loss.default mse_loss.default nll_loss.default
nll_loss2d.default nll_loss2d_forward.default nll_loss_forward.default nll_loss_nd.default poisson_nll_loss.default
smooth_l1_loss.default soft_margin_loss.default triplet_margin_loss.default
""".split()


def _mine():
    return {op for op in registered_ops() if lookup(op).fn.__module__ == loss_ops.__name__}


def test_lowered_ops_and_core_aten():
    """The table holds exactly these loss overloads. None is in the core ATen opset: they are the composite ops
    ``run_decompositions({})`` keeps, so the core-coverage tests of the other op files are unaffected."""
    assert sorted(str(op).removeprefix("aten.") for op in _mine()) == sorted(LOSS_OPS)
    core = {str(op).removeprefix("aten.") for op in core_aten_overloads()}
    assert not set(LOSS_OPS) & core, sorted(set(LOSS_OPS) & core)


def test_every_registered_overload_has_a_parity_row():
    tested = {p.values[0] for p in ROWS}
    assert _mine() <= tested, sorted(map(str, _mine() - tested))
    graded = {p.values[0] for p in GRAD_ROWS} | {aten.broadcast_tensors.default, aten.nll_loss.default,
                                                 aten.nll_loss2d.default, aten.nll_loss_forward.default,
                                                 aten.nll_loss2d_forward.default}  # same functions as graded ones
    assert _mine() <= graded, sorted(map(str, _mine() - graded))


def test_signatures_match_schemas():
    for op in _mine():
        assert_signature_matches_schema(op)


def test_unknown_reduction_raises():
    x = jnp.ones((2, 3))
    with pytest.raises(ValueError, match="reduction"):
        lookup(aten.mse_loss.default).fn(x, x, 3)
    with pytest.raises(ValueError, match="reduction"):
        lookup(ce).fn(x, jnp.zeros((2,), jnp.int32), None, 3)
