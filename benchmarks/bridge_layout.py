"""The bridge's two activation layouts on the zoo's CNNs: ``conv_layout='NCHW'`` (torch's) vs ``'NHWC'`` (the
default: activations channels-last between convolutions, ``torch_bridge.channels_last``).

Per model (``bridge_zoo.py``'s builders, inputs and loss; step batch 8, train mode): both layouts bridged from the
same module, each a jitted step (forward, cross-entropy, gradient, plain SGD, new buffers), then ``--rounds``
interleaved rounds (NCHW, NHWC, NHWC, NCHW, ...) of ``--steps`` steps in this one process, each round ending with
``block_until_ready``. Reported: median ms per step per layout, the per-round speed ratios and their median
(NCHW ms / NHWC ms: > 1, the default is faster), and the largest difference of the first step's loss (the two
layouts compute the same function).

Run:  .venv/bin/python benchmarks/bridge_layout.py            (minutes)
      .venv/bin/python benchmarks/bridge_layout.py --smoke    (one model, a few steps)
"""
from __future__ import annotations

import argparse
import statistics
import sys
import time

import jax
import jax.numpy as jnp
import torch

import bridge_zoo as zoo  # benchmarks/bridge_zoo.py
import torch_bridge
from common import machine_facts, results_path, write_json

NAME = "bridge_layout"
MODELS = ("hf_resnet", "hf_convnext", "mobilenet_tiny", "resnext_tiny", "hf_vit")
LAYOUTS = ("NCHW", "NHWC")


def make_step(bm, xs, targets):
    """``run(n) -> ms per step`` of a jitted SGD step of ``bm`` on fixed inputs, and the first step's loss."""
    @jax.jit
    def step(params, buffers, key):
        key, sub = jax.random.split(key)

        def loss(p):
            out, new_buffers = bm.apply(p, buffers, sub, *xs, train=True)
            return zoo.ce_jax(out, targets), new_buffers

        (value, new_buffers), grads = jax.value_and_grad(loss, has_aux=True)(params)
        return jax.tree.map(lambda p, g: p - zoo.LR * g, params, grads), new_buffers, key, value

    state = [bm.params, bm.buffers, jax.random.key(0)]

    def run(n: int) -> float:
        t0 = time.perf_counter()
        for _ in range(n):
            *state[:], value = step(*state)
        jax.block_until_ready(state)
        return (time.perf_counter() - t0) / n * 1e3

    first_loss = float(step(*state)[3])
    return run, first_loss


def measure(name: str, steps: int, rounds: int) -> dict:
    case = zoo.ZOO[name]
    module = zoo.build(case)
    inputs = case.inputs(zoo.STEP_BATCH)
    with torch.no_grad():
        targets = jnp.asarray(zoo.targets_for(tuple(module(*inputs).shape), seed=5).numpy())
    xs = zoo.np_inputs(inputs)
    runs, losses = {}, {}
    for layout in LAYOUTS:
        bm = torch_bridge.from_torch(module, case.inputs(4), dynamic_batch=True, conv_layout=layout)
        runs[layout], losses[layout] = make_step(bm, xs, targets)
        runs[layout](2)  # compile and warm
    ms = {layout: [] for layout in LAYOUTS}
    for r in range(rounds):
        for layout in LAYOUTS if r % 2 == 0 else LAYOUTS[::-1]:
            ms[layout].append(runs[layout](steps))
    ratios = [a / b for a, b in zip(ms["NCHW"], ms["NHWC"])]
    return {"model": name, "ms_per_step": {k: [round(x, 3) for x in v] for k, v in ms.items()},
            "median_ms": {k: round(statistics.median(v), 3) for k, v in ms.items()},
            "speed_ratios_nchw_over_nhwc": [round(x, 4) for x in ratios],
            "median_speed_ratio": round(statistics.median(ratios), 4),
            "first_loss_difference": abs(losses["NCHW"] - losses["NHWC"])}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--models", nargs="*", default=list(MODELS), help=f"subset of bridge_zoo's: {' '.join(MODELS)}")
    ap.add_argument("--steps", type=int, default=10, help="steps per timed round")
    ap.add_argument("--rounds", type=int, default=10)
    ap.add_argument("--smoke", action="store_true", help="one model, 2 rounds of 2 steps")
    ap.add_argument("--out", default=None, help=f"default: benchmarks/results/{NAME}[.smoke].json")
    args = ap.parse_args(argv)
    unknown = [m for m in args.models if m not in zoo.ZOO]
    if unknown:
        ap.error(f"--models: unknown {unknown}; bridge_zoo has {sorted(zoo.ZOO)}")
    if args.smoke:
        args.models, args.steps, args.rounds = args.models[:1], 2, 2
    torch.set_num_threads(2)
    rows = []
    print(f"{'model':<16} {'NCHW ms':>8} {'NHWC ms':>8} {'NCHW/NHWC':>10} {'loss diff':>10}")
    for name in args.models:
        row = measure(name, args.steps, args.rounds)
        rows.append(row)
        print(f"{name:<16} {row['median_ms']['NCHW']:>8.2f} {row['median_ms']['NHWC']:>8.2f} "
              f"{row['median_speed_ratio']:>10.3f} {row['first_loss_difference']:>10.2e}", flush=True)
    path = results_path(NAME, args.smoke, args.out)
    write_json(path, {"benchmark": NAME, "smoke": args.smoke, "machine": machine_facts(),
                      "setup": {"steps_per_round": args.steps, "rounds": args.rounds, "batch": zoo.STEP_BATCH,
                                "order": "interleaved, every other round reversed, one process"},
                      "models": rows,
                      "median_of_medians": round(statistics.median(r["median_speed_ratio"] for r in rows), 4)})
    print(f"results: {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
