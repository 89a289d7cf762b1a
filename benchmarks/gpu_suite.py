"""GPU suite: jaxcomposer's Trainer vs. torch eager and torch.compile on ResNet-50 and a GPT-2 124M-shaped model,
and a bridged torchvision ResNet-50 vs. a plain-Flax step of the same network, on one accelerator, in one run.

Sections (each on synthetic batches put on the device before timing, so no input pipeline is measured):

- ``resnet50``: ResNet-50 (torchvision layout), batch 256, 224x224, 1000 classes, SGD momentum 0.9, lr 0.1.
  ``jaxcomposer``: ``Trainer`` + ``ComposerClassifier(jaxcomposer.models.resnet50())``, NHWC, ``DecoupledSGDW``;
  ``torch_eager`` / ``torch_compile``: ``torchvision.models.resnet50()`` (this file's twin of it where torchvision
  does not import), channels-last, ``torch.optim.SGD``, cuDNN benchmark mode; ``torch_compile`` wraps the model in
  ``torch.compile`` (default mode; it compiles forward and backward on its first step).
- ``gpt2``: GPT-2 124M shape (12 layers, d 768, 12 heads, 1024 positions, tied head; vocab 50257 padded to
  50304 as nanoGPT does), batch 16 x 1024 tokens, AdamW (lr 6e-4, betas 0.9/0.95, decay 0.1 x lr). ``jaxcomposer``:
  ``Trainer`` + ``ComposerCausalLM(jaxcomposer.models.GPT(attention_impl='cudnn'))`` (cuDNN flash attention; if
  its first step fails the side is rebuilt with XLA attention and the failure is recorded); torch sides:
  ``torch_bridge.mirrors.TorchGPT`` (``F.scaled_dot_product_attention``), fused ``torch.optim.AdamW``.
- ``bridged_resnet50``: ``torch_bridge.from_torch`` of torchvision's resnet50 (train graph, static batch) in the
  ``Trainer``, NCHW batches, with channels-last activations (``bridged``, the bridge's default) and in torch's
  layout (``bridged_nchw``, ``conv_layout='NCHW'``), vs. ``plain_flax``: a hand-written
  ``jax.jit(donate_argnums=...)`` step of the native NNX ResNet-50 (NHWC) with the same optimizer, the Trainer's AMP
  casts and bf16 layers. The JSON also compares the bridged figure with section ``resnet50``'s Trainer
  (``cross_section_ratios``).

Precision: bf16 on the GPU (``Trainer(precision='amp_bf16')``: fp32 master weights, bf16 compute, fp32 logits
and loss; the same casts in the plain step; ``torch.autocast(dtype=torch.bfloat16)``). The Trainer and the plain
step donate their state; nobody reads the loss per step (the Trainer's own non-finite check reads the step before
last, so dispatch stays a step ahead); every round ends synced. The Trainer gets each model as a ``PureModel``
without ``write_back`` (see :func:`steps_only`), so the rounds time train steps, not the once-per-``fit()`` copy
of the weights into the user's module. Per side: build time, first step (compile) time, the rest of the warm-up,
then ``--rounds`` interleaved rounds (A, B, C, A, B, C, ...) of ``--steps`` steps: items/s per round and their
median, ms/step, MFU, peak device memory, final loss. The other sides are timed before the torch.compile side
compiles; once it has, every side is timed again, all together, and those rounds are the ones recorded (so a
section stopped during a long compile still has its figures). Per section: ratios (ours / torch.compile, ours / torch
eager, bridged / plain Flax) and a goal with a pass/fail field: jaxcomposer's Trainer >= 8,300 img/s on ResNet-50
and >= 610k tok/s on GPT-2; bridged >= 0.90 x plain Flax (``bridge_speed.py``'s goal for the bridge). The H200
anchors of the issue that asked for this suite are in the JSON (``anchors_h200_bf16``).

MFU = items/s x model FLOPs per item / peak FLOP/s. Model FLOPs per item: ResNet-50, 3x the forward's convolution
and matmul FLOPs counted from its jaxpr at batch 1 (backward ~ 2x forward); GPT, per token
``6 N + 12 L d T`` (PaLM's appendix B, nanoGPT's ``estimate_mfu``; N: parameters without the position table).
Peak: 989.4 TFLOP/s (H100/H200 SXM, dense bf16) unless ``--peak-tflops`` says otherwise; null on other devices.

Memory: JAX sides, ``device.memory_stats()['peak_bytes_in_use']`` read once the side is warm (a process-wide
high-water mark that JAX cannot reset: every section runs in its own process, so the figures are the section's,
but the later JAX sides of ``bridged_resnet50`` report the max so far), and for the Trainer sides XLA's memory
analysis of the compiled step (``compiled_step_bytes``: temp, argument and output, per side); torch sides,
``torch.cuda.max_memory_allocated()`` (reset before each run of the side). JAX does not preallocate
(``XLA_PYTHON_CLIENT_PREALLOCATE=false``): torch shares the device.

Time budget (the goal: the whole suite in <= 8 minutes on one H200): ``--budget-s`` (450 s) is shared out among
the sections, each a child process with a hard timeout of its share of the time left (unused time rolls on);
inside a section a ``torch.compile`` side starts only with ``--compile-reserve-s`` left. A section that fails,
crashes or runs out of time is recorded with its error (and the child's last stderr lines) and the suite goes on;
the JSON is rewritten after every side and round, so a killed section keeps what it had measured.

On the lent GPU machine (JAX with CUDA, flax, optax, torch, torchvision, Python 3.12; the working tree copied,
nothing installed), from the repository root:

    python3 benchmarks/gpu_suite.py                      # full, < 8 min -> benchmarks/results/gpu_suite.json
    python3 benchmarks/gpu_suite.py --sections gpt2      # one section (or a comma list)

The script puts the repository root on ``sys.path`` itself. ``import jaxcomposer`` also needs pydantic
(with pydantic-core, annotated-types and typing-inspection), which that machine lacks: the script checks first and
names what is missing. Carry their wheels (CPython 3.12, manylinux x86_64) in ``.whl/`` (git-ignored), made here,
where there is network: ``make gpu-wheels``. Then, on the lent machine, with ``.whl`` carried:

    python3 -m pip install -q --no-index --no-deps --target /tmp/site .whl/*.whl && \\
        PYTHONPATH=/tmp/site python3 benchmarks/gpu_suite.py

PyYAML and orbax-checkpoint come with flax, Pillow with torchvision; nothing else is imported (no tqdm,
tensorboardX, matplotlib, scikit-learn).

Check the script on a CPU (tiny shapes, one ResNet stage, one GPT layer, fp32, 2 timed steps, torch.compile
skipped, all in this process; its numbers mean nothing; tests/test_gpu_suite.py runs it):

    .venv/bin/python benchmarks/gpu_suite.py --cpu-smoke [--precision bf16]
"""
from __future__ import annotations

import argparse
import collections
import dataclasses
import importlib.util
import json
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import traceback
from pathlib import Path
from typing import Any, Callable

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
for _p in (str(ROOT), str(HERE)):  # the lent machine has the working tree but no install of our packages
    if _p not in sys.path:
        sys.path.insert(0, _p)

from common import host_facts, results_path, write_json  # noqa: E402  (benchmarks/common.py: stdlib only)

