"""oneDNN convolutions for XLA:CPU: a drop-in ``lax.conv_general_dilated`` whose CPU lowering calls ATen.

Why: on x86 CPUs XLA's convolution kernels take about twice oneDNN's time on small CNNs, and each weight gradient
adds a transpose of its activation batch-minor. ``conv_general_dilated`` here lowers a 2-D float32 or bfloat16 convolution on
the CPU platform to three XLA FFI custom calls (forward, input gradient, kernel gradient; ``onednn_conv.cc``)
that run ``at::convolution`` / ``at::convolution_backward`` on XLA's buffers in place: oneDNN, as in torch. The
step stays one jitted function; on other platforms (GPU, TPU) the same call lowers to ``lax.conv_general_dilated``.

Use: ``nnx.Conv(..., conv_general_dilated=torch_bridge.kernels.conv_general_dilated)``, or a jaxcomposer model's
``conv_impl='onednn'`` (which looks this function up through the torch adapter, so jaxcomposer itself never
imports torch).

What runs on oneDNN: 2-D convolutions, float32 or bfloat16 (both operands alike), activations NHWC with HWIO kernels (Flax) or NCHW with OIHW
(torch); the calls take NHWC activations and OHWI kernels, oneDNN's fast layouts, and XLA fuses the transposes to
them into the neighbouring ops, any stride, dilation and feature groups, explicit or 'SAME'/'VALID' padding (asymmetric
padding is padded explicitly first). Everything else (other ranks or dtypes, transposed convolutions via
``lhs_dilation``, ``batch_group_count``, ``out_sharding``, other layouts, empty arrays, and strided 1x1
convolutions with fewer than 16 input channels per group, whose kernel gradient ATen gets wrong) falls through to
``lax.conv_general_dilated`` unchanged.

Differences from ``lax.conv_general_dilated``, on the oneDNN path:

- float32 sums in oneDNN's order: results agree to float32 rounding (~1e-6 relative), not bit for bit;
  ``precision`` is ignored (oneDNN's float32 convolution is full float32).
- bfloat16 (``precision='amp_bf16'``): oneDNN accumulates in float32 and rounds each result once, so a value or gradient
  is the float32 convolution of the same bf16 operands rounded to bf16 (within one bf16 unit). Where the CPU lacks
  AVX-512 (or oneDNN is capped below it), ATen's bf16 kernels are not exact, so there the calls run in float32 and round
  once (:func:`bf16_is_exact` decides by a measurement, once per process). XLA:CPU's own bf16 convolutions are much
  slower (benchmarks/README.md, "Measurements behind code choices").
- first-order only: ``jax.grad`` works, a second derivative (``jax.hessian``) raises, because the gradient is
  itself a custom call. Use ``lax.conv_general_dilated`` for higher-order work.
- ``jax.vmap`` over the convolution runs it once per mapped element.

The shared library is compiled from ``onednn_conv.cc`` against the installed torch and jaxlib headers the first
time it is needed (a compile of some seconds; ``make install`` does it ahead) and cached under
``$XDG_CACHE_HOME/jaxcomposer/kernels`` (default ``~/.cache``; the temporary directory when that is read-only),
keyed by the source and both versions.
"""
from __future__ import annotations

import functools
import hashlib
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import jax
import numpy as np
from jax import lax

SOURCE = Path(__file__).with_name("onednn_conv.cc")
_TARGETS = {"forward": "JcConvForward", "input_grad": "JcConvBackwardInput", "kernel_grad": "JcConvBackwardKernel"}
# lax's ConvDimensionNumbers specs (as (lhs, rhs, out) index tuples) of the two layouts routed to the kernels
_DTYPES = (np.dtype(np.float32), np.dtype(jax.numpy.bfloat16))
_LAYOUTS = {((0, 3, 1, 2), (3, 2, 0, 1), (0, 3, 1, 2)): "NHWC",   # with HWIO kernels
            ((0, 1, 2, 3), (0, 1, 2, 3), (0, 1, 2, 3)): "NCHW"}   # with OIHW kernels


