"""Where one training step's time goes: XLA's per-kernel CPU profile of a config's workload step (default the
ResNet-8 one; ``--config`` takes any ``convnet`` or ``resnet_cifar`` config), native (NHWC) and bridged
(``torch_bridge.from_torch`` of its torch mirror, NCHW), beside torch's profiler on the same step in eager PyTorch.

The step is the plain one the speed goals are about: forward in train mode (BatchNorm batch statistics), softmax
cross-entropy, backward, SGD with Nesterov momentum; batch ``--batch-size`` of random 28x28x1 images, the
ResNet-8 workload (``configs/resnet8_fashion_mnist.yaml``: width 16, stride-2 stem). No loader, no Trainer: what
is left is the compiled step itself, so the numbers say which kernels to work on.

- JAX sides: ``jax.profiler`` trace of ``--steps`` steps after warm-up; XLA's thunk events are summed per kernel
  (over both threads, so a sum can exceed the wall time) and grouped: ``conv`` (YNNPACK/Eigen/oneDNN convolution kernels, ``ynn_fusion``/``convolution*``/``ffi_call``), ``transpose``
  (``transpose_copy_fusion``: layout changes, mostly activations put batch-minor for the weight gradients),
  ``elementwise+reduce`` (every other fusion: BatchNorm, ReLU, the loss, the optimizer), ``other``.
- torch: ``torch.profiler`` self CPU time per ATen op over the same number of steps (``torch.set_num_threads``
  ``--torch-threads``, channels-last), in a child process (``torch_in_child``), grouped alike (``conv``: convolution and its backward; ``batch_norm``;
  everything else).

Also reported: wall ms per step of each side, timed apart from the profile (median of ``--rounds``), so the group
sums can be compared with the step they come from. Writes ``benchmarks/results/step_profile.json`` (``--smoke``:
``step_profile.smoke.json``, 3 steps); prints a table last.

Run:  .venv/bin/python benchmarks/step_profile.py [--batch-size 128] [--steps 20] [--top 12]
"""
from __future__ import annotations

import argparse
import glob
import gzip
import json
import re
import statistics
import sys
import tempfile
import time
from collections import defaultdict
from pathlib import Path

from common import (ROOT, load_benchmark_config, machine_facts, results_path, threads_as_fit_sets, torch_mirror,
                    write_json)

NAME = "step_profile"
# Host-side bookkeeping events in a JAX trace, not kernels
_NOT_KERNELS = ("$", "ThunkExecutor", "PjitFunction", "CommonPjRt", "ParseArguments", "shard_args",
                "DevicePut", "PythonRefManager", "H2D", "D2H")


def xla_group(kernel: str) -> str:
    # ffi_call: the oneDNN convolutions of conv_impl='onednn' (torch_bridge.kernels), XLA custom calls
    if kernel.startswith(("ynn_fusion", "xnn_fusion", "onednn", "convolution", "conv_general_dilated", "ffi_call")):
        return "conv"
    if kernel.startswith("transpose"):
        return "transpose"
    if "fusion" in kernel or kernel.startswith(("wrapped_", "reduce", "copy", "add", "multiply", "select")):
        return "elementwise+reduce"
    return "other"


def torch_group(op: str) -> str:
    if "conv" in op:
        return "conv"
    if "batch_norm" in op:
        return "batch_norm"
    return "other"


def summarize(per_kernel_ms: dict[str, float], group, top: int) -> dict:
    groups = defaultdict(float)
    for k, v in per_kernel_ms.items():
        groups[group(k)] += v
    ranked = sorted(per_kernel_ms.items(), key=lambda kv: -kv[1])[:top]
    return {"total_ms": round(sum(per_kernel_ms.values()), 2),
            "groups_ms": {k: round(v, 2) for k, v in sorted(groups.items(), key=lambda kv: -kv[1])},
            "top_ms": [[k, round(v, 3)] for k, v in ranked], "kernels": len(per_kernel_ms)}


# ------------------------------------------------------------------------------------------------------------ JAX
def jax_step(loss_fn, params, state, tx):
    import jax
    import optax

    @jax.jit
    def step(params, state, opt_state, x, y):
        (loss, state), grads = jax.value_and_grad(loss_fn, has_aux=True)(params, state, x, y)
        updates, opt_state = tx.update(grads, opt_state, params)
        return optax.apply_updates(params, updates), state, opt_state, loss

    return step, tx.init(params)