NAME = "gpu_suite"
SECTIONS = ("resnet50", "gpt2", "bridged_resnet50")
GOALS = {"resnet50": {"side": "jaxcomposer", "unit": "images/s", "target": 8300.0},
         "gpt2": {"side": "jaxcomposer", "unit": "tokens/s", "target": 610_000.0},
         "bridged_resnet50": {"ratio": "bridged_over_plain_flax", "target": 0.90}}
# Measured on one H200 in bf16 (from the issue that asked for this suite), printed beside our numbers.
ANCHORS_H200 = {"resnet50": {"torch_eager": 4694.0, "torch_compile": 6661.0, "plain_flax": 6850.0},
                "gpt2": {"torch_eager": 350_000.0, "torch_compile": 485_000.0, "plain_flax_xla_attention": 257_000.0,
                         "plain_flax_cudnn_attention": 477_000.0}}
# Dense bf16 peaks (FLOP/s), by a substring of jax's device_kind.
PEAK_BF16 = {"H200": 989.4e12, "H100": 989.4e12}
# What `import jaxcomposer, torch_bridge` needs beyond JAX/flax/optax/torch (checked before any section starts).
REQUIRED_MODULES = ("jax", "flax", "optax", "numpy", "torch", "pydantic", "yaml", "orbax.checkpoint", "PIL")
SECTION_SHARE = {"resnet50": 0.4, "gpt2": 0.3, "bridged_resnet50": 0.3}  # of the time left when a section starts

_T0 = time.perf_counter()


def log(msg: str) -> None:
    """Progress on stderr (stdout ends with the table)."""
    print(f"[{NAME} +{time.perf_counter() - _T0:6.1f}s] {msg}", file=sys.stderr, flush=True)


class Skip(Exception):
    """A side that is not run, with the reason recorded in its place."""


def error_text(e: BaseException, limit: int = 1500) -> str:
    text = f"{type(e).__name__}: {e}"
    return text if len(text) <= limit else text[:limit] + " ..."


def is_gpu(device) -> bool:
    return device.platform in ("gpu", "cuda", "rocm")  # JAX says "gpu"; the others are its backends' names


# ------------------------------------------------------------------------------------------------ shapes and setup
def shapes(smoke: bool) -> dict:
    """Model and batch shapes: the real ones, or tiny ones that run on a CPU in seconds."""
    if smoke:
        # one ResNet stage: compile time, not arithmetic, is a smoke run's cost, and it grows with the block count
        return {"resnet": {"batch": 2, "image": 32, "layers": (1,), "width": 8, "num_classes": 10},
                "gpt": {"batch": 2, "seq_len": 32, "vocab_size": 256, "d_model": 64, "n_layers": 1, "n_heads": 2}}
    return {"resnet": {"batch": 256, "image": 224, "layers": (3, 4, 6, 3), "width": 64, "num_classes": 1000},
            "gpt": {"batch": 16, "seq_len": 1024, "vocab_size": 50304, "d_model": 768, "n_layers": 12,
                    "n_heads": 12}}


@dataclasses.dataclass
class Env:
    """What every side of a section shares: the options, the devices and the deadline."""
    args: argparse.Namespace
    jax_device: Any
    torch_device: Any
    deadline: float  # time.perf_counter() value after which no expensive side starts

    @property
    def gpu(self) -> bool:
        return is_gpu(self.jax_device)

    @property
    def bf16(self) -> bool:
        return self.args.precision == "bf16"

    @property
    def total_steps(self) -> int:
        """A Trainer's ``max_duration``: its warm-up and up to two timing phases (see :func:`run_section`)."""
        return self.args.warmup + 2 * self.args.rounds * self.args.steps


@dataclasses.dataclass
class SideSpec:
    """One side of a section. ``build()`` returns an object with ``run(n) -> seconds`` (synced at the end),
    ``last_loss`` and ``memory() -> dict | None``; it may raise :class:`Skip`. ``expensive`` sides (torch.compile)
    start only with ``--compile-reserve-s`` left; ``fallback`` is tried when this side fails to build or warm up."""
    name: str
    build: Callable[[], Any]
    expensive: bool = False
    fallback: "SideSpec | None" = None
    info: dict = dataclasses.field(default_factory=dict)


# ------------------------------------------------------------------------------------------------ memory and FLOPs
def jax_memory(device) -> dict | None:
    stats = device.memory_stats() if hasattr(device, "memory_stats") else None
    if not stats or "peak_bytes_in_use" not in stats:
        return None  # the CPU backend keeps no such statistics
    return {"source": "jax device.memory_stats() (process high-water mark)",
            "peak_gib": round(stats["peak_bytes_in_use"] / 2**30, 3),
            "in_use_gib": round(stats.get("bytes_in_use", 0) / 2**30, 3),
            "limit_gib": round(stats["bytes_limit"] / 2**30, 3) if "bytes_limit" in stats else None}


def peak_flops(device, override_tflops: float | None) -> tuple[float | None, str]:
    if override_tflops:
        return override_tflops * 1e12, f"--peak-tflops {override_tflops}"
    kind = getattr(device, "device_kind", "")
    for key, value in PEAK_BF16.items():
        if is_gpu(device) and key in kind:
            return value, f"{key} dense bf16 (SXM) for device_kind {kind!r}"
    return None, f"no known peak for {device.platform} device_kind {kind!r} (MFU left null)"


def equations(jaxpr):
    """Every equation of ``jaxpr``, those of its sub-jaxprs (jit, remat, custom VJPs, ...) included."""
    from jax.extend.core import jaxprs_in_params

    for eqn in jaxpr.eqns:
        yield eqn
        for sub in jaxprs_in_params(eqn.params):
            yield from equations(sub)


def matmul_flops(jaxpr) -> float:
    """FLOPs of the convolutions and matmuls in ``jaxpr`` (2 per multiply-add; elementwise work not counted),
    sub-jaxprs included. Counted from shapes, so the same on every backend (XLA's cost analysis of a lowering is
    None on the GPU)."""
    import math

    total = 0.0
    for eqn in equations(jaxpr):
        name, out = eqn.primitive.name, eqn.outvars[0].aval
        if name == "dot_general":
            (contract, _), _ = eqn.params["dimension_numbers"]
            lhs = eqn.invars[0].aval
            total += 2.0 * math.prod(out.shape) * math.prod(lhs.shape[d] for d in contract)
        elif name == "conv_general_dilated":
            rhs, dn = eqn.invars[1].aval, eqn.params["dimension_numbers"]
            # kernel elements per output element: in-channels per group x spatial taps
            per_output = math.prod(rhs.shape) // rhs.shape[dn.rhs_spec[0]]
            total += 2.0 * math.prod(out.shape) * per_output
    return total


def matmul_operand_dtypes(jaxpr) -> dict:
    """``{dtype name: count}`` over the operands of ``jaxpr``'s convolutions and matmuls (sub-jaxprs included):
    under AMP every one should be bfloat16, and a float32 count says a layer promoted back to float32."""
    counts: dict = {}
    for eqn in equations(jaxpr):
        if eqn.primitive.name in ("dot_general", "conv_general_dilated"):
            for v in eqn.invars[:2]:
                counts[str(v.aval.dtype)] = counts.get(str(v.aval.dtype), 0) + 1
    return counts


