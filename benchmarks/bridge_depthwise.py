"""A bridged MobileNetV2-style CNN (inverted residual blocks: 1x1 expand, 3x3 depthwise, 1x1 project) trained on
CIFAR-sized batches, side by side in one process (interleaved rounds, medians), with each of the bridge's
convolution lowerings and against torch eager:

- ``bridged_onednn``: the default on CPU, every float32 2-D convolution on oneDNN (``torch_bridge.kernels``);
- ``bridged_taps``: without the oneDNN kernels (as on a machine without a C++ compiler): depthwise convolutions as
  shifted slices times per-channel taps, the others on XLA;
- ``bridged_xla_grouped``: XLA's convolutions only (``feature_group_count=C`` for the depthwise ones), what the
  bridge did first.

The other lowerings are reached by switching their applicability tests off while the step is traced.

Usage: python benchmarks/bridge_depthwise.py [--smoke] [--rounds N] [--steps N]
Writes benchmarks/results/bridge_depthwise.json; prints a table last.
"""
from __future__ import annotations

import argparse
import time

import jax
import jax.numpy as jnp
import numpy as np
import optax
import torch
from torch import nn

from common import machine_facts, results_path, write_json  # benchmarks/common.py
import torch_bridge
from torch_bridge.ops import nn as bridge_nn


class InvertedResidual(nn.Module):
    def __init__(self, cin: int, cout: int, stride: int, expand: int = 6):
        super().__init__()
        hidden = cin * expand
        self.use_res = stride == 1 and cin == cout
        self.block = nn.Sequential(
            nn.Conv2d(cin, hidden, 1, bias=False), nn.BatchNorm2d(hidden), nn.ReLU6(),
            nn.Conv2d(hidden, hidden, 3, stride, 1, groups=hidden, bias=False), nn.BatchNorm2d(hidden), nn.ReLU6(),
            nn.Conv2d(hidden, cout, 1, bias=False), nn.BatchNorm2d(cout))

    def forward(self, x):
        y = self.block(x)
        return x + y if self.use_res else y


class MobileNetV2Small(nn.Module):
    """MobileNetV2's block structure at CIFAR scale (32 px, widths 16-64, depthwise layers of 96-384 channels)."""

    def __init__(self, num_classes: int = 10):
        super().__init__()
        cfg = [(16, 24, 1), (24, 24, 1), (24, 32, 2), (32, 32, 1), (32, 64, 2), (64, 64, 1)]
        self.stem = nn.Sequential(nn.Conv2d(3, 16, 3, 1, 1, bias=False), nn.BatchNorm2d(16), nn.ReLU6())
        self.blocks = nn.Sequential(*[InvertedResidual(a, b, s) for a, b, s in cfg])
        self.head = nn.Linear(64, num_classes)

    def forward(self, x):
        return self.head(self.blocks(self.stem(x)).mean((2, 3)))


LOWERINGS = ("onednn", "taps", "xla_grouped")