def native_side(model_name: str, model_kwargs: dict, lr: float, momentum: float):
    import jax
    import optax
    from flax import nnx
    from jaxcomposer.models import BUILDERS

    graphdef, params, state = nnx.split(BUILDERS[model_name](**model_kwargs, rngs=nnx.Rngs(0)), nnx.Param, ...)

    def loss_fn(params, state, x, y):
        live = nnx.merge(graphdef, params, state, copy=True)
        logits = live(x, train=True)
        return optax.softmax_cross_entropy_with_integer_labels(logits, y).mean(), nnx.split(live, nnx.Param, ...)[2]

    step, opt = jax_step(loss_fn, params, state, optax.sgd(lr, momentum=momentum, nesterov=True))
    return step, [params, state, opt], "NHWC"


def bridged_side(model_name: str, model_kwargs: dict, lr: float, momentum: float, batch_size: int):
    import optax
    import torch
    import torch_bridge

    torch.manual_seed(0)
    bridged = torch_bridge.from_torch(torch_mirror(model_name, model_kwargs), (torch.randn(batch_size, 1, 28, 28),),
                                      modes=(True,))

    def loss_fn(params, buffers, x, y):
        logits, buffers = bridged.apply(params, buffers, None, x, train=True)
        return optax.softmax_cross_entropy_with_integer_labels(logits, y).mean(), buffers

    step, opt = jax_step(loss_fn, bridged.params, bridged.buffers, optax.sgd(lr, momentum=momentum, nesterov=True))
    return step, [bridged.params, bridged.buffers, opt], "NCHW"


def run_jax(step, carry: list, x, y, steps: int, rounds: int, top: int) -> dict:
    import jax
    carry = list(step(*carry, x, y)[:3])
    for _ in range(3):
        carry = list(step(*carry, x, y)[:3])
    jax.block_until_ready(carry)
    wall = []
    for _ in range(rounds):
        t0 = time.perf_counter()
        for _ in range(steps):
            carry = list(step(*carry, x, y)[:3])
        jax.block_until_ready(carry)
        wall.append((time.perf_counter() - t0) / steps * 1e3)
    with tempfile.TemporaryDirectory() as trace_dir:
        with jax.profiler.trace(trace_dir, create_perfetto_trace=True):
            for _ in range(steps):
                carry = list(step(*carry, x, y)[:3])
            jax.block_until_ready(carry)
        trace = json.load(gzip.open(sorted(glob.glob(f"{trace_dir}/**/*.trace.json.gz", recursive=True))[-1]))
    events = trace["traceEvents"] if isinstance(trace, dict) else trace
    per_kernel = defaultdict(float)
    for e in events:
        if e.get("ph") == "X" and not e["name"].startswith(_NOT_KERNELS):
            per_kernel[e["name"]] += e.get("dur", 0) / 1e3 / steps
    return {"step_ms_median": round(statistics.median(wall), 2), "step_ms_rounds": [round(w, 2) for w in wall],
            **summarize(per_kernel, xla_group, top)}


# ---------------------------------------------------------------------------------------------------------- torch
def run_torch(model_name: str, model_kwargs: dict, lr: float, momentum: float, batch_size: int, steps: int,
              rounds: int, top: int, threads: int) -> dict:
    import torch
    import torch.nn.functional as F

    torch.set_num_threads(threads)
    torch.manual_seed(0)
    model = torch_mirror(model_name, model_kwargs).to(memory_format=torch.channels_last)
    opt = torch.optim.SGD(model.parameters(), lr=lr, momentum=momentum, nesterov=True)
    x = torch.rand(batch_size, 1, 28, 28).to(memory_format=torch.channels_last)
    y = torch.randint(0, 10, (batch_size,))

    def step():
        opt.zero_grad(set_to_none=True)
        F.cross_entropy(model(x), y).backward()
        opt.step()

    for _ in range(3):
        step()
    wall = []
    for _ in range(rounds):
        t0 = time.perf_counter()
        for _ in range(steps):
            step()
        wall.append((time.perf_counter() - t0) / steps * 1e3)
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
        for _ in range(steps):
            step()
    per_op = {e.key: e.self_cpu_time_total / 1e3 / steps for e in prof.key_averages() if e.self_cpu_time_total > 0}
    return {"step_ms_median": round(statistics.median(wall), 2), "step_ms_rounds": [round(w, 2) for w in wall],
            "threads": threads, **summarize(per_op, torch_group, top)}