def forward_flops(make_module: Callable, input_shape: tuple) -> tuple[float | None, str]:
    """FLOPs of one forward's convolutions and matmuls (:func:`matmul_flops`), traced abstractly at batch 1
    (nothing is compiled or allocated)."""
    import jax
    import jax.numpy as jnp
    from flax import nnx

    try:
        graphdef, state = nnx.split(nnx.eval_shape(make_module))
        closed = jax.make_jaxpr(lambda st, x: nnx.merge(graphdef, st)(x, train=False))(
            state, jax.ShapeDtypeStruct(input_shape, jnp.float32))
        return matmul_flops(closed.jaxpr), "convolution and matmul FLOPs of the forward at batch 1, x3 for fwd+bwd"
    except Exception as e:  # noqa: BLE001 - the figure is optional; the benchmark is not
        return None, f"FLOP count unavailable: {error_text(e, 300)}"


# ------------------------------------------------------------------------------------------------ JAX sides
def init_module(make: Callable):
    """Build an NNX module under jit: one compile for all its initializers, not one per op."""
    from flax import nnx
    return nnx.jit(make)()


def device_batches(make: Callable, count: int, sharding) -> list:
    """``count`` synthetic batches (``make(numpy Generator) -> dict of numpy arrays``) put on the device once,
    with ``sharding``; the timed steps never copy inputs. (Made on the host: a jitted maker would cost a compile
    per shape, the bulk of a smoke run's time, to save a second per run on the GPU.)"""
    import jax
    import numpy as np
    return [jax.device_put(make(np.random.default_rng(i)), sharding) for i in range(count)]


def steps_only(model):
    """``model`` as a ``PureModel`` without ``write_back``. The Trainer copies the weights back into the user's
    module at the end of every ``fit()`` (Composer's semantics): once per run in real use, but once per timed round
    here, where for the bridged model it is a device-to-host copy of every weight into the torch module. Without it
    the rounds time train steps only, on every Trainer side alike."""
    from jaxcomposer.core.model import to_pure_model
    return dataclasses.replace(to_pure_model(model), write_back=None)


def trainer_side(env: Env, task, optimizer, make_batch: Callable):
    """The Trainer as ``benchmarks/common.py``'s ``TrainerSide``, fed device-resident batches: made with the
    Trainer's own batch sharding, so its prefetcher's ``device_put`` finds them in place and copies nothing."""
    from jax.sharding import NamedSharding, PartitionSpec as P

    from common import CyclingLoader, TrainerSide

    pool: list = []  # filled below, once the Trainer's mesh exists (the Trainer reads no batch before fit)
    side = TrainerSide(model=task, train_dataloader=CyclingLoader(pool, env.args.steps), eval_dataloader=None,
                       max_duration=f"{env.total_steps}ba", optimizers=optimizer, schedulers=None, algorithms=None,
                       progress_bar=False, log_to_console=False, seed=0, devices=[env.jax_device],
                       precision="amp_bf16" if env.bf16 else "fp32")
    pool.extend(device_batches(make_batch, 2, NamedSharding(side.trainer.mesh, P("data"))))
    side.pool = pool
    side.memory = lambda: jax_memory(env.jax_device)

    def forward_dtypes():
        import jax

        from jaxcomposer.trainer.step import make_forward
        t = side.trainer
        forward = make_forward(t.task, t.precision)
        closed = jax.make_jaxpr(lambda p, s, b: forward(p, s, b, train=True, key=jax.random.key(0)))(
            t.task.params, t.task.state, pool[0])
        return matmul_operand_dtypes(closed.jaxpr)

    side.forward_dtypes = forward_dtypes

    def compiled_memory():  # per side, unlike the process-wide high-water mark (the step is compiled already)
        m = side.trainer.compiled_train_step(pool[0]).memory_analysis()
        return {k: int(getattr(m, f"{k}_size_in_bytes")) for k in ("temp", "argument", "output")}

    side.compiled_memory = compiled_memory
    return side


class PlainFlaxSide:
    """A hand-written train step of an NNX classifier: ``jax.jit`` with the state donated, the Trainer's AMP
    casts (fp32 master weights, bf16 params and inputs inside the loss) and bf16 layers (the ``dtype`` a Flax user
    gives each layer for mixed precision; else BatchNorm promotes to its float32 statistics), mean soft
    cross-entropy, fp32 logits."""

    def __init__(self, env: Env, module, tx, make_batch: Callable):
        import jax
        import jax.numpy as jnp
        import optax
        from flax import nnx

        from jaxcomposer.core.model import compute_in

        from jaxcomposer.loss import soft_cross_entropy
        from jaxcomposer.trainer.step import cast_floating

        graphdef, params, model_state = nnx.split(module, nnx.Param, ...)
        compute = jnp.bfloat16 if env.bf16 else jnp.float32

        def loss_fn(p, model_state, batch):
            live = nnx.merge(graphdef, cast_floating(p, compute), model_state, copy=True)
            compute_in(live, compute)
            logits = live(batch["input"].astype(compute), train=True)
            _, _, new_state = nnx.split(live, nnx.Param, ...)
            return soft_cross_entropy(logits.astype(jnp.float32), batch["target"]).mean(), new_state

        def step(params, model_state, opt_state, batch):
            (loss, new_state), grads = jax.value_and_grad(loss_fn, has_aux=True)(params, model_state, batch)
            updates, opt_state = tx.update(grads, opt_state, params)
            return optax.apply_updates(params, updates), new_state, opt_state, loss

        self.step = jax.jit(step, donate_argnums=(0, 1, 2))
        on_device = jax.sharding.SingleDeviceSharding(env.jax_device)
        # committed to the device up front, as the step's outputs are: else the second call compiles again
        self.params, self.model_state, self.opt_state = jax.device_put((params, model_state, tx.init(params)),
                                                                       on_device)
        self.pool = device_batches(make_batch, 2, on_device)
        self.device, self.i, self.loss = env.jax_device, 0, None
        self.forward_dtypes = lambda: matmul_operand_dtypes(
            jax.make_jaxpr(loss_fn)(self.params, self.model_state, self.pool[0]).jaxpr)

    def run(self, n: int) -> float:
        import jax
        t0 = time.perf_counter()
        for _ in range(n):
            batch = self.pool[self.i % len(self.pool)]
            self.i += 1
            self.params, self.model_state, self.opt_state, self.loss = self.step(
                self.params, self.model_state, self.opt_state, batch)
        jax.block_until_ready((self.params, self.model_state, self.opt_state, self.loss))
        return time.perf_counter() - t0

    @property
    def last_loss(self) -> float:
        return float(self.loss)

    def memory(self) -> dict | None:
        return jax_memory(self.device)


