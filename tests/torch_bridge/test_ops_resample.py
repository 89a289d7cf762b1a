"""Parity of the resampling lowerings (torch_bridge/ops/nn_resample.py) with the ATen ops themselves: values eagerly
and under ``jax.jit``, gradients w.r.t. the input (and the grid) against torch autograd, the overloads that
``nn.Upsample`` / ``F.interpolate`` / ``F.grid_sample`` / ``F.unfold`` / ``F.fold`` export to, and a small FPN-like
module bridged with ``from_torch``."""
import jax
import jax.numpy as jnp
import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

import torch_bridge.ops.nn_resample as resample_ops
from tests.torch_bridge.parity import (LAYER_TOL, MODEL_TOL, JitTable, assert_close_on_scale,
                                      assert_signature_matches_schema, check_parity, grads_against_torch)
from torch_bridge import from_torch
from torch_bridge.ops.registry import lookup, registered_ops

aten = torch.ops.aten
_g = torch.Generator().manual_seed(0)
TOL = (LAYER_TOL, LAYER_TOL)


def F32(*s):  # noqa: N802 - float32 normal
    return torch.randn(s, generator=_g)


def GRID(*s, reach=1.2):  # noqa: N802 - normalized coordinates, some outside [-1, 1] to exercise padding
    return torch.rand(s, generator=_g) * (2 * reach) - reach


NEAREST = [(aten.upsample_nearest1d, aten.upsample_nearest2d, aten.upsample_nearest3d),
           (aten._upsample_nearest_exact1d, aten._upsample_nearest_exact2d, aten._upsample_nearest_exact3d)]
LINEAR = (aten.upsample_linear1d, aten.upsample_bilinear2d, aten.upsample_trilinear3d)
AA = (aten._upsample_bilinear2d_aa, aten._upsample_bicubic2d_aa)
ROWS, GRAD_ROWS = [], []


def row(op, *args, grad=False, wrt=(0,)):
    ROWS.append(pytest.param(op, args, {}, id=f"{op}-{len(ROWS)}"))
    if grad:
        GRAD_ROWS.append(pytest.param(op, args, list(wrt), id=f"{op}-{len(GRAD_ROWS)}"))


x1, x2, x3 = F32(2, 3, 7), F32(2, 3, 7, 6), F32(1, 2, 4, 5, 3)
# nearest: scale factors that differ from out/in (2.1 on 7 gives 14 = 2 * 7, 1.1 gives 7) use 1/scale as torch does
for op1, op2, op3 in NEAREST:
    for sf in ([1.7], [2.1], [1.1], [0.6], [3.0], [0.5], [1 / 3]):
        row(op1.vec, x1, None, sf, grad=sf == [1.7])
    row(op1.vec, x1, [11], None)
    row(op1.vec, x1, [3], None)
    row(op1.default, x1, [11], 1.3, grad=True)
    row(op2.vec, x2, None, [1.7, 2.3], grad=True)
    row(op2.vec, x2, None, [2.0, 2.0])
    row(op2.vec, x2, [5, 13], None)
    row(op2.default, x2, [5, 13], 0.7, None, grad=True)
    row(op3.vec, x3, None, [1.5, 2.0, 0.7], grad=True)
    row(op3.default, x3, [3, 4, 5], None, None, 1.5, grad=True)
