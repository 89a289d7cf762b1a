"""How long a checkpoint save and restore take, for the ResNet-8 workload model (in both formats: ``.npz`` items, the
default for small states, and orbax's array format) and a ~100M-parameter state, and what asynchronous saving
every 20 batches costs a training step: two ResNet-8 Trainers, one saving and one not, trained in interleaved
rounds (median of the per-round ratios, so the machine's drift hits both sides alike).
Usage: python benchmarks/checkpoint_timing.py [--smoke] [--rounds N]
Writes benchmarks/results/checkpoint_timing.json; prints a table last."""
from __future__ import annotations

import argparse
import shutil
import tempfile
import time
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np

from common import TrainerSide, machine_facts, results_path, write_json
from jaxcomposer.core.state import TrainState
from jaxcomposer.core.time import Timestamp
from jaxcomposer.data import ArrayLoader
from jaxcomposer.models import ResNetCIFAR
from jaxcomposer.models.tasks import ComposerClassifier
from jaxcomposer.optim import DecoupledSGDW
from jaxcomposer.trainer.checkpoint import CheckpointStore
from flax import nnx


def time_store(state, folder: Path, **store_kwargs) -> dict:
    """save() returning (host copy done) / committed + checksummed / restore with verification."""
    store = CheckpointStore(folder, **store_kwargs)
    t0 = time.perf_counter()
    store.save(1, state, Timestamp())
    t_call = time.perf_counter() - t0
    store.wait()  # async write + sha256 of every file + atomic commit
    t_done = time.perf_counter() - t0
    t0 = time.perf_counter()
    restored, _, _ = store.restore(1, state)
    jax.block_until_ready(restored)
    t_restore = time.perf_counter() - t0
    store.close()
    size = sum(p.stat().st_size for p in folder.rglob("*") if p.is_file())
    return {"save_call_s": round(t_call, 3), "save_committed_s": round(t_done, 3),
            "restore_verified_s": round(t_restore, 3), "bytes_on_disk": size}


def resnet8_side(save_folder=None) -> TrainerSide:
    rng = np.random.default_rng(0)
    data = {"input": rng.standard_normal((128 * 8, 28, 28, 1), dtype=np.float32),
            "target": rng.integers(0, 10, 128 * 8).astype(np.int32)}
    task = ComposerClassifier(ResNetCIFAR(depth=8, width=16, num_classes=10, in_channels=1, stem_stride=2,
                                          rngs=nnx.Rngs(0)))
    return TrainerSide(model=task, train_dataloader=ArrayLoader(data, 128), max_duration="100000ba",
                       optimizers=DecoupledSGDW(lr=0.1, momentum=0.9), progress_bar=False, seed=0,
                       save_folder=save_folder, save_interval="20ba", devices=jax.devices()[:1])


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--smoke", action="store_true")
    ap.add_argument("--out", default=None)
    ap.add_argument("--rounds", type=int, default=5, help="interleaved rounds of 200 steps per side")
    args = ap.parse_args()
    tmp = Path(tempfile.mkdtemp(prefix="ckpt-timing-"))
    results = {}
    try:
        quick = resnet8_side().trainer
        results["quickstart_state"] = time_store(quick.state.train_state, tmp / "quick")
        results["quickstart_state_orbax_format"] = time_store(quick.state.train_state, tmp / "quick_orbax",
                                                              small_state_bytes=0)
        n = 1_000_000 if args.smoke else 100_000_000  # params; SGD momentum doubles the state
        keys = jax.random.split(jax.random.PRNGKey(0), 20)  # random values: constants would compress to nothing
        big = TrainState(step=jnp.zeros((), jnp.int32), model_state={}, extras={}, key=jax.random.PRNGKey(0),
                         params={f"w{i}": jax.random.normal(keys[i], (n // 10,)) for i in range(10)},
                         opt_state={f"w{i}": jax.random.normal(keys[10 + i], (n // 10,)) for i in range(10)})
        results[f"{n // 1_000_000}M_params_plus_momentum"] = time_store(big, tmp / "big")
        del big
        steps = 20 if args.smoke else 200
        plain, saving = resnet8_side(), resnet8_side(tmp / "train")
        for side in (plain, saving):
            side.run(steps)  # compile and warm up
        rounds = {"no_saving": [], "async_save_every_20ba": []}
        for _ in range(1 if args.smoke else args.rounds):
            rounds["no_saving"].append(plain.run(steps) / steps * 1e3)
            rounds["async_save_every_20ba"].append(saving.run(steps) / steps * 1e3)
        saving.trainer.close()
        ratios = [s / p for p, s in zip(rounds["no_saving"], rounds["async_save_every_20ba"])]
        results["step_ms"] = {**{k: round(float(np.median(v)), 2) for k, v in rounds.items()},
                              "rounds": {k: [round(x, 2) for x in v] for k, v in rounds.items()},
                              "overhead_per_step_pct": round(100 * (float(np.median(ratios)) - 1), 1)}
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    out = results_path("checkpoint_timing", args.smoke, args.out)
    write_json(out, {"benchmark": "checkpoint_timing", "smoke": args.smoke, "machine": machine_facts(),
                     "results": results}, indent=1)
    print(f"\n{'state':<30}{'save() s':>10}{'committed s':>13}{'restore s':>11}{'MB':>9}")
    for k, v in results.items():
        if k != "step_ms":
            print(f"{k:<30}{v['save_call_s']:>10}{v['save_committed_s']:>13}{v['restore_verified_s']:>11}"
                  f"{v['bytes_on_disk'] / 1e6:>9.1f}")
    step = results["step_ms"]
    print(f"step ms (median of {len(step['rounds']['no_saving'])} interleaved rounds): no saving "
          f"{step['no_saving']}, async save every 20 batches {step['async_save_every_20ba']}: "
          f"{step['overhead_per_step_pct']:+}% per step")
    print(f"results: {out}")


if __name__ == "__main__":
    main()