# ------------------------------------------------------------------------------------------------ torch sides
def torch_resnet_twin(layers, width: int, num_classes: int):
    """torchvision's ResNet layout in plain torch, for machines without torchvision and for tiny shapes (which
    torchvision's ``ResNet`` cannot make: its stem is always 64 wide): 7x7/2 stem, 3x3/2 max-pool, bottlenecks
    with the stride on the 3x3 conv, 1x1 conv + BN downsampling, average pool, linear head."""
    import torch
    from torch import nn

    class Bottleneck(nn.Module):
        def __init__(self, cin: int, planes: int, stride: int):
            super().__init__()
            cout = 4 * planes
            self.conv1, self.bn1 = nn.Conv2d(cin, planes, 1, bias=False), nn.BatchNorm2d(planes)
            self.conv2, self.bn2 = nn.Conv2d(planes, planes, 3, stride, 1, bias=False), nn.BatchNorm2d(planes)
            self.conv3, self.bn3 = nn.Conv2d(planes, cout, 1, bias=False), nn.BatchNorm2d(cout)
            self.downsample = nn.Sequential(nn.Conv2d(cin, cout, 1, stride, bias=False), nn.BatchNorm2d(cout)) \
                if stride != 1 or cin != cout else None

            self.relu = nn.ReLU(inplace=True)

        def forward(self, x):  # torchvision's in-place habits too: the bridge must functionalize them
            y = self.relu(self.bn1(self.conv1(x)))
            y = self.relu(self.bn2(self.conv2(y)))
            y = self.bn3(self.conv3(y))
            y += x if self.downsample is None else self.downsample(x)
            return self.relu(y)

    stages, cin = [], width
    for stage, n in enumerate(layers):
        planes = width * 2 ** stage
        blocks = []
        for i in range(n):
            blocks.append(Bottleneck(cin, planes, 2 if (stage > 0 and i == 0) else 1))
            cin = 4 * planes
        stages.append(nn.Sequential(*blocks))
    model = nn.Sequential(nn.Conv2d(3, width, 7, 2, 3, bias=False), nn.BatchNorm2d(width), nn.ReLU(inplace=True),
                          nn.MaxPool2d(3, 2, 1), *stages, nn.AdaptiveAvgPool2d(1), nn.Flatten(),
                          nn.Linear(cin, num_classes))
    for m in model.modules():  # torchvision's init for convs
        if isinstance(m, nn.Conv2d):
            nn.init.kaiming_normal_(m.weight, mode="fan_out", nonlinearity="relu")
    return model


def seeded_torch(build: Callable):
    """``build()`` under torch's seed 0, leaving the caller's torch RNG state as it was (a smoke run shares its
    process with other tests)."""
    import torch
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(0)
        return build()


def torch_resnet(r: dict, smoke: bool):
    """(module, where it came from): torchvision's resnet50 for the real shapes when it imports, else the twin."""
    if not smoke:
        try:
            import torchvision
            return torchvision.models.resnet50(num_classes=r["num_classes"]), \
                f"torchvision.models.resnet50 (torchvision {torchvision.__version__})"
        except ImportError as e:
            log(f"torchvision does not import ({e}); using gpu_suite's torch twin of its ResNet-50")
    return torch_resnet_twin(r["layers"], r["width"], r["num_classes"]), \
        f"gpu_suite.torch_resnet_twin(layers={tuple(r['layers'])}, width={r['width']}) (torchvision layout)"


class TorchSide:
    """A plain torch training loop: ``zero_grad``, forward + loss under bf16 autocast, ``backward``, ``step``;
    the round ends with ``torch.cuda.synchronize()``."""

    def __init__(self, env: Env, model, optimizer, batches: list, loss_fn: Callable):
        import torch
        self.torch, self.env = torch, env
        self.model, self.opt, self.batches, self.loss_fn = model, optimizer, batches, loss_fn
        self.cuda = env.torch_device.type == "cuda"
        self.i, self.loss, self.peak = 0, None, 0

    def run(self, n: int) -> float:
        torch = self.torch
        if self.cuda:
            torch.cuda.reset_peak_memory_stats()
        # a smoke run's torch uses one thread: OpenMP threads spin-wait, and slow down many-fold, on busy cores
        threads = torch.get_num_threads()
        if self.env.args.cpu_smoke:
            torch.set_num_threads(1)
        try:
            return self._steps(n)
        finally:
            torch.set_num_threads(threads)

    def _steps(self, n: int) -> float:
        torch = self.torch
        t0 = time.perf_counter()
        for _ in range(n):
            x, y = self.batches[self.i % len(self.batches)]
            self.i += 1
            self.opt.zero_grad(set_to_none=True)
            with torch.autocast(self.env.torch_device.type, dtype=torch.bfloat16, enabled=self.env.bf16):
                loss = self.loss_fn(self.model(x), y)
            loss.backward()
            self.opt.step()
        if self.cuda:
            torch.cuda.synchronize()
            self.peak = max(self.peak, torch.cuda.max_memory_allocated())
        self.loss = loss.detach()
        return time.perf_counter() - t0

    @property
    def last_loss(self) -> float:
        return float(self.loss)

    def memory(self) -> dict | None:
        if not self.cuda:
            return None
        return {"source": "torch.cuda.max_memory_allocated() (reset before each run of this side)",
                "peak_gib": round(self.peak / 2**30, 3)}


def torch_spec(env: Env, name: str, make_model: Callable, make_optimizer: Callable, make_batches: Callable,
               loss_fn: Callable, compiled: bool) -> SideSpec:
    """``torch_eager`` or ``torch_compile`` (the same model wrapped in ``torch.compile``; compiles on its first
    step, forward and backward)."""
    def build():
        import torch
        if compiled and env.args.cpu_smoke:
            raise Skip("--cpu-smoke: torch.compile is skipped (minutes of compile on a CPU)")
        if compiled and env.args.no_torch_compile:
            raise Skip("--no-torch-compile")
        model = seeded_torch(make_model).to(env.torch_device).train()
        optimizer = make_optimizer(model)  # on the eager module's parameters, which the compiled one shares
        return TorchSide(env, torch.compile(model) if compiled else model, optimizer, make_batches(), loss_fn)

    return SideSpec(name, build, expensive=compiled, info={"compiled": "torch.compile(model), default mode"}
                    if compiled else {})


# ------------------------------------------------------------------------------------------------ sections
def resnet_section(env: Env) -> dict:
    import numpy as np
    import torch
    import torch.nn.functional as F

    from jaxcomposer import ComposerClassifier
    from jaxcomposer.models import resnet50
    from jaxcomposer.optim import DecoupledSGDW

    r = shapes(env.args.cpu_smoke)["resnet"]
    bs, hw, nc = env.args.resnet_batch or r["batch"], r["image"], r["num_classes"]
    model_kw = dict(num_classes=nc, layers=r["layers"], width=r["width"])
    sgd = dict(lr=0.1, momentum=0.9)
    flops, flops_source = forward_flops(lambda: resnet50(**model_kw), (1, hw, hw, 3))

    def nhwc(rng):
        return {"input": rng.standard_normal((bs, hw, hw, 3), np.float32),
                "target": rng.integers(0, nc, (bs,), np.int32)}

    def torch_batches():
        g = torch.Generator(device=env.torch_device).manual_seed(0)
        fmt = torch.channels_last if env.torch_device.type == "cuda" else torch.contiguous_format
        return [(torch.randn(bs, 3, hw, hw, device=env.torch_device, generator=g).to(memory_format=fmt),
                 torch.randint(0, nc, (bs,), device=env.torch_device, generator=g)) for _ in range(2)]

    def torch_model():
        model, source = torch_resnet(r, env.args.cpu_smoke)
        setup["torch_model"] = source
        fmt = torch.channels_last if env.torch_device.type == "cuda" else torch.contiguous_format
        return model.to(memory_format=fmt)

    def torch_sgd(model):
        return torch.optim.SGD(model.parameters(), **sgd)

    def ours():
        module = init_module(lambda: resnet50(**model_kw))
        return trainer_side(env, ComposerClassifier(steps_only(module), num_classes=nc), DecoupledSGDW(**sgd), nhwc)

    setup = {"model": f"ResNet-50 layout, layers={tuple(r['layers'])}, width={r['width']}, {nc} classes",
             "batch": bs, "image": hw, "optimizer": {"lr": 0.1, "momentum": 0.9, "weight_decay": 0.0,
                                                    "jax": "DecoupledSGDW", "torch": "torch.optim.SGD"},
             "layouts": {"jaxcomposer": "NHWC", "torch": "channels_last (NCHW logical)" if env.gpu else "NCHW"},
             "jax_model": "jaxcomposer.models.resnet50 (ResNetImageNet)"}
    specs = [SideSpec("jaxcomposer", ours),
             torch_spec(env, "torch_eager", torch_model, torch_sgd, torch_batches, F.cross_entropy, False),
             torch_spec(env, "torch_compile", torch_model, torch_sgd, torch_batches, F.cross_entropy, True)]
    return {"unit": "images/s", "items_per_step": bs, "flops_per_item": None if flops is None else 3 * flops,
            "flops_source": flops_source, "setup": setup, "specs": specs}