def torch_in_child(args, model_name: str, model_kwargs: dict, lr: float, momentum: float, batch_size: int) -> dict:
    """The torch side in a child process: in a process where JAX has run the oneDNN convolutions, torch's OpenMP
    team shares the machine with the kernels' own team, and on a machine with few cores libgomp then sleeps at every
    barrier (torch_bridge/kernels/onednn_conv.cc): measured in-process, torch would look slower than it is."""
    import subprocess
    cmd = [sys.executable, __file__, "--torch-worker", "--config", str(args.config), "--steps", str(args.steps),
           "--rounds", str(args.rounds), "--top", str(args.top), "--torch-threads", str(args.torch_threads)]
    payload = json.dumps({"model_name": model_name, "model_kwargs": model_kwargs, "lr": lr, "momentum": momentum,
                          "batch_size": batch_size})
    out = subprocess.run(cmd, input=payload, capture_output=True, text=True, check=False)
    if out.returncode != 0:
        raise SystemExit(f"the torch side failed:\n{out.stderr[-3000:]}")
    return json.loads(out.stdout.strip().splitlines()[-1])


# ----------------------------------------------------------------------------------------------------------- main
def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--config", default=str(ROOT / "configs" / "resnet8_fashion_mnist.yaml"))
    ap.add_argument("--batch-size", type=int, default=None, help="default: the config's")
    ap.add_argument("--steps", type=int, default=20, help="steps per timed round and in the profile")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--top", type=int, default=12, help="kernels listed per side")
    ap.add_argument("--torch-threads", type=int, default=2)
    ap.add_argument("--smoke", action="store_true", help="3 steps, 1 round: checks the script, numbers mean nothing")
    ap.add_argument("--out", default=None)
    ap.add_argument("--torch-worker", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.smoke:
        args.steps, args.rounds = 3, 1
    if str(ROOT) not in sys.path:  # torch_bridge lives at the repository root
        sys.path.insert(0, str(ROOT))
    if args.torch_worker:  # the torch side, in a process of its own (see torch_in_child)
        kw = json.loads(sys.stdin.read())
        print(json.dumps(run_torch(kw["model_name"], kw["model_kwargs"], kw["lr"], kw["momentum"], kw["batch_size"],
                                   args.steps, args.rounds, args.top, args.torch_threads)))
        return 0
    import jax.numpy as jnp
    import numpy as np

    q = load_benchmark_config(args.config)
    threads_note = threads_as_fit_sets(q)
    batch_size = args.batch_size or int(q["batch_size"])
    model_kwargs = {"num_classes": 10, "in_channels": 1, **q["model"]}
    lr, momentum = float(q["optimizer"]["lr"]), float(q["optimizer"].get("momentum", 0.9))
    rng = np.random.default_rng(0)
    x_nhwc = jnp.asarray(rng.random((batch_size, 28, 28, 1), dtype=np.float32))
    y = jnp.asarray(rng.integers(0, 10, batch_size).astype(np.int32))
    sides = {}
    model_name = q["model_name"]
    for name, build in (("native", lambda: native_side(model_name, model_kwargs, lr, momentum)),
                        ("bridged", lambda: bridged_side(model_name, model_kwargs, lr, momentum, batch_size))):
        step, carry, layout = build()
        x = x_nhwc if layout == "NHWC" else x_nhwc.transpose(0, 3, 1, 2)
        sides[name] = {"layout": layout, **run_jax(step, carry, x, y, args.steps, args.rounds, args.top)}
    sides["torch"] = torch_in_child(args, model_name, model_kwargs, lr, momentum, batch_size)
    out = results_path(NAME, args.smoke, args.out)
    write_json(out, {"benchmark": NAME, "smoke": args.smoke, "machine": machine_facts(),
                     "setup": {"config": Path(args.config).name, "xla_cpu_threads": threads_note,
                               "model": {"name": model_name, **model_kwargs},
                               "batch_size": batch_size,
                               "optimizer": f"SGD lr {lr} momentum {momentum} nesterov", "steps": args.steps,
                               "rounds": args.rounds, "torch": "eager, channels-last"},
                     "sides": sides,
                     "ratios": {"native_over_torch_step_ms": round(sides["native"]["step_ms_median"]
                                                                  / sides["torch"]["step_ms_median"], 3),
                                "bridged_over_native_step_ms": round(sides["bridged"]["step_ms_median"]
                                                                     / sides["native"]["step_ms_median"], 3)}})
    for name, side in sides.items():
        print(f"\n{name}: top kernels (ms/step)")
        for kernel, ms in side["top_ms"]:
            print(f"  {ms:8.2f}  {kernel}")
    groups = sorted({g for side in sides.values() for g in side["groups_ms"]})
    print(f"\n{'side':<9}{'step ms':>9}{'profiled':>10}" + "".join(f"{g:>20}" for g in groups))
    for name, side in sides.items():
        print(f"{name:<9}{side['step_ms_median']:>9.2f}{side['total_ms']:>10.2f}"
              + "".join(f"{side['groups_ms'].get(g, 0.0):>20.2f}" for g in groups))
    print(f"results: {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