def jax_step(bm, lowering: str):
    opt = optax.sgd(0.05, momentum=0.9)

    def loss_fn(params, buffers, key, x, y):
        out, new_buffers = bm.apply(params, buffers, key, x, train=True)
        return optax.softmax_cross_entropy_with_integer_labels(out, y).mean(), new_buffers

    @jax.jit
    def step(params, buffers, opt_state, key, x, y):
        (loss, buffers), grads = jax.value_and_grad(loss_fn, has_aux=True)(params, buffers, key, x, y)
        updates, opt_state = opt.update(grads, opt_state, params)
        return optax.apply_updates(params, updates), buffers, opt_state, loss

    switches = {"onednn": (bridge_nn.kernels, "available"), "taps": (bridge_nn, "_depthwise_by_taps_applies")}
    off = list(switches.values())[:LOWERINGS.index(lowering)]  # the lowerings tried before this one
    state = {"params": bm.params, "buffers": bm.buffers, "opt": opt.init(bm.params)}

    def run(x, y, key):
        originals = [getattr(obj, name) for obj, name in off]
        for obj, name in off:  # only read while tracing (the first call)
            setattr(obj, name, lambda *a: False)
        try:
            state["params"], state["buffers"], state["opt"], loss = step(state["params"], state["buffers"],
                                                                         state["opt"], key, x, y)
        finally:
            for (obj, name), original in zip(off, originals):
                setattr(obj, name, original)
        return loss

    return run


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--smoke", action="store_true")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--steps", type=int, default=5)
    ap.add_argument("--batch", type=int, default=32)
    ap.add_argument("--out", default=None)
    args = ap.parse_args()
    rounds, steps, batch = (1, 2, 8) if args.smoke else (args.rounds, args.steps, args.batch)
    torch.manual_seed(0)
    rng = np.random.default_rng(0)
    x = rng.standard_normal((batch, 3, 32, 32), dtype=np.float32)
    y = rng.integers(0, 10, batch).astype(np.int32)
    module = MobileNetV2Small()
    bm = torch_bridge.from_torch(module, (torch.from_numpy(x),), dynamic_batch=True)
    xj, yj = jnp.asarray(x), jnp.asarray(y)
    sides = {f"bridged_{lowering}": jax_step(bm, lowering) for lowering in LOWERINGS}
    tmodule = MobileNetV2Small().train()
    topt = torch.optim.SGD(tmodule.parameters(), lr=0.05, momentum=0.9)
    tx, ty = torch.from_numpy(x), torch.from_numpy(y).long()

    def torch_run():
        topt.zero_grad(set_to_none=True)
        loss = torch.nn.functional.cross_entropy(tmodule(tx), ty)
        loss.backward()
        topt.step()
        return loss

    compile_s = {}
    for name, run in sides.items():
        t0 = time.perf_counter()
        jax.block_until_ready(run(xj, yj, jax.random.key(0)))
        compile_s[name] = round(time.perf_counter() - t0, 2)
    torch_run()
    timings = {name: [] for name in [*sides, "torch_eager"]}
    for r in range(rounds):
        for name, run in sides.items():
            t0 = time.perf_counter()
            for i in range(steps):
                loss = run(xj, yj, jax.random.key(i))
            jax.block_until_ready(loss)
            timings[name].append((time.perf_counter() - t0) / steps * 1e3)
        t0 = time.perf_counter()
        for _ in range(steps):
            torch_run()
        timings["torch_eager"].append((time.perf_counter() - t0) / steps * 1e3)
    med = {k: round(float(np.median(v)), 2) for k, v in timings.items()}
    result = {"benchmark": "bridge_depthwise", "smoke": args.smoke, "machine": machine_facts(),
              "setup": {"model": "MobileNetV2Small (6 inverted residual blocks, expand 6, 32 px, widths 16-64)",
                        "batch": batch, "steps_per_round": steps, "rounds": rounds, "torch_threads":
                            torch.get_num_threads(), "optimizer": "SGD momentum 0.9, cross-entropy"},
              "compile_s": compile_s, "ms_per_step": {k: [round(t, 2) for t in v] for k, v in timings.items()},
              "median_ms_per_step": med,
              "speedup_onednn_over_taps": round(med["bridged_taps"] / med["bridged_onednn"], 2),
              "speedup_taps_over_xla_grouped": round(med["bridged_xla_grouped"] / med["bridged_taps"], 2),
              "bridged_onednn_over_torch_eager_speed": round(med["torch_eager"] / med["bridged_onednn"], 2)}
    out = results_path("bridge_depthwise", args.smoke, args.out)
    write_json(out, result, indent=1)
    print(f"\n{'side':<24}{'ms/step (median)':>18}{'compile s':>11}")
    for k, v in med.items():
        print(f"{k:<24}{v:>18}{compile_s.get(k, '-'):>11}")
    print(f"oneDNN vs taps: {result['speedup_onednn_over_taps']}x; taps vs XLA grouped: "
          f"{result['speedup_taps_over_xla_grouped']}x; bridged (oneDNN) speed / torch eager: "
          f"{result['bridged_onednn_over_torch_eager_speed']}")
    print(f"results: {out}")


if __name__ == "__main__":
    main()