def gpt_section(env: Env) -> dict:
    import numpy as np
    import torch
    import torch.nn.functional as F
    from flax import nnx

    from torch_bridge.mirrors import TorchGPT
    from jaxcomposer import ComposerCausalLM
    from jaxcomposer.models import GPT, num_params
    from jaxcomposer.optim import DecoupledAdamW

    g = shapes(env.args.cpu_smoke)["gpt"]
    bs, t, vocab = env.args.gpt_batch or g["batch"], g["seq_len"], g["vocab_size"]
    gpt_kw = {k: g[k] for k in ("vocab_size", "seq_len", "d_model", "n_layers", "n_heads")}
    n_params = num_params(nnx.eval_shape(lambda: GPT(**gpt_kw, rngs=nnx.Rngs(0))))
    n = n_params - g["seq_len"] * g["d_model"]  # without the position table, which does no matmul
    flops_per_token = 6 * n + 12 * g["n_layers"] * g["d_model"] * t
    # torch's AdamW decays by lr * wd; jaxcomposer's DecoupledAdamW (Composer's) by wd alone: the same decay
    adamw = dict(lr=6e-4, betas=(0.9, 0.95), eps=1e-8)
    torch_wd = 0.1

    def tokens(rng):
        return {"input_ids": rng.integers(0, vocab, (bs, t + 1), np.int32)}

    def torch_batches():
        gen = torch.Generator(device=env.torch_device).manual_seed(0)
        out = []
        for _ in range(2):
            ids = torch.randint(0, vocab, (bs, t + 1), device=env.torch_device, generator=gen)
            out.append((ids[:, :-1], ids[:, 1:]))
        return out

    def lm_loss(logits, targets):
        return F.cross_entropy(logits.reshape(-1, logits.shape[-1]).float(), targets.reshape(-1))

    def torch_adamw(model):
        fused = {"fused": True} if env.torch_device.type == "cuda" else {}
        return torch.optim.AdamW(model.parameters(), weight_decay=torch_wd, **adamw, **fused)

    def ours(impl):
        def build():
            module = init_module(lambda: GPT(**gpt_kw, attention_impl=impl, rngs=nnx.Rngs(0)))
            opt = DecoupledAdamW(**adamw, weight_decay=adamw["lr"] * torch_wd)
            return trainer_side(env, ComposerCausalLM(steps_only(module)), opt, tokens)
        return build

    impl = env.args.attention if env.gpu and env.bf16 else "xla"  # cuDNN attention: GPU and bf16 only
    xla = SideSpec("jaxcomposer", ours("xla"), info={"attention_impl": "xla"})
    specs = [SideSpec("jaxcomposer", ours(impl), info={"attention_impl": impl},
                      fallback=xla if impl != "xla" else None),
             torch_spec(env, "torch_eager", lambda: TorchGPT(**gpt_kw), torch_adamw, torch_batches, lm_loss, False),
             torch_spec(env, "torch_compile", lambda: TorchGPT(**gpt_kw), torch_adamw, torch_batches, lm_loss, True)]
    setup = {"model": {"name": "GPT (nanoGPT layout)", **gpt_kw, "params": n_params, "tied_head": True},
             "batch": bs, "tokens_per_step": bs * t,
             "optimizer": {**adamw, "torch": f"torch.optim.AdamW(weight_decay={torch_wd}, fused on CUDA)",
                           "jax": f"DecoupledAdamW(weight_decay={adamw['lr'] * torch_wd:g})"},
             "loss": "mean next-token cross-entropy (fp32 logits)", "torch_model": "torch_bridge.mirrors.TorchGPT"}
    return {"unit": "tokens/s", "items_per_step": bs * t, "flops_per_item": flops_per_token,
            "flops_source": "6 N + 12 L d T per token (N = params without the position table)",
            "setup": setup, "specs": specs}


def bridged_section(env: Env) -> dict:
    import numpy as np
    import torch

    import torch_bridge
    from jaxcomposer import ComposerClassifier
    from jaxcomposer.models import resnet50
    from jaxcomposer.optim import DecoupledSGDW

    r = shapes(env.args.cpu_smoke)["resnet"]
    bs, hw, nc = env.args.resnet_batch or r["batch"], r["image"], r["num_classes"]
    model_kw = dict(num_classes=nc, layers=r["layers"], width=r["width"])
    sgd = dict(lr=0.1, momentum=0.9)
    flops, flops_source = forward_flops(lambda: resnet50(**model_kw), (1, hw, hw, 3))
    setup = {"batch": bs, "image": hw, "optimizer": "DecoupledSGDW(lr=0.1, momentum=0.9) on both sides",
             "layouts": {"bridged": "NCHW batches, channels-last activations (conv_layout NHWC, the default)",
                         "bridged_nchw": "NCHW batches and activations (conv_layout NCHW)",
                         "plain_flax": "NHWC"}}

    def images(layout):
        def make(rng):
            shape = (bs, 3, hw, hw) if layout == "nchw" else (bs, hw, hw, 3)
            return {"input": rng.standard_normal(shape, np.float32), "target": rng.integers(0, nc, (bs,), np.int32)}
        return make

    def bridged(conv_layout: str):
        def build():
            module, source = seeded_torch(lambda: torch_resnet(r, env.args.cpu_smoke))
            t0 = time.perf_counter()
            # Only training is timed, at one batch size: the train graph alone (modes=(True,)) and a static batch
            # dimension, which exports several times faster than a symbolic one
            bm = torch_bridge.from_torch(module.train(), (torch.zeros(bs, 3, hw, hw),), dynamic_batch=False,
                                         modes=(True,), conv_layout=conv_layout)
            setup.setdefault("convert_s", {})[conv_layout] = round(time.perf_counter() - t0, 3)
            setup.update(torch_model=source, bridge={"dynamic_batch": False, "modes": "train graph only",
                                                     "params": len(bm.params), "buffers": len(bm.buffers)})
            return trainer_side(env, ComposerClassifier(steps_only(bm), num_classes=nc), DecoupledSGDW(**sgd),
                                images("nchw"))
        return build

    def plain_flax():
        module = init_module(lambda: resnet50(**model_kw))
        return PlainFlaxSide(env, module, DecoupledSGDW(**sgd), images("nhwc"))

    return {"unit": "images/s", "items_per_step": bs, "flops_per_item": None if flops is None else 3 * flops,
            "flops_source": flops_source, "setup": setup,
            "specs": [SideSpec("bridged", bridged("NHWC"), info={"conv_layout": "NHWC"}),
                      SideSpec("bridged_nchw", bridged("NCHW"), info={"conv_layout": "NCHW"}),
                      SideSpec("plain_flax", plain_flax)]}