# ATen's kernel gradient of a strided 1x1 convolution on channels-last views with few input channels (per group)
# corrupts the heap (torch 2.13 CPU, any thread count; 1-6 channels crash within 300 calls, 7 and more did not):
# such convolutions, a few FLOPs each, stay on XLA's kernels
_MIN_STRIDED_1X1_CHANNELS = 16


class KernelBuildError(RuntimeError):
    """The oneDNN convolution library could not be compiled or loaded."""


def cache_dir() -> Path:
    """``$XDG_CACHE_HOME/jaxcomposer/kernels`` (default ``~/.cache``), or a temporary directory's when that cannot be
    written (a read-only home)."""
    root = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    for directory in (Path(root) / "jaxcomposer" / "kernels", Path(tempfile.gettempdir()) / "jaxcomposer-kernels"):
        try:
            directory.mkdir(parents=True, exist_ok=True)
        except OSError:
            continue
        if os.access(directory, os.W_OK):
            return directory
    raise KernelBuildError(f"no writable directory for the oneDNN kernel library (tried {root} and "
                           f"{tempfile.gettempdir()}); set XDG_CACHE_HOME to a writable directory")


def _build_key() -> str:
    import torch
    import jaxlib
    h = hashlib.sha256(SOURCE.read_bytes())
    h.update(f"{torch.__version__}|{jaxlib.__version__}|{sys.platform}".encode())
    return h.hexdigest()[:16]


def library_path() -> Path:
    """Where the compiled library for this source, torch and jaxlib lives (it may not exist yet)."""
    return cache_dir() / f"onednn_conv-{_build_key()}.so"


def build(force: bool = False) -> Path:
    """Compile ``onednn_conv.cc`` into the cache (a no-op when it is there) and return the library's path."""
    target = library_path()
    if target.exists() and not force:
        return target
    import torch
    import torch.utils.cpp_extension as cpp
    compiler = os.environ.get("CXX") or shutil.which("g++") or shutil.which("c++")
    if compiler is None:
        raise KernelBuildError("conv_impl='onednn' needs a C++ compiler to build its kernel once, and none was found "
                               "(looked for $CXX, g++, c++); install one (Debian: apt-get install g++) or use "
                               "conv_impl='xla'.")
    torch_lib = cpp.library_paths()[0]
    abi = int(torch._C._GLIBCXX_USE_CXX11_ABI)
    # Compile to a private name, then rename: concurrent builders (test workers) never see a partial library.
    fd, tmp = tempfile.mkstemp(suffix=".so", dir=target.parent)
    os.close(fd)
    cmd = [compiler, "-O2", "-std=c++20", "-shared", "-fPIC", "-w", f"-D_GLIBCXX_USE_CXX11_ABI={abi}",
           *(f"-I{p}" for p in cpp.include_paths()), f"-I{jax.ffi.include_dir()}", str(SOURCE), "-o", tmp,
           f"-L{torch_lib}", "-ltorch_cpu", "-lc10", f"-Wl,-rpath,{torch_lib}"]
    result = subprocess.run(cmd, capture_output=True, text=True)
    if result.returncode != 0:
        os.unlink(tmp)
        raise KernelBuildError(f"compiling {SOURCE.name} failed ({' '.join(cmd[:2])} ...):\n{result.stderr[-3000:]}")
    os.replace(tmp, target)
    return target


@functools.cache
def _register():
    """Build (once per cache), load and register the FFI targets with XLA:CPU; once per process. Returns the
    loaded library."""
    import ctypes
    import torch  # noqa: F401  (loads libtorch_cpu with its symbols before the library needs them)
    library = ctypes.cdll.LoadLibrary(str(build()))
    for name, symbol in _TARGETS.items():
        jax.ffi.register_ffi_target(f"jaxcomposer_onednn_conv_{name}", jax.ffi.pycapsule(getattr(library, symbol)),
                                    platform="cpu")
    return library


def release_openmp_team() -> None:
    """Free the calling thread's OpenMP team when the oneDNN kernels are loaded in this process (else nothing).

    The kernels call ATen from one thread of their own, so its OpenMP team should be the only one: on a machine
    with few cores, a second team makes OpenMP sleep at every barrier (``onednn_conv.cc``). Other threads get teams
    from their own torch ops: the thread that builds or converts a torch model and then traces the step (every
    traced convolution calls this), or a torch ``DataLoader``'s collate on the training thread
    (``torch_bridge.data.from_dataloader`` calls this after every batch). The thread's next torch op starts a new
    team (tens of microseconds)."""
    if _register.cache_info().currsize:
        _register().JcReleaseCallerTeam()


