"""torch_bridge.kernels.conv_general_dilated: oneDNN convolutions as XLA:CPU custom calls.

Every supported case is checked three ways against ``lax.conv_general_dilated`` (values, input gradient, kernel
gradient, at the bridge's per-layer tolerance) and, so that a silent fall-through cannot pass, by the custom calls
in its compiled HLO. Unsupported cases must fall through to lax exactly.
"""
from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx
from jax import lax

from jaxcomposer.models import ResNetCIFAR
from torch_bridge import kernels

ATOL = RTOL = 1e-5  # per layer, as every bridge parity test
TARGET = "jaxcomposer_onednn_conv_"

NHWC = ("NHWC", "HWIO", "NHWC")
NCHW = ("NCHW", "OIHW", "NCHW")

# (id, layout, input shape, kernel (kh, kw), out channels, strides, padding, rhs_dilation, groups)
CASES = [
    ("nhwc_3x3_same_pads", NHWC, (4, 9, 9, 6), (3, 3), 8, (1, 1), ((1, 1), (1, 1)), (1, 1), 1),
    ("nhwc_stride2_stem", NHWC, (3, 12, 12, 1), (3, 3), 5, (2, 2), ((1, 1), (1, 1)), (1, 1), 1),
    ("nhwc_1x1_stride2", NHWC, (2, 7, 7, 16), (1, 1), 16, (2, 2), ((0, 0), (0, 0)), (1, 1), 1),
    ("nhwc_SAME_stride2_asym", NHWC, (2, 10, 10, 4), (3, 3), 6, (2, 2), "SAME", (1, 1), 1),
    ("nhwc_VALID_rect", NHWC, (2, 8, 11, 3), (2, 5), 4, (1, 2), "VALID", (1, 1), 1),
    ("nhwc_dilated", NHWC, (2, 11, 11, 4), (3, 3), 4, (1, 1), ((2, 2), (2, 2)), (2, 2), 1),
    ("nhwc_groups2", NHWC, (2, 8, 8, 6), (3, 3), 4, (1, 1), ((1, 1), (1, 1)), (1, 1), 2),
    ("nhwc_depthwise_x2", NHWC, (2, 9, 9, 5), (3, 3), 10, (2, 2), ((1, 1), (1, 1)), (1, 1), 5),
    ("nchw_3x3", NCHW, (3, 6, 9, 9), (3, 3), 7, (1, 1), ((1, 1), (1, 1)), (1, 1), 1),
    ("nchw_7x7_stride2", NCHW, (2, 3, 16, 16), (7, 7), 8, (2, 2), ((3, 3), (3, 3)), (1, 1), 1),
    ("nchw_depthwise", NCHW, (2, 6, 8, 8), (5, 5), 6, (1, 1), ((2, 2), (2, 2)), (1, 1), 6),
    ("nchw_asym_explicit", NCHW, (2, 3, 8, 8), (3, 3), 4, (1, 1), ((0, 2), (1, 0)), (1, 1), 1),
]