SECTION_BUILDERS = {"resnet50": resnet_section, "gpt2": gpt_section, "bridged_resnet50": bridged_section}


# ------------------------------------------------------------------------------------------------ running a section
def warm_up(env: Env, spec: SideSpec, rec: dict):
    """Build the side, run its first step alone (compile), then the rest of the warm-up. Returns the side, or
    None with the reason recorded in ``rec`` (skipped, or failed and no fallback left)."""
    remaining = env.deadline - time.perf_counter()
    if spec.expensive and remaining < env.args.compile_reserve_s:
        rec.update(status="skipped", reason=f"budget: {remaining:.0f} s left in this section, "
                                            f"< --compile-reserve-s {env.args.compile_reserve_s:.0f}")
        return None
    try:
        log(f"  {spec.name}: build")
        t0 = time.perf_counter()
        side = spec.build()
        rec["build_s"] = round(time.perf_counter() - t0, 3)
        log(f"  {spec.name}: first step (compile)")
        rec["first_step_s"] = round(side.run(1), 3)
        rec["warmup_s"] = round(side.run(env.args.warmup - 1), 3) if env.args.warmup > 1 else 0.0
        rec.update(spec.info, status="ok", memory=side.memory())
        if hasattr(side, "forward_dtypes"):  # the JAX sides: what their convolutions and matmuls ran in
            rec["matmul_operand_dtypes"] = side.forward_dtypes()
        if hasattr(side, "compiled_memory"):  # the Trainer sides: XLA's memory analysis of their step
            rec["compiled_step_bytes"] = side.compiled_memory()
        return side
    except Skip as e:
        rec.update(status="skipped", reason=str(e))
        return None
    except Exception as e:  # noqa: BLE001 - one side's failure is a result, not the end of the suite
        log(f"  {spec.name}: FAILED {error_text(e, 300)}")
        rec.update(status="error", error=error_text(e), traceback=traceback.format_exc(limit=6)[-3000:])
    if spec.fallback is None:
        return None
    # out of the except block, so the failed side (and its device memory) is released before the retry
    failed = {**spec.info, "error": rec["error"]}
    rec.clear()
    rec["first_attempt"] = failed
    log(f"  {spec.name}: trying again with {spec.fallback.info}")
    return warm_up(env, spec.fallback, rec)


def warm_all(env: Env, specs: list[SideSpec], section: dict, checkpoint: Callable[[dict], None]) -> dict:
    """Warm the sides up in order; returns the ones that are ready, by name."""
    ready = {}
    for spec in specs:
        side = warm_up(env, spec, section["sides"].setdefault(spec.name, {}))
        if side is not None:
            ready[spec.name] = side
        checkpoint(section)
    return ready


def time_rounds(env: Env, live: dict, section: dict, checkpoint: Callable[[dict], None]) -> None:
    """Interleaved rounds (A, B, C, A, B, C, ...) of ``--steps`` steps over the live sides; each side's record
    gets this call's rounds (replacing earlier ones) and is rewritten after every round. A side that fails
    leaves the rotation with its error."""
    times: dict = {k: [] for k in live}
    for r in range(env.args.rounds):
        for name, side in list(live.items()):
            try:
                times[name].append(side.run(env.args.steps))
            except Exception as e:  # noqa: BLE001
                section["sides"][name].update(status="error", error=f"round {r}: {error_text(e)}")
                del live[name]
        for name in live:
            summarize_side(section["sides"][name], times[name], section["items_per_step"], env.args.steps,
                           section["flops_per_item"], section["peak_flops_per_s"])
        log(f"  round {r + 1}/{env.args.rounds} done")
        checkpoint(section)


def summarize_side(rec: dict, secs: list[float], items_per_step: int, steps: int, flops_per_item, peak) -> None:
    rates = [items_per_step * steps / s for s in secs]
    med = statistics.median(rates)
    rec["items_per_s"] = [round(x, 1) for x in rates]
    rec["median_items_per_s"] = round(med, 1)
    rec["ms_per_step"] = round(1000 * items_per_step / med, 3)
    rec["mfu"] = round(med * flops_per_item / peak, 4) if flops_per_item and peak else None


def section_ratios(name: str, sides: dict) -> dict:
    med = {k: v.get("median_items_per_s") for k, v in sides.items()}

    def ratio(a: str, b: str):
        return round(med[a] / med[b], 4) if med.get(a) and med.get(b) else None

    if name == "bridged_resnet50":
        return {"bridged_over_plain_flax": ratio("bridged", "plain_flax"),
                "bridged_nchw_over_plain_flax": ratio("bridged_nchw", "plain_flax")}
    return {"jaxcomposer_over_torch_compile": ratio("jaxcomposer", "torch_compile"),
            "jaxcomposer_over_torch_eager": ratio("jaxcomposer", "torch_eager"),
            "torch_compile_over_torch_eager": ratio("torch_compile", "torch_eager")}


def goal_record(name: str, section: dict) -> dict:
    goal = GOALS[name]
    if "ratio" in goal:
        value = section.get("ratios", {}).get(goal["ratio"])
        what = f"{goal['ratio']} >= {goal['target']} (bridge_speed.py's goal for the bridge)"
    else:
        value = section.get("sides", {}).get(goal["side"], {}).get("median_items_per_s")
        what = f"{goal['side']} median {goal['unit']} >= {goal['target']:,.0f}"
    return {"goal": what, "target": goal["target"], "value": value,
            "pass": bool(value is not None and value >= goal["target"])}


def run_section(env: Env, name: str, checkpoint: Callable[[dict], None]) -> dict:
    """Warm the cheap sides up and time them in interleaved rounds; then, time allowing, warm the expensive ones
    (torch.compile) and time every side again, all together, in fresh interleaved rounds. The first figures are
    thus on record before a long compile starts (a section killed for time keeps them). Calls ``checkpoint``
    with the section so far after every side and round."""
    log(f"section {name}")
    section: dict = {"sides": {}}
    try:
        plan = SECTION_BUILDERS[name](env)
    except Exception as e:  # noqa: BLE001
        section.update(error=error_text(e), traceback=traceback.format_exc(limit=6)[-3000:])
        section["goal"] = goal_record(name, section)
        checkpoint(section)
        return section
    specs = plan.pop("specs")
    peak, peak_source = peak_flops(env.jax_device, env.args.peak_tflops)
    section.update(plan, peak_flops_per_s=peak, peak_source=peak_source)
    live = warm_all(env, [s for s in specs if not s.expensive], section, checkpoint)
    time_rounds(env, live, section, checkpoint)
    added = warm_all(env, [s for s in specs if s.expensive], section, checkpoint)
    if added:
        live.update(added)
        time_rounds(env, live, section, checkpoint)
    for side_name, side in live.items():
        rec = section["sides"][side_name]
        try:
            rec["final_loss"] = round(side.last_loss, 5)
            rec["memory"] = side.memory() or rec.get("memory")
        except Exception as e:  # noqa: BLE001
            rec.update(status="error", error=f"reading the final loss: {error_text(e)}")
    section["ratios"] = section_ratios(name, section["sides"])
    section["goal"] = goal_record(name, section)
    checkpoint(section)
    return section