@functools.cache
def available() -> bool:
    """Whether the oneDNN kernels can run here: JAX's default backend is the CPU and the library is built and
    registered. Warns once, with the reason, when the build fails."""
    if jax.default_backend() != "cpu":
        return False
    try:
        _register()
    except (KernelBuildError, OSError) as e:
        import warnings
        warnings.warn(f"oneDNN convolutions unavailable, XLA's are used instead: {e}", RuntimeWarning, stacklevel=2)
        return False
    return True


@functools.cache
def bf16_is_exact() -> bool:
    """Whether ATen's bfloat16 convolutions here give the float32 result of the same operands rounded once, as
    oneDNN's do where the CPU has AVX-512 (native or emulated bf16). Where it has not (an AVX2-only CPU, or oneDNN
    capped below AVX-512 with ``ONEDNN_MAX_CPU_ISA``), ATen takes another kernel whose results are off by several
    bf16 units; bfloat16 convolutions then run in float32 and round once (:func:`conv_general_dilated`). Measured
    once per process on a small convolution, its value and both gradients, as the calls run them (channels-last)."""
    import torch

    g = torch.Generator().manual_seed(0)
    x, w, dy = (torch.randn(shape, generator=g).bfloat16().float()  # exact in bf16: both runs get the same operands
                for shape in ((2, 16, 9, 9), (8, 16, 3, 3), (2, 8, 9, 9)))

    def run(dtype):
        xs, ws = (t.to(dtype).contiguous(memory_format=torch.channels_last).requires_grad_() for t in (x, w))
        y = torch.nn.functional.conv2d(xs, ws, padding=1)
        y.backward(dy.to(dtype).contiguous(memory_format=torch.channels_last))
        return [t.detach().float() for t in (y, xs.grad, ws.grad)]

    result = all(torch.allclose(got, want, rtol=2.0 ** -7, atol=1e-5)
                 for got, want in zip(run(torch.bfloat16), run(torch.float32)))
    release_openmp_team()
    return result


def _call(name: str, like, *args, geometry: tuple):
    stride, padding, dilation, groups = geometry
    return jax.ffi.ffi_call(f"jaxcomposer_onednn_conv_{name}", jax.ShapeDtypeStruct(like.shape, like.dtype),
                            vmap_method="sequential")(
        *args, stride=np.asarray(stride, np.int64), padding=np.asarray(padding, np.int64),
        dilation=np.asarray(dilation, np.int64), groups=np.int64(groups))


@functools.partial(jax.custom_vjp, nondiff_argnums=(2, 3))
def _onednn_conv(x, w, out_shape: tuple, geometry: tuple):
    return _call("forward", jax.ShapeDtypeStruct(out_shape, x.dtype), x, w, geometry=geometry)


def _onednn_conv_fwd(x, w, out_shape, geometry):
    return _onednn_conv(x, w, out_shape, geometry), (x, w)


def _onednn_conv_bwd(out_shape, geometry, residuals, dy):
    x, w = residuals
    # Two calls, not one: when x needs no gradient (the image into the stem) XLA drops the input-gradient call.
    return _call("input_grad", x, w, dy, geometry=geometry), _call("kernel_grad", w, x, dy, geometry=geometry)


_onednn_conv.defvjp(_onednn_conv_fwd, _onednn_conv_bwd)


