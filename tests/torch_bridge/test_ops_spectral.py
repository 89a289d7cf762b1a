"""Parity of torch_bridge/ops/spectral.py with torch: torch.fft's public ops and the core ``_fft_*`` ops (values,
eagerly and under one jit; complex results compared as (real, imag) pairs), and a spectral module converted with
``from_torch`` (forward and gradients through the complex intermediates)."""
import jax
import jax.numpy as jnp
import numpy as np
import pytest
import torch
from torch import nn

import torch_bridge  # noqa: F401  registers the ops
from torch_bridge import from_torch
from torch_bridge.ops.registry import lookup
from tests.torch_bridge.parity import LAYER_TOL, MODEL_TOL, assert_close_on_scale, to_jax

A = torch.ops.aten
_g = torch.Generator().manual_seed(0)
X = torch.randn(2, 6, 8, generator=_g)
Z = torch.complex(torch.randn(2, 6, 5, generator=_g), torch.randn(2, 6, 5, generator=_g))

ROWS = [
    (A.fft_fft.default, (X,), {}), (A.fft_fft.default, (Z, 7, 1, "ortho"), {}),
    (A.fft_ifft.default, (Z,), {"norm": "forward"}), (A.fft_rfft.default, (X,), {}),
    (A.fft_rfft.default, (X, 5, -1, "ortho"), {}), (A.fft_irfft.default, (Z,), {}),
    (A.fft_irfft.default, (Z, 8, -1, "ortho"), {}), (A.fft_fft2.default, (X,), {}),
    (A.fft_ifft2.default, (Z,), {"norm": "ortho"}), (A.fft_rfft2.default, (X,), {}),
    (A.fft_irfft2.default, (Z, [6, 8]), {}), (A.fft_fftn.default, (X,), {}),
    (A.fft_fftn.default, (X, [4, 4]), {}), (A.fft_ifftn.default, (Z, None, [0, 2]), {}),
    (A.fft_rfftn.default, (X,), {"dim": [1, 2], "norm": "forward"}), (A.fft_irfftn.default, (Z,), {}),
    (A._fft_r2c.default, (X, [2], 0, True), {}), (A._fft_r2c.default, (X, [1, 2], 1, False), {}),
    (A._fft_c2r.default, (Z, [1, 2], 2, 8), {}), (A._fft_c2r.default, (Z, [2], 1, 9), {}),
    (A._fft_c2c.default, (Z, [1], 0, True), {}), (A._fft_c2c.default, (Z, [1, 2], 2, False), {}),
    (A.view_as_real.default, (Z,), {}), (A.view_as_complex.default, (torch.randn(3, 4, 2, generator=_g),), {}),
    (A.real.default, (Z,), {}), (A.imag.default, (Z,), {}),
]


def _pairs(x):
    """Complex arrays as a trailing (real, imag) axis, so one scale-relative check covers both parts."""
    x = x.detach().numpy() if isinstance(x, torch.Tensor) else np.asarray(x)
    return np.stack([x.real, x.imag], -1) if np.iscomplexobj(x) else x


@pytest.fixture(scope="module")
def jitted():
    calls = [(lookup(op).fn, args, kwargs) for op, args, kwargs in ROWS]
    arrays = [[a for a in to_jax(args) if isinstance(a, jax.Array)] for _, args, _ in ROWS]

    def every_row(arrays):
        out = []
        for (fn, args, kwargs), xs in zip(calls, arrays):
            it = iter(xs)
            out.append(fn(*[next(it) if isinstance(a, torch.Tensor) else a for a in args], **kwargs))
        return out

    return jax.jit(every_row)(arrays)


@pytest.mark.parametrize("i", range(len(ROWS)), ids=[f"{op}-{i}" for i, (op, _, _) in enumerate(ROWS)])
def test_parity(i, jitted):
    op, args, kwargs = ROWS[i]
    want = op(*args, **kwargs)
    eager = lookup(op).fn(*to_jax(args), **kwargs)
    assert np.asarray(eager).dtype == np.dtype({torch.complex64: np.complex64}.get(want.dtype, np.float32))
    for got, where in ((eager, "eager"), (jitted[i], "jit")):
        assert_close_on_scale(_pairs(got), _pairs(want), LAYER_TOL, where)


class SpectralMixer(nn.Module):
    """FNet-style token mixing (the real part of a 2-D FFT) and a learned filter in the rfft domain."""

    def __init__(self, length: int = 8, width: int = 6):
        super().__init__()
        self.proj = nn.Linear(width, width)
        self.filter = nn.Parameter(torch.randn(width, length // 2 + 1, 2) * 0.5)

    def forward(self, x):  # (B, L, W)
        mixed = torch.fft.fft2(self.proj(x)).real
        spectrum = torch.fft.rfft(mixed.transpose(1, 2), norm="ortho") * torch.view_as_complex(self.filter)
        return torch.fft.irfft(spectrum, n=x.shape[1], norm="ortho").transpose(1, 2).abs().mean((1, 2))


def test_spectral_module_forward_and_gradients():
    torch.manual_seed(0)
    module = SpectralMixer()
    x = torch.randn(3, 8, 6, generator=torch.Generator().manual_seed(1))
    bridged = from_torch(module, (x,), dynamic_batch=True)
    out, _ = bridged.apply(bridged.params, bridged.buffers, None, jnp.asarray(x.numpy()), train=False)
    assert_close_on_scale(out, module(x), MODEL_TOL, "forward")
    grads = jax.jit(jax.grad(lambda p: bridged.apply(p, bridged.buffers, None, jnp.asarray(x.numpy()),
                                                     train=False)[0].sum()))(bridged.params)
    module(x).sum().backward()
    for name, p in module.named_parameters():
        assert_close_on_scale(grads[name], p.grad, MODEL_TOL, name)