def cross_section_ratios(sections: dict) -> dict:
    """The bridge against our native model in the same Trainer (section resnet50), when both ran."""
    bridged = sections.get("bridged_resnet50", {}).get("sides", {}).get("bridged", {}).get("median_items_per_s")
    native = sections.get("resnet50", {}).get("sides", {}).get("jaxcomposer", {}).get("median_items_per_s")
    return {"bridged_over_native_trainer": round(bridged / native, 4) if bridged and native else None}


# ------------------------------------------------------------------------------------------------ processes
def run_in_process(args: argparse.Namespace, names: list[str], write: Callable[[dict, dict], None],
                   started: float) -> dict:
    """Run the sections here; ``write(machine, sections)`` after every step of progress. The budget counts from
    ``started`` (so a child's includes its imports)."""
    if not args.cpu_smoke:  # read when JAX starts its GPU backend (a smoke run leaves its host process alone)
        os.environ.setdefault("XLA_PYTHON_CLIENT_PREALLOCATE", "false")  # torch shares the device
        if args.xla_flags:
            os.environ["XLA_FLAGS"] = f"{os.environ.get('XLA_FLAGS', '')} {args.xla_flags}".strip()
    import jax
    # JAX's backend (and its CUDA libraries) first, torch second: should the two wheels carry different cuDNN
    # builds, JAX's load-time version check sees its own
    device = jax.devices("cpu")[0] if args.cpu_smoke else jax.devices()[0]
    if not args.cpu_smoke and not is_gpu(device):
        raise SystemExit(f"{NAME}: no GPU ({jax.default_backend()} backend); the full suite needs one "
                         "(use --cpu-smoke to check the script)")
    import torch
    torch_device = torch.device("cuda" if is_gpu(device) and torch.cuda.is_available() else "cpu")
    if torch_device.type == "cuda":
        torch.backends.cudnn.benchmark = True  # fixed shapes: let cuDNN pick its fastest kernels, as users do
    if is_gpu(device) and torch_device.type != "cuda":
        raise SystemExit(f"{NAME}: JAX sees a GPU but torch {torch.__version__} has no CUDA")

    from common import machine_facts
    machine = machine_facts(jax_device_kind=getattr(device, "device_kind", None), torch_device=str(torch_device),
                            torch_cuda=torch.version.cuda, torch_cudnn=torch.backends.cudnn.version(),
                            torchvision=_version("torchvision"), xla_flags=os.environ.get("XLA_FLAGS", ""))
    env = Env(args, device, torch_device, deadline=started + args.budget_s)
    sections: dict = {}

    def checkpoint(name):
        def save(section):
            sections[name] = section
            write(machine, sections)
        return save

    for name in names:
        run_section(env, name, checkpoint(name))
        if torch_device.type == "cuda":
            torch.cuda.empty_cache()  # the next section's torch sides start from a clean cache
    return sections


def _version(dist: str) -> str | None:
    from importlib import metadata
    try:
        return metadata.version(dist)
    except metadata.PackageNotFoundError:
        return None


def child_command(args: argparse.Namespace, name: str, out: Path, budget_s: float) -> list[str]:
    """This script, for one section, in-process, with the parent's options (``--flag=value``: an XLA flag value
    starts with ``--`` itself)."""
    cmd = [sys.executable, str(Path(__file__).resolve()), "--no-isolate", f"--sections={name}", f"--out={out}",
           f"--budget-s={budget_s:.0f}"]
    for flag in ("steps", "rounds", "warmup", "compile_reserve_s", "attention", "precision", "peak_tflops",
                 "resnet_batch", "gpt_batch", "xla_flags"):
        value = getattr(args, flag)
        if value not in (None, ""):
            cmd.append(f"--{flag.replace('_', '-')}={value}")
    return cmd + [f"--{flag.replace('_', '-')}" for flag in ("no_torch_compile", "cpu_smoke") if getattr(args, flag)]


def run_child(args: argparse.Namespace, name: str, timeout: float) -> tuple[dict, dict | None]:
    """One section in a child process (a crash or a hang there costs that section only), killed with its process
    group after ``timeout``. Returns (section, machine facts or None)."""
    with tempfile.TemporaryDirectory(prefix=f"{NAME}-") as tmp:
        out = Path(tmp) / f"{name}.json"
        # the child keeps 15 s of its time for its exit, so that its own deadline comes before the kill
        rc, why, tail = run_killable(child_command(args, name, out, max(timeout - 15, 1)), timeout, name)
        result = json.loads(out.read_text()) if out.exists() else {}
    section = result.get("sections", {}).get(name, {"sides": {}})
    if rc != 0 or why:
        last = next((line.strip() for line in reversed(tail) if line.strip()), "")
        section["child"] = {"returncode": rc, "why": why or "exited with an error",
                            "stderr_tail": "".join(tail)[-3000:]}
        section.setdefault("error", why or f"child exited with {rc}: {last[:300]}")
        section["goal"] = goal_record(name, section)
    return section, result.get("machine")


def run_killable(cmd: list[str], timeout: float, name: str) -> tuple[int, str | None, list[str]]:
    """Run ``cmd`` relaying its stderr live; kill its whole process group after ``timeout``. Returns (return
    code, why it was killed or None, its last stderr lines)."""
    log(f"section {name}: child process, timeout {timeout:.0f} s")
    proc = subprocess.Popen(cmd, cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
                            start_new_session=True)
    tail: collections.deque = collections.deque(maxlen=40)

    def relay():  # the child's progress, live, and its last lines for the record
        for line in proc.stderr:
            sys.stderr.write(line)
            tail.append(line)

    reader = threading.Thread(target=relay, daemon=True)
    reader.start()
    try:
        rc, why = proc.wait(timeout=timeout), None
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)  # the child and its torch.compile workers
        rc, why = proc.wait(), f"timed out after {timeout:.0f} s (its share of --budget-s) and was killed"
    reader.join(timeout=5)
    return rc, why, list(tail)


def run_isolated(args: argparse.Namespace, names: list[str], write: Callable[[dict, dict], None],
                 started: float) -> dict:
    """Each section in its own child process, with its share of the time left."""
    deadline = started + args.budget_s
    sections, machine = {}, None
    for i, name in enumerate(names):
        left = deadline - time.perf_counter()
        share = SECTION_SHARE[name] / sum(SECTION_SHARE[n] for n in names[i:])
        if left < 30:
            sections[name] = {"sides": {}, "error": f"budget: {left:.0f} s left, section not started"}
            sections[name]["goal"] = goal_record(name, sections[name])
            continue
        sections[name], facts = run_child(args, name, left * share)
        machine = machine or facts
        write(machine or host_facts(), sections)
    return sections


def missing_modules() -> list[str]:
    missing = []
    for mod in REQUIRED_MODULES:
        try:
            found = importlib.util.find_spec(mod) is not None
        except ModuleNotFoundError:  # a dotted name whose parent is missing
            found = False
        if not found:
            missing.append(mod)
    return missing