def _plan(lhs, rhs, window_strides, padding, lhs_dilation, rhs_dilation, dimension_numbers, feature_group_count,
          batch_group_count, preferred_element_type):
    """``(extra explicit padding, geometry, dimension numbers, layout)`` when oneDNN can run this convolution,
    else None. The geometry ``(strides, symmetric padding, dilation, groups)`` is the custom calls' attributes."""
    if lhs.ndim != 4 or rhs.ndim != 4 or lhs.dtype != rhs.dtype or lhs.dtype not in _DTYPES:
        return None
    if preferred_element_type not in (None, lhs.dtype) or batch_group_count != 1:
        return None
    if lhs_dilation is not None and tuple(lhs_dilation) != (1, 1):
        return None
    if lhs.size == 0 or rhs.size == 0:
        return None
    dn = lax.conv_dimension_numbers(lhs.shape, rhs.shape, dimension_numbers)
    layout = _LAYOUTS.get((tuple(dn.lhs_spec), tuple(dn.rhs_spec), tuple(dn.out_spec)))
    if layout is None:
        return None
    dilation = (1, 1) if rhs_dilation is None else tuple(int(d) for d in rhs_dilation)
    spatial_in = [lhs.shape[i] for i in dn.lhs_spec[2:]]
    kernel = [rhs.shape[i] for i in dn.rhs_spec[2:]]
    if kernel == [1, 1] and max(window_strides) > 1 and rhs.shape[dn.rhs_spec[1]] < _MIN_STRIDED_1X1_CHANNELS:
        return None
    if isinstance(padding, str):
        effective = [(k - 1) * d + 1 for k, d in zip(kernel, dilation)]
        padding = lax.padtype_to_pads(spatial_in, effective, window_strides, padding)
    padding = [(int(lo), int(hi)) for lo, hi in padding]
    if any(lo < 0 or hi < 0 for lo, hi in padding):
        return None
    symmetric = tuple(min(lo, hi) for lo, hi in padding)
    extra = [(lo - s, hi - s) for (lo, hi), s in zip(padding, symmetric)]
    geometry = (tuple(int(s) for s in window_strides), symmetric, dilation, int(feature_group_count))
    return extra, geometry, dn, layout


def conv_general_dilated(lhs, rhs, window_strides, padding, lhs_dilation=None, rhs_dilation=None,
                         dimension_numbers=None, feature_group_count=1, batch_group_count=1, precision=None,
                         preferred_element_type=None, out_sharding=None):
    """``lax.conv_general_dilated``'s signature and result; 2-D float32 and bfloat16 convolutions on CPU run on
    oneDNN."""
    def fallback(lhs, rhs):
        return lax.conv_general_dilated(lhs, rhs, window_strides, padding, lhs_dilation, rhs_dilation,
                                        dimension_numbers, feature_group_count, batch_group_count, precision,
                                        preferred_element_type, out_sharding=out_sharding)

    plan = _plan(lhs, rhs, window_strides, padding, lhs_dilation, rhs_dilation, dimension_numbers,
                 feature_group_count, batch_group_count, preferred_element_type)
    if plan is None or out_sharding is not None or jax.default_backend() != "cpu":
        return fallback(lhs, rhs)
    extra, geometry, dn, layout = plan
    out_shape = jax.eval_shape(fallback, lhs, rhs).shape
    _register()
    # bf16 where ATen's bf16 kernels are not exact here: the float32 convolution of the same operands, rounded once
    in_float32 = lhs.dtype == jax.numpy.bfloat16 and not bf16_is_exact()
    release_openmp_team()

    def onednn(lhs, rhs):
        if in_float32:
            return onednn_exact(lhs.astype(np.float32), rhs.astype(np.float32)).astype(lhs.dtype)
        return onednn_exact(lhs, rhs)

    def onednn_exact(lhs, rhs):
        if any(lo or hi for lo, hi in extra):
            pads = [(0, 0)] * 4
            for axis, pair in zip(dn.lhs_spec[2:], extra):
                pads[axis] = pair
            lhs = jax.numpy.pad(lhs, pads)
        # oneDNN's fast layouts are channels-last: NHWC activations, OHWI kernels. XLA fuses these transposes into
        # the neighbouring ops (a kernel's is a copy of a few thousand values).
        if layout == "NCHW":
            n, c, h, w = out_shape
            y = _onednn_conv(lhs.transpose(0, 2, 3, 1), rhs.transpose(0, 2, 3, 1), (n, h, w, c), geometry)
            return y.transpose(0, 3, 1, 2)
        return _onednn_conv(lhs, rhs.transpose(3, 0, 1, 2), out_shape, geometry)

    return lax.platform_dependent(lhs, rhs, cpu=onednn, default=fallback)
