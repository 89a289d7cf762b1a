"""FFT ATen ops: torch.fft's public functions (what ``run_decompositions({})`` keeps: ``fft_rfft``, ``fft_fft2``,
...), the core ``_fft_r2c`` / ``_fft_c2r`` / ``_fft_c2c`` they decompose to elsewhere, and the complex views around
them (``view_as_real``, ``view_as_complex``, ``real``, ``imag``).

``torch.fft.*`` and ``jnp.fft.*`` share their arguments (``n``/``s``, the axes, ``norm`` in ``{None, 'backward',
'ortho', 'forward'}``), so the public ops map one to one. The core ops carry the scaling as an enum instead:
``normalization`` 0 leaves the transform unscaled, 1 divides by ``sqrt(n)``, 2 by ``n``, where ``n`` is the number
of points of the signal over ``dim`` (for ``_fft_c2r``, the real output's). Complex tensors are ``complex64``
(``complex128`` narrows, as float64 does, since JAX runs with x64 off).
"""
from __future__ import annotations

import math

import jax.numpy as jnp
from jax import lax

import torch

from .registry import lower

A = torch.ops.aten


def _one_d(fn):
    def lowering(self, n=None, dim=-1, norm=None):
        return fn(self, n=n, axis=dim, norm=norm)
    return lowering


def _n_d(fn, default_dim):
    def lowering(self, s=None, dim=default_dim, norm=None):
        axes = None if dim is None else tuple(dim)
        if s is not None and axes is None:  # torch: s alone transforms the last len(s) dims
            axes = tuple(range(-len(s), 0))
        return fn(self, s=None if s is None else tuple(s), axes=axes, norm=norm)
    return lowering


for _name, _fn in (("fft", jnp.fft.fft), ("ifft", jnp.fft.ifft), ("rfft", jnp.fft.rfft), ("irfft", jnp.fft.irfft)):
    lower(getattr(A, f"fft_{_name}").default)(_one_d(_fn))
for _name, _fn in (("fft", jnp.fft.fftn), ("ifft", jnp.fft.ifftn), ("rfft", jnp.fft.rfftn),
                   ("irfft", jnp.fft.irfftn)):
    lower(getattr(A, f"fft_{_name}2").default)(_n_d(_fn, (-2, -1)))
    lower(getattr(A, f"fft_{_name}n").default)(_n_d(_fn, None))


def _scaled(x, n: int, normalization: int):
    if normalization == 0:
        return x
    if normalization not in (1, 2):
        raise NotImplementedError(f"torch_bridge: FFT normalization mode {normalization} is not lowered")
    return x * (1 / math.sqrt(n) if normalization == 1 else 1 / n)


def _points(shape, dim) -> int:
    return math.prod(shape[d] for d in dim)


@lower(A._fft_r2c.default)
def _fft_r2c(self, dim, normalization, onesided):
    dim = tuple(dim)
    out = (jnp.fft.rfftn if onesided else jnp.fft.fftn)(self, axes=dim, norm="backward")  # "backward": unscaled
    return _scaled(out, _points(self.shape, dim), normalization)


@lower(A._fft_c2r.default)
def _fft_c2r(self, dim, normalization, last_dim_size):
    dim = tuple(dim)
    sizes = tuple(self.shape[d] for d in dim[:-1]) + (int(last_dim_size),)
    out = jnp.fft.irfftn(self, s=sizes, axes=dim, norm="forward")  # "forward": the inverse unscaled
    return _scaled(out, math.prod(sizes), normalization)


@lower(A._fft_c2c.default)
def _fft_c2c(self, dim, normalization, forward):
    dim = tuple(dim)
    out = jnp.fft.fftn(self, axes=dim, norm="backward") if forward else jnp.fft.ifftn(self, axes=dim, norm="forward")
    return _scaled(out, _points(self.shape, dim), normalization)


@lower(A.view_as_real.default)
def view_as_real(self):
    return jnp.stack([jnp.real(self), jnp.imag(self)], axis=-1)


@lower(A.view_as_complex.default)
def view_as_complex(self):
    return lax.complex(self[..., 0], self[..., 1])


@lower(A.real.default)
def real(self):
    return jnp.real(self)


@lower(A.imag.default)
def imag(self):
    return jnp.imag(self)