row(aten.upsample_nearest2d.vec, torch.randint(0, 255, (2, 3, 4, 5), generator=_g, dtype=torch.uint8), None, [2.0, 1.5])  # uint8 too
for ac in (False, True):
    for sf in ([1.7], [2.0], [1.1], [0.6], [0.3]):
        row(aten.upsample_linear1d.vec, x1, None, ac, sf, grad=sf == [0.6] and not ac)
    row(aten.upsample_linear1d.vec, x1, [13], ac, None)
    row(aten.upsample_linear1d.vec, x1, [1], ac, None)
    row(aten.upsample_linear1d.default, x1, [13], ac, 1.5, grad=ac)
    row(aten.upsample_bilinear2d.vec, x2, None, ac, [2.0, 2.0], grad=not ac)
    row(aten.upsample_bilinear2d.vec, x2, [4, 11], ac, None, grad=ac)
    row(aten.upsample_bilinear2d.default, x2, [4, 11], ac, 0.8, 1.9, grad=not ac)
    row(aten.upsample_trilinear3d.vec, x3, None, ac, [2.0, 1.5, 0.7], grad=not ac)
    row(aten.upsample_trilinear3d.default, x3, [5, 5, 2], ac, None, None, None, grad=ac)
    row(aten.upsample_bicubic2d.vec, x2, None, ac, [2.0, 2.0], grad=not ac)
    row(aten.upsample_bicubic2d.vec, x2, [4, 11], ac, None)
    row(aten.upsample_bicubic2d.vec, x2, None, ac, [0.5, 1.3], grad=ac)
    row(aten.upsample_bicubic2d.default, x2, [5, 9], ac, 0.8, None, grad=not ac)
    xb = F32(2, 3, 17, 15)
    for op in AA:
        row(op.vec, xb, [5, 4], ac, None, grad=not ac)
        row(op.vec, xb, None, ac, [0.3, 0.45])
        row(op.vec, xb, [30, 20], ac, None, grad=ac)  # upsampling: plain filter, weights renormalized at borders
        row(op.vec, xb, [1, 1], ac, None)
        row(op.default, xb, [6, 7], ac, 0.4, None, grad=not ac)

gx, grid = F32(2, 3, 5, 7), GRID(2, 4, 6, 2)
gx3, grid3 = F32(2, 3, 4, 5, 6), GRID(2, 3, 2, 4, 3)
for mode in (0, 1, 2):  # bilinear, nearest, bicubic
    for padding in (0, 1, 2):  # zeros, border, reflection
        for ac in (False, True):
            graded = ac == bool((mode + padding) % 2)  # every (mode, padding) once, align_corners alternating
            row(aten.grid_sampler_2d.default, gx, grid, mode, padding, ac, grad=graded, wrt=(0, 1))
            if mode < 2:
                row(aten.grid_sampler_3d.default, gx3, grid3, mode, padding, ac, grad=graded, wrt=(0, 1))
row(aten.grid_sampler.default, gx, grid, 0, 0, False, grad=True, wrt=(0, 1))
row(aten.grid_sampler.default, gx3, grid3, 0, 2, True)
row(aten.grid_sampler_2d.default, F32(1, 2, 1, 1), GRID(1, 3, 2, 2), 0, 2, False)  # a 1x1 image reflects to 0
row(aten.affine_grid_generator.default, F32(2, 2, 3), [2, 3, 5, 6], False, grad=True)
row(aten.affine_grid_generator.default, F32(2, 2, 3), [2, 3, 5, 6], True)
row(aten.affine_grid_generator.default, F32(2, 3, 4), [2, 3, 4, 5, 6], False)
row(aten.affine_grid_generator.default, F32(1, 2, 3), [1, 1, 1, 4], True)  # one row sits at y = 0
row(aten.im2col.default, F32(2, 3, 7, 8), [3, 2], [1, 2], [1, 0], [2, 1], grad=True)
row(aten.im2col.default, F32(3, 7, 8), [3, 3], [1, 1], [1, 1], [1, 1], grad=True)  # unbatched
row(aten.im2col.default, F32(2, 2, 6, 6), [2, 2], [1, 1], [0, 0], [2, 2])
row(aten.col2im.default, F32(2, 12, 20), [5, 6], [2, 2], [1, 1], [0, 0], [1, 1], grad=True)
row(aten.col2im.default, F32(2, 18, 24), [7, 8], [3, 2], [1, 2], [1, 0], [2, 1], grad=True)
row(aten.col2im.default, F32(18, 24), [7, 8], [3, 2], [1, 2], [1, 0], [2, 1])  # unbatched
row(aten.col2im.default, F32(1, 8, 6), [5, 7], [2, 2], [1, 1], [0, 0], [2, 2])  # a strip the blocks never reach

TABLE = JitTable(ROWS)
pytestmark = pytest.mark.xdist_group("test_ops_resample")


@pytest.mark.parametrize(("op", "args", "kwargs"), ROWS)
def test_parity(op, args, kwargs):
    check_parity(op, args, kwargs, TOL, TABLE)


@pytest.mark.parametrize(("op", "args", "wrt"), GRAD_ROWS)
def test_grad_parity(op, args, wrt):
    got, want = grads_against_torch(op, args, {}, wrt)
    for i, g, w in zip(wrt, got, want):
        assert_close_on_scale(g, w, LAYER_TOL, f"d/d(arg {i})")