# ------------------------------------------------------------------------------------------------ report
def fmt(x, spec: str, none: str = "-") -> str:
    return none if x is None else format(x, spec)


def print_table(out: dict, path: Path) -> None:
    machine = out.get("machine") or {}
    print(f"\n{NAME}: {machine.get('jax_device_kind') or machine.get('platform', '?')}, precision "
          f"{out['setup']['precision']}, {out['setup']['rounds']} rounds x {out['setup']['steps']} steps"
          f"{'  [SMOKE: numbers mean nothing]' if out['smoke'] else ''}")
    print(f"{'section':<17} {'side':<14} {'items/s':>12} {'unit':<5} {'ms/step':>9} {'MFU':>6} {'peak GiB':>9} "
          f"{'loss':>8} {'compile s':>9}  notes")
    for name, sec in out["sections"].items():
        unit = {"images/s": "img/s", "tokens/s": "tok/s"}.get(sec.get("unit"), "")
        for i, (side, rec) in enumerate(sec.get("sides", {}).items()):
            label = name if i == 0 else ""
            if rec.get("status") != "ok":
                print(f"{label:<17} {side:<14} {rec.get('status', '?')}: "
                      f"{(rec.get('reason') or rec.get('error') or '')[:90]}")
                continue
            note = f"attention={rec['attention_impl']}" if "attention_impl" in rec else ""
            if "first_attempt" in rec:
                note += " (after a failed first attempt)"
            wide = (rec.get("matmul_operand_dtypes") or {}).get("float32", 0)
            if wide and out["setup"]["precision"] == "bf16":
                note += f" {wide} float32 matmul operands"
            print(f"{label:<17} {side:<14} {fmt(rec.get('median_items_per_s'), ',.1f'):>12} {unit:<5} "
                  f"{fmt(rec.get('ms_per_step'), '.2f'):>9} {fmt(rec.get('mfu'), '.1%'):>6} "
                  f"{fmt((rec.get('memory') or {}).get('peak_gib'), '.2f'):>9} {fmt(rec.get('final_loss'), '.3f'):>8} "
                  f"{fmt(rec.get('first_step_s'), '.1f'):>9}  {note}")
        if sec.get("error"):
            print(f"{name:<17} ERROR: {sec['error'][:110]}")
        ratios = "  ".join(f"{k} {fmt(v, '.3f')}" for k, v in sec.get("ratios", {}).items())
        if ratios:
            print(f"{'':<17} {ratios}")
    print("goals:")
    for name, sec in out["sections"].items():
        g = sec.get("goal") or {}
        print(f"  {name:<17} {g.get('goal', '?')}: {fmt(g.get('value'), ',.3f' if 'ratio' in GOALS[name] else ',.0f')}"
              f" -> {'PASS' if g.get('pass') else 'FAIL'}")
    extra = out.get("cross_section_ratios", {})
    if any(v is not None for v in extra.values()):
        print("  " + "  ".join(f"{k} {fmt(v, '.3f')}" for k, v in extra.items()))
    print(f"wall time {out.get('wall_s', 0):.0f} s; results: {path}")


# ------------------------------------------------------------------------------------------------ main
def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--cpu-smoke", action="store_true",
                    help="tiny shapes on the CPU, in this process, torch.compile skipped: checks the script")
    ap.add_argument("--sections", default=",".join(SECTIONS), help=f"comma list of: {', '.join(SECTIONS)}")
    ap.add_argument("--steps", type=int, default=None, help="steps per timed round (30; smoke 2)")
    ap.add_argument("--rounds", type=int, default=None, help="interleaved timed rounds (3; smoke 1)")
    ap.add_argument("--warmup", type=int, default=None, help="untimed steps first, the first alone (5; smoke 1)")
    ap.add_argument("--precision", choices=("bf16", "fp32"), default=None,
                    help="bf16 (AMP) by default; fp32 with --cpu-smoke, which XLA:CPU compiles faster")
    ap.add_argument("--attention", choices=("cudnn", "xla"), default="cudnn",
                    help="our GPT's attention on GPU with bf16 (elsewhere always xla)")
    ap.add_argument("--resnet-batch", type=int, default=None)
    ap.add_argument("--gpt-batch", type=int, default=None)
    ap.add_argument("--no-torch-compile", action="store_true")
    ap.add_argument("--budget-s", type=float, default=None, help="the whole run's time budget (450 s; smoke 300)")
    ap.add_argument("--compile-reserve-s", type=float, default=60.0,
                    help="start a torch.compile side only with this much of the section's time left")
    ap.add_argument("--peak-tflops", type=float, default=None, help="peak for MFU (default: by GPU model)")
    ap.add_argument("--xla-flags", default="", help="appended to XLA_FLAGS before JAX starts")
    ap.add_argument("--isolate", dest="isolate", action="store_true", default=None,
                    help="each section in a child process (the default, except with --cpu-smoke)")
    ap.add_argument("--no-isolate", dest="isolate", action="store_false")
    ap.add_argument("--out", default=None, help=f"default: benchmarks/results/{NAME}[.smoke].json")
    args = ap.parse_args(argv)

    smoke = args.cpu_smoke
    defaults = {"steps": 2 if smoke else 30, "rounds": 1 if smoke else 3, "warmup": 1 if smoke else 5,
                "precision": "fp32" if smoke else "bf16",
                "budget_s": 300.0 if smoke else 450.0, "isolate": not smoke}
    for key, value in defaults.items():
        if getattr(args, key) is None:
            setattr(args, key, value)
    names = [s.strip() for s in args.sections.split(",") if s.strip()]
    if not names or any(n not in SECTIONS for n in names):
        ap.error(f"--sections: a comma list of {', '.join(SECTIONS)}")
    if args.steps < 1 or args.rounds < 1 or args.warmup < 1:
        ap.error("--steps, --rounds and --warmup must be >= 1")
    path = results_path(NAME, smoke, args.out)
    missing = missing_modules()
    if missing:
        print(f"{NAME}: missing Python modules: {', '.join(missing)}. Carry their wheels and install them offline "
              "first (this script's docstring: `make gpu-wheels` here, then pip install --no-index .whl/*.whl there).",
              file=sys.stderr)
        return 2

    t0 = time.perf_counter()
    out = {"benchmark": NAME, "smoke": smoke, "goals": GOALS, "anchors_h200_bf16": ANCHORS_H200,
           "setup": {"precision": args.precision, "steps": args.steps, "rounds": args.rounds, "warmup": args.warmup,
                     "budget_s": args.budget_s, "isolated_sections": args.isolate, "shapes": shapes(smoke),
                     "data": "synthetic batches put on the device before timing (2 per side, cycled)",
                     "sync": "no per-step host read (the Trainer checks the step before last for non-finite "
                             "values); each round ends synced"},
           "machine": None, "sections": {}}

    def write(machine: dict, sections: dict) -> None:
        out.update(machine=machine, sections=dict(sections), cross_section_ratios=cross_section_ratios(sections),
                   wall_s=round(time.perf_counter() - t0, 1))
        write_json(path, out)

    sections = (run_isolated if args.isolate else run_in_process)(args, names, write, t0)
    write(out["machine"] or host_facts(), sections)
    print_table(out, path)
    return 0


if __name__ == "__main__":
    sys.exit(main())