def _operands(layout, shape, kernel, cout, groups, seed=0):
    rng = np.random.default_rng(seed)
    x = rng.standard_normal(shape).astype(np.float32)
    cin = shape[3] if layout == NHWC else shape[1]
    kh, kw = kernel
    # scaled so outputs are O(1) and the absolute tolerance means what it says
    w = (rng.standard_normal((kh, kw, cin // groups, cout)) / np.sqrt(kh * kw * cin / groups)).astype(np.float32)
    if layout == NCHW:
        w = w.transpose(3, 2, 0, 1)
    return jax.device_put(x), jax.device_put(w)


def _conv_pair(layout, strides, padding, dilation, groups):
    def with_impl(conv):
        def f(x, w):
            return conv(x, w, strides, padding, rhs_dilation=dilation, dimension_numbers=layout,
                        feature_group_count=groups, precision=lax.Precision.HIGHEST)
        return f
    return with_impl(lax.conv_general_dilated), with_impl(kernels.conv_general_dilated)


def _custom_calls(fn, *args) -> str:
    text = jax.jit(fn).lower(*args).as_text()
    return " ".join(sorted({t for t in ("forward", "input_grad", "kernel_grad") if TARGET + t in text}))


@pytest.mark.parametrize("case", CASES, ids=[c[0] for c in CASES])
def test_values_and_gradients_match_lax(case):
    _, layout, shape, kernel, cout, strides, padding, dilation, groups = case
    x, w = _operands(layout, shape, kernel, cout, groups)
    ref, ours = _conv_pair(layout, strides, padding, dilation, groups)
    assert _custom_calls(ours, x, w) == "forward"
    want = jax.jit(ref)(x, w)  # the reference jitted too: eager, each of its ops compiles on its own
    np.testing.assert_allclose(jax.jit(ours)(x, w), want, rtol=RTOL, atol=ATOL)

    probe = jax.device_put(np.random.default_rng(1).standard_normal(want.shape).astype(np.float32))
    # Each gradient O(1) too, as the outputs: an input gradient sums kh*kw*cout/groups terms of the scaled kernel,
    # but a kernel gradient sums batch*out_h*out_w terms of x * probe, so its probe is scaled by 1/sqrt(that count)
    # (unscaled, it is O(20) here and 1e-5 is below float32's rounding of such a sum)
    spatial = [want.shape[i] for i in ((1, 2) if layout == NHWC else (2, 3))]
    probe_w = probe / np.sqrt(shape[0] * spatial[0] * spatial[1])

    def grads(conv):
        return (jax.grad(lambda x: (conv(x, w) * probe).sum()), jax.grad(lambda w: (conv(x, w) * probe_w).sum()))

    assert _custom_calls(grads(ours)[0], x) == "input_grad"  # the loss is linear: no forward needed
    assert _custom_calls(grads(ours)[1], w) == "kernel_grad"
    for arg, got_fn, want_fn in zip((x, w), grads(ours), grads(ref)):
        got, want_grad = jax.jit(got_fn)(arg), jax.jit(want_fn)(arg)
        assert got.shape == want_grad.shape
        np.testing.assert_allclose(got, want_grad, rtol=RTOL, atol=ATOL)


def test_eager_call_matches_jit():
    _, layout, shape, kernel, cout, strides, padding, dilation, groups = CASES[0]
    x, w = _operands(layout, shape, kernel, cout, groups)
    _, ours = _conv_pair(layout, strides, padding, dilation, groups)
    np.testing.assert_array_equal(ours(x, w), jax.jit(ours)(x, w))


def test_input_gradient_call_is_dropped_when_only_the_kernel_needs_one():
    # the stem's input is the image: no input gradient, so XLA removes that custom call (torch skips it too)
    _, layout, shape, kernel, cout, strides, padding, dilation, groups = CASES[1]
    x, w = _operands(layout, shape, kernel, cout, groups)
    _, ours = _conv_pair(layout, strides, padding, dilation, groups)
    hlo = jax.jit(jax.grad(lambda w: ours(x, w).sum())).lower(w).compile().as_text()
    assert TARGET + "kernel_grad" in hlo and TARGET + "input_grad" not in hlo


def test_strided_1x1_with_few_channels_stays_on_xla():
    # ATen's kernel gradient of this convolution corrupts the heap (a crash within a few calls): never routed there
    x, w = _operands(NCHW, (32, 4, 8, 8), (1, 1), 8, 1)
    ref, ours = _conv_pair(NCHW, (2, 2), ((0, 0), (0, 0)), (1, 1), 1)
    grad = jax.jit(jax.grad(lambda w: (ours(x, w) ** 2).sum()))
    assert TARGET not in grad.lower(w).as_text()
    want = jax.jit(jax.grad(lambda w: (ref(x, w) ** 2).sum()))(w)
    for _ in range(20):  # the crash came within a few calls
        np.testing.assert_array_equal(grad(w), want)
    x16, w16 = _operands(NCHW, (4, 16, 8, 8), (1, 1), 8, 1)  # from 16 channels on, oneDNN again
    assert _custom_calls(ours, x16, w16) == "forward"


BF16_ULP = 2.0 ** -7  # one bfloat16 unit in the last place, relative (8 significant bits)
BF16_CASES = [c for c in CASES if c[0] in ("nhwc_3x3_same_pads", "nhwc_stride2_stem", "nhwc_depthwise_x2",
                                           "nchw_7x7_stride2")]


def _bf16(a):
    return a.astype(jnp.bfloat16)


@pytest.mark.parametrize("case", BF16_CASES, ids=[c[0] for c in BF16_CASES])
def test_bfloat16_is_the_float32_result_rounded_to_bfloat16(case):
    """Under AMP the calls take and give bfloat16. oneDNN accumulates in float32 and rounds once: each value, input
    gradient and kernel gradient is the float32 convolution of the same bf16 operands, rounded (within one bf16
    unit, as float32 sums in another order can round the other way), not a bf16 sum, which would be much worse."""
    _, layout, shape, kernel, cout, strides, padding, dilation, groups = case
    x, w = _operands(layout, shape, kernel, cout, groups)
    x16, w16 = _bf16(x), _bf16(w)
    ref, ours = _conv_pair(layout, strides, padding, dilation, groups)
    assert _custom_calls(ours, x16, w16) == "forward"

    def close_to(got, want):
        assert got.dtype == jnp.bfloat16
        got, want = np.asarray(got, np.float32), np.asarray(want)
        np.testing.assert_allclose(got, want, rtol=BF16_ULP, atol=ATOL)
        assert np.mean(got == np.asarray(_bf16(want), np.float32)) > 0.95  # rounded once, mostly to the same value

    x32, w32 = x16.astype(jnp.float32), w16.astype(jnp.float32)  # the bf16 operands, exactly, in float32
    close_to(jax.jit(ours)(x16, w16), jax.jit(ref)(x32, w32))
    probe = _bf16(jax.device_put(np.random.default_rng(1).standard_normal(ref(x, w).shape).astype(np.float32)))
    p32 = probe.astype(jnp.float32)
    for i, arg in enumerate((x16, w16)):
        def grad_of(conv, operands, cotangent):
            return jax.jit(jax.grad(lambda *ops: (conv(*ops) * cotangent).sum(), argnums=i))(*operands)
        close_to(grad_of(ours, (x16, w16), probe), grad_of(ref, (x32, w32), p32))


@pytest.mark.parametrize("why, kwargs, dtype", [
    ("float16", {}, jnp.float16),
    ("bfloat16 into float32", {"preferred_element_type": jnp.float32}, jnp.bfloat16),
    ("transposed (lhs_dilation)", {"lhs_dilation": (2, 2)}, jnp.float32),
    ("batch_group_count", {"batch_group_count": 2}, jnp.float32),
    ("negative padding", {"padding": ((-1, 0), (0, 0))}, jnp.float32),
])
def test_unsupported_convolutions_fall_through_to_lax_exactly(why, kwargs, dtype):
    x, w = _operands(NHWC, (2, 6, 6, 4), (3, 3), 4, 1)
    x, w = x.astype(dtype), w.astype(dtype)
    args = dict({"window_strides": (1, 1), "padding": ((1, 1), (1, 1)), "dimension_numbers": NHWC}, **kwargs)

    def ref(x, w):
        return lax.conv_general_dilated(x, w, **args)

    def ours(x, w):
        return kernels.conv_general_dilated(x, w, **args)

    assert _custom_calls(ours, x, w) == ""
    np.testing.assert_array_equal(jax.jit(ours)(x, w), jax.jit(ref)(x, w))


def test_one_dimensional_and_other_layouts_fall_through():
    x = jnp.ones((2, 9, 3), jnp.float32)
    w = jnp.ones((3, 3, 4), jnp.float32)
    dn = ("NWC", "WIO", "NWC")
    ours = jax.jit(lambda x, w: kernels.conv_general_dilated(x, w, (1,), ((1, 1),), dimension_numbers=dn))
    np.testing.assert_array_equal(ours(x, w), lax.conv_general_dilated(x, w, (1,), ((1, 1),), dimension_numbers=dn))
    x4, w4 = _operands(NHWC, (2, 6, 6, 4), (3, 3), 4, 1)
    mixed = ("NHWC", "OIHW", "NHWC")
    assert _custom_calls(lambda x, w: kernels.conv_general_dilated(x, w, (1, 1), "SAME", dimension_numbers=mixed),
                         x4, w4.transpose(3, 2, 0, 1)) == ""


def test_vmap_runs_the_convolution_per_element():
    _, layout, shape, kernel, cout, strides, padding, dilation, groups = CASES[0]
    x, w = _operands(layout, shape, kernel, cout, groups)
    ref, ours = _conv_pair(layout, strides, padding, dilation, groups)
    ws = jnp.stack([w, 2 * w])
    np.testing.assert_allclose(jax.jit(jax.vmap(ours, in_axes=(None, 0)))(x, ws),
                               jax.vmap(ref, in_axes=(None, 0))(x, ws), rtol=RTOL, atol=2 * ATOL)


def test_second_derivatives_are_refused():
    _, layout, shape, kernel, cout, strides, padding, dilation, groups = CASES[0]
    x, w = _operands(layout, shape, kernel, cout, groups)
    _, ours = _conv_pair(layout, strides, padding, dilation, groups)
    with pytest.raises(Exception):
        jax.hessian(lambda w: ours(x, w).sum())(w)


def _resnet(conv_impl):
    return ResNetCIFAR(8, 8, 10, in_channels=1, stem_stride=2, conv_impl=conv_impl, rngs=nnx.Rngs(3))


def test_resnet_with_onednn_convs_matches_xla_convs():
    # same seed, same parameters; the model-level tolerance (1e-4) for logits, loss gradients and batch statistics
    xla, onednn = _resnet("xla"), _resnet("onednn")
    x = jnp.asarray(np.random.default_rng(2).random((6, 28, 28, 1)), jnp.float32)
    y = jnp.arange(6) % 10

    def loss_and_grads(model):
        def loss(m):
            logits = m(x, train=True)
            return -jnp.take_along_axis(jax.nn.log_softmax(logits), y[:, None], axis=1).mean(), logits
        (value, logits), grads = nnx.jit(nnx.value_and_grad(loss, has_aux=True))(model)
        return value, logits, grads, nnx.state(model, nnx.BatchStat)

    for got, want in zip(jax.tree.leaves(loss_and_grads(onednn)), jax.tree.leaves(loss_and_grads(xla))):
        np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4)
    assert jax.tree.structure(nnx.state(onednn)) == jax.tree.structure(nnx.state(xla))


def test_unknown_conv_impl_names_the_choices():
    with pytest.raises(ValueError, match=r"conv_impl must be one of \('auto', 'xla', 'onednn'\), got 'mkldnn'"):
        _resnet("mkldnn")


def test_build_is_cached_by_source_and_versions():
    path = kernels.build()
    assert path.exists() and path == kernels.library_path()
    mtime = path.stat().st_mtime_ns
    assert kernels.build() == path and path.stat().st_mtime_ns == mtime  # no rebuild


def test_cache_falls_back_to_the_temporary_directory_when_home_is_read_only(tmp_path, monkeypatch):
    blocked = tmp_path / "not-a-directory"
    blocked.write_text("")  # a file where the cache root should be: mkdir below it fails
    monkeypatch.setenv("XDG_CACHE_HOME", str(blocked))
    monkeypatch.setattr(kernels.tempfile, "tempdir", str(tmp_path / "tmp"))
    assert kernels.cache_dir() == tmp_path / "tmp" / "jaxcomposer-kernels"
    assert kernels.cache_dir().is_dir()


def test_adapter_kernel_lookup_names_what_is_missing():
    from jaxcomposer.core import adapters
    from jaxcomposer.errors import ConfigurationError
    assert adapters.kernel("torch", "conv_general_dilated", wanted_by="x") is kernels.conv_general_dilated
    with pytest.raises(ConfigurationError, match=r"M\(conv_impl='y'\): needs the 'mxnet' adapter"):
        adapters.kernel("mxnet", "conv_general_dilated", wanted_by="M(conv_impl='y')")
    with pytest.raises(ConfigurationError, match=r"provides no kernel 'matmul'; it has \['conv_autotune', "
                                                 r"'conv_general_dilated', 'conv_general_dilated_auto'\]"):
        adapters.kernel("torch", "matmul", wanted_by="x")


def test_concurrent_callers_each_get_their_own_result():
    # the calls queue for the one ATen thread: four Python threads calling at once must not mix up their buffers
    import threading
    _, layout, shape, kernel, cout, strides, padding, dilation, groups = CASES[0]
    ref, ours = _conv_pair(layout, strides, padding, dilation, groups)
    step = jax.jit(jax.value_and_grad(lambda x, w: (ours(x, w) ** 2).sum(), argnums=(0, 1)))
    want_step = jax.jit(jax.value_and_grad(lambda x, w: (ref(x, w) ** 2).sum(), argnums=(0, 1)))
    operands = [_operands(layout, shape, kernel, cout, groups, seed=s) for s in range(4)]
    wants = [want_step(x, w) for x, w in operands]
    got, errors = [None] * 4, []

    def run(i):
        try:
            for _ in range(10):
                got[i] = jax.block_until_ready(step(*operands[i]))
        except Exception as e:  # noqa: BLE001 (reported below, with the thread's index)
            errors.append((i, e))

    threads = [threading.Thread(target=run, args=(i,)) for i in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=120)
    assert not errors and not any(t.is_alive() for t in threads)
    for (loss, (gx, gw)), (want_loss, (want_gx, want_gw)) in zip(got, wants):
        np.testing.assert_allclose(loss, want_loss, rtol=RTOL)
        np.testing.assert_allclose(gx, want_gx, rtol=RTOL, atol=ATOL * np.abs(want_gx).max())
        np.testing.assert_allclose(gw, want_gw, rtol=RTOL, atol=ATOL * np.abs(want_gw).max())


_THREADS_CHILD = r"""
import os, time
import jax, jax.numpy as jnp
import torch, torch.nn.functional as F
from torch_bridge import kernels

def count(name=None):
    names = []
    for t in os.listdir("/proc/self/task"):
        try:
            names.append(open(f"/proc/self/task/{t}/comm").read().strip())
        except OSError:
            pass
    return len(names) if name is None else names.count(name)

def settled(expected, name=None):  # a released worker leaves /proc shortly after its team is freed
    deadline = time.time() + 5
    while count(name) != expected and time.time() < deadline:
        time.sleep(0.01)
    return count(name)

jax.block_until_ready(jax.jit(lambda a: a * 2)(jnp.ones(3)))  # XLA's pools exist
before_torch = count()
F.conv2d(torch.rand(64, 16, 14, 14), torch.rand(16, 16, 3, 3), padding=1)  # this thread gets a team: + 1 worker
with_team = count()
dn = ("NHWC", "HWIO", "NHWC")
conv = lambda x, w: kernels.conv_general_dilated(x, w, (1, 1), ((1, 1), (1, 1)), dimension_numbers=dn)
step = jax.jit(jax.grad(lambda x, w: (conv(x, w) ** 2).sum(), argnums=(0, 1)))
x, w = jnp.ones((64, 14, 14, 16)), jnp.ones((3, 3, 16, 16)) * 0.1
compiled = step.lower(x, w).compile()  # tracing a convolution frees this thread's team
after_trace = settled(before_torch)
before_steps = count()
for _ in range(20):
    jax.block_until_ready(compiled(x, w))
F.conv2d(torch.rand(64, 16, 14, 14), torch.rand(16, 16, 3, 3), padding=1)  # a team again
again = count()
jax.jit(lambda x, w: conv(x, w) * 2).lower(x, w)  # every trace frees it, not only the first (registration)
after_second_trace = settled(before_steps + 2)  # the kernels keep their two
print(before_torch, with_team, after_trace, before_steps, again, after_second_trace, count("onednn-conv"))
"""


def test_aten_runs_on_one_thread_with_one_openmp_team():
    # OpenMP threads beyond the core count make libgomp sleep at every barrier (onednn_conv.cc): XLA's pool threads
    # must not start teams of their own, and the registering thread's team (from torch ops before) is freed
    import os
    import subprocess
    import sys
    env = {**os.environ, "OMP_NUM_THREADS": "2", "JAX_PLATFORMS": "cpu"}
    out = subprocess.run([sys.executable, "-c", _THREADS_CHILD], capture_output=True, text=True, timeout=300, env=env,
                         cwd=os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
    assert out.returncode == 0, out.stderr[-3000:]
    before_torch, with_team, after_trace, before_steps, again, after_second_trace, conv_threads = \
        map(int, out.stdout.split())
    assert with_team == before_torch + 1  # the main thread's OpenMP worker
    assert after_trace == before_torch  # ... freed when a convolution was traced
    # the kernels' own thread and its one worker: the only threads 20 steps of convolutions added
    assert conv_threads == 2 and again == before_steps + 2 + 1
    assert after_second_trace == before_steps + 2


_LOADER_CHILD = r"""
import os, time
import torch
from torch.utils.data import DataLoader, TensorDataset
import torch_bridge
from torch_bridge import data, kernels

def count():
    return len(os.listdir("/proc/self/task"))

def big_collate(rows):  # a collate heavy enough to run in parallel: this thread gets an OpenMP team
    torch.randn(1 << 22).mul_(2).sum()
    return torch.stack([r[0] for r in rows]), torch.stack([r[1] for r in rows])

dl = DataLoader(TensorDataset(torch.zeros(8, 3), torch.zeros(8)), batch_size=4, collate_fn=big_collate)
first = count()
before_kernels = [count() for _ in data.from_dataloader(dl)]   # kernels not loaded: the team stays
kernels._register()
kernels.release_openmp_team()
start = count()
after_batches = []
for _ in data.from_dataloader(dl):
    deadline = time.time() + 5
    while count() != start and time.time() < deadline:
        time.sleep(0.01)
    after_batches.append(count())
bridged = torch_bridge.from_torch(torch.nn.Linear(2048, 2048), (torch.zeros(1, 2048),))
kernels.release_openmp_team()
before_write_back = count()
bridged.to_torch(bridged.params, bridged.buffers)  # 4M weights copied in parallel: a team, freed again
deadline = time.time() + 5
while count() != before_write_back and time.time() < deadline:
    time.sleep(0.01)
print(first, *before_kernels, start, *after_batches, before_write_back, count())
"""


def test_dataloader_batches_and_write_backs_leave_no_openmp_team_once_the_kernels_are_loaded():
    import os
    import subprocess
    import sys
    env = {**os.environ, "OMP_NUM_THREADS": "2", "JAX_PLATFORMS": "cpu"}
    out = subprocess.run([sys.executable, "-c", _LOADER_CHILD], capture_output=True, text=True, timeout=300, env=env,
                         cwd=os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
    assert out.returncode == 0, out.stderr[-3000:]
    first, *rest = map(int, out.stdout.split())
    before_kernels, start, after_batches, write_back = rest[:2], rest[2], rest[3:5], rest[5:]
    assert before_kernels == [first + 1, first + 1]  # the collate's team: one worker, kept between batches
    assert after_batches == [start, start]  # freed after every batch
    assert write_back[1] == write_back[0]  # a bridged model's write-back into torch frees its copies' team too