# ---------------------------------------------------------------------------------------------------------------
# what torch.export emits, and a whole module through from_torch
# ---------------------------------------------------------------------------------------------------------------
class TinyFPN(nn.Module):
    """A U-Net/FPN-style decoder step: a strided encoder, a bilinear 2x upsample merged with the skip, a nearest
    resize to a fixed size, a learned flow field that warps features with grid_sample, and an unfold/fold pair."""

    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.enc1 = nn.Conv2d(3, 8, 3, padding=1)
        self.enc2 = nn.Conv2d(8, 16, 3, stride=2, padding=1)
        self.lateral = nn.Conv2d(16, 8, 1)
        self.up = nn.Upsample(scale_factor=2, mode="bilinear")
        self.flow = nn.Conv2d(8, 2, 3, padding=1)
        self.side = nn.Conv2d(16, 4, 1)
        self.head = nn.Conv2d(8 + 4, 5, 3, padding=1)

    def forward(self, x):
        e1 = F.relu(self.enc1(x))
        e2 = F.relu(self.enc2(e1))
        u = self.up(self.lateral(e2)) + e1
        side = F.interpolate(self.side(e2), size=u.shape[-2:], mode="nearest")
        grid = torch.tanh(self.flow(u)).permute(0, 2, 3, 1)
        warped = F.grid_sample(u, grid, mode="bilinear", padding_mode="border", align_corners=False)
        patches = F.unfold(warped, 3, padding=1)
        smoothed = F.fold(patches, warped.shape[-2:], 3, padding=1) / 9
        return self.head(torch.cat([smoothed, side], 1))


def test_module_forward_and_gradients():
    module = TinyFPN()
    x = F32(2, 3, 8, 10)
    bm = from_torch(module, (x,), dynamic_batch=False)
    # what the resampling calls export to (.vec for interpolate, grid_sampler rather than _2d) is what is lowered
    ops = {n.target for n in bm._programs[True].graph.nodes if n.op == "call_function"}
    assert {aten.upsample_bilinear2d.vec, aten.upsample_nearest2d.vec, aten.grid_sampler.default,
            aten.im2col.default, aten.col2im.default} <= ops, sorted(map(str, ops))
    out = module(x)
    w = torch.rand(out.shape, generator=torch.Generator().manual_seed(1)) + 0.5
    (out * w).sum().backward()
    want_grads = {k: p.grad for k, p in module.named_parameters()}

    def loss(params):
        y = bm.apply(params, bm.buffers, None, x.numpy(), train=True)[0]
        return jnp.sum(y * jnp.asarray(w.numpy())), y

    (_, got), grads = jax.jit(jax.value_and_grad(loss, has_aux=True))(bm.params)
    assert_close_on_scale(got, out, MODEL_TOL, "forward")
    assert set(grads) == set(want_grads)
    for k, g in grads.items():
        assert_close_on_scale(g, want_grads[k], MODEL_TOL, f"d/d{k}")


# ---------------------------------------------------------------------------------------------------------------
# coverage, call convention, refusals
# ---------------------------------------------------------------------------------------------------------------
def _mine():
    return {op for op in registered_ops() if lookup(op).fn.__module__ == resample_ops.__name__}


def test_every_registered_overload_has_parity_and_gradient_rows():
    tested = {p.values[0] for p in ROWS}
    assert _mine() <= tested, sorted(map(str, _mine() - tested))
    graded = {p.values[0] for p in GRAD_ROWS}
    assert _mine() <= graded, sorted(map(str, _mine() - graded))


def test_signatures_match_schemas():
    for op in _mine():
        assert_signature_matches_schema(op)


def test_unsupported_arguments_raise():
    x, g = jnp.ones((1, 1, 3, 3, 3)), jnp.zeros((1, 2, 2, 2, 3))
    with pytest.raises(NotImplementedError, match="bicubic"):
        lookup(aten.grid_sampler_3d.default).fn(x, g, 2, 0, False)
    with pytest.raises(NotImplementedError, match="padding_mode=3"):
        lookup(aten.grid_sampler_2d.default).fn(x[0], g[0, ..., :2], 0, 3, False)
    with pytest.raises(NotImplementedError, match="int32"):
        lookup(aten.upsample_bilinear2d.vec).fn(jnp.ones((1, 1, 2, 2), jnp.int32), None, False, [2.0, 2.0])
