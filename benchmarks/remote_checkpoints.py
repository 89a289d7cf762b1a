"""Checkpoints in an object store against local ones, side by side in one run, with moto's S3 server on the loopback
(its own process, so its CPU is not this process's GIL): what asynchronous remote saves cost a training step, and
the upload throughput of the client we use (obstore) against boto3's transfer manager on the same file.

Sides, trained in interleaved rounds (median of per-round ratios): no saving, ``save_folder`` on the local disk,
``save_folder="s3://..."``, each saving every 20 batches and every 100 batches a ~26 MB state (an MLP 64-4096-512-10
with momentum and EMA: orbax's array format). At most one save is in flight: where the upload takes longer than
the batches between two saves, the next save waits for it. A round ends with ``fit`` returning, which waits for the
last upload.
Caveat: the server shares this machine's cores and its disk; a real bucket is remote and slower per request but
costs no local CPU.
Usage: python benchmarks/remote_checkpoints.py [--smoke] [--rounds N]
Writes benchmarks/results/remote_checkpoints.json; prints a table last."""
from __future__ import annotations

import argparse
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

from common import TrainerSide, machine_facts, results_path, write_json

BUCKET = "bench"


def start_server() -> tuple[subprocess.Popen, str]:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    proc = subprocess.Popen([sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(port)],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    endpoint = f"http://127.0.0.1:{port}"
    for _ in range(200):
        try:
            socket.create_connection(("127.0.0.1", port), timeout=0.1).close()
            break
        except OSError:
            time.sleep(0.05)
    os.environ.update(AWS_ACCESS_KEY_ID="bench", AWS_SECRET_ACCESS_KEY="bench", AWS_REGION="us-east-1",
                      AWS_ENDPOINT_URL=endpoint, AWS_ALLOW_HTTP="true", AWS_EC2_METADATA_DISABLED="true")
    boto3_client().create_bucket(Bucket=BUCKET)
    return proc, endpoint


def boto3_client():
    import boto3
    return boto3.client("s3", endpoint_url=os.environ["AWS_ENDPOINT_URL"], region_name="us-east-1")


def upload_throughput(size_mb: int, rounds: int, tmp: Path) -> dict:
    """MB/s of one file's upload: obstore's ``put`` (multipart, concurrent parts; what the store uses) against
    boto3's ``upload_file`` (its transfer manager's defaults), alternating."""
    from jaxcomposer.utils.object_store import RemoteFolder

    path = tmp / "blob.bin"
    path.write_bytes(np.random.default_rng(0).bytes(size_mb << 20))
    remote, client = RemoteFolder(f"s3://{BUCKET}/throughput"), boto3_client()
    times = {"obstore": [], "boto3": []}
    for i in range(rounds):
        t0 = time.perf_counter()
        remote.put_file(f"obstore-{i}", path)
        times["obstore"].append(time.perf_counter() - t0)
        t0 = time.perf_counter()
        client.upload_file(str(path), BUCKET, f"throughput/boto3-{i}")
        times["boto3"].append(time.perf_counter() - t0)
    mb_s = {k: round(size_mb / float(np.median(v)), 1) for k, v in times.items()}
    return {"file_mb": size_mb, "mb_per_s": mb_s, "obstore_over_boto3": round(mb_s["obstore"] / mb_s["boto3"], 2),
            "seconds": {k: [round(x, 3) for x in v] for k, v in times.items()}}


def mlp_side(save_folder=None, every: int = 20) -> TrainerSide:
    from flax import nnx

    from jaxcomposer.algorithms import EMA
    from jaxcomposer.data import ArrayLoader
    from jaxcomposer.models import MLP
    from jaxcomposer.models.tasks import ComposerClassifier
    from jaxcomposer.optim import DecoupledSGDW

    rng = np.random.default_rng(0)
    data = {"input": rng.standard_normal((64 * 16, 64), dtype=np.float32),
            "target": rng.integers(0, 10, 64 * 16).astype(np.int32)}
    task = ComposerClassifier(MLP(64, hidden=(4096, 512), num_classes=10, rngs=nnx.Rngs(0)), num_classes=10)
    return TrainerSide(model=task, train_dataloader=ArrayLoader(data, 64), max_duration="100000ba",
                       optimizers=DecoupledSGDW(lr=0.01, momentum=0.9), algorithms=[EMA(half_life="10ba")],
                       progress_bar=False, seed=0, save_folder=save_folder, save_interval=f"{every}ba",
                       save_num_checkpoints_to_keep=2, run_name="bench")


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--smoke", action="store_true")
    ap.add_argument("--out", default=None)
    ap.add_argument("--rounds", type=int, default=5, help="interleaved rounds of 200 steps per side")
    args = ap.parse_args()
    tmp = Path(tempfile.mkdtemp(prefix="remote-ckpt-"))
    os.environ["JAXCOMPOSER_STAGING_DIR"] = str(tmp / "staging")
    server, endpoint = start_server()
    results = {}
    try:
        results["upload"] = upload_throughput(16 if args.smoke else 128, 1 if args.smoke else 3, tmp)
        steps = 20 if args.smoke else 200
        sides = {"no_saving": mlp_side()}
        for every in (20, 100):
            sides[f"local_every_{every}ba"] = mlp_side(str(tmp / f"local{every}"), every)
            sides[f"s3_every_{every}ba"] = mlp_side(f"s3://{BUCKET}/run{every}", every)
        for side in sides.values():
            side.run(steps)  # compile, warm up, and a first save each
        rounds = {name: [] for name in sides}
        for _ in range(1 if args.smoke else args.rounds):
            for name, side in sides.items():
                rounds[name].append(side.run(steps) / steps * 1e3)
        for side in sides.values():
            side.trainer.close()
        ratio = lambda a, b: round(float(np.median([x / y for x, y in zip(rounds[a], rounds[b])])), 3)  # noqa: E731
        state_mb = sum(p.stat().st_size for p in (tmp / "local20").rglob("*") if p.is_file()) / 2 / 1e6
        results["step_ms"] = {**{k: round(float(np.median(v)), 2) for k, v in rounds.items()},
                              "rounds": {k: [round(x, 2) for x in v] for k, v in rounds.items()},
                              "checkpoint_mb": round(state_mb, 1)}
        results["ratios"] = {
            f"every_{every}ba": {"s3_over_local": ratio(f"s3_every_{every}ba", f"local_every_{every}ba"),
                                 "local_over_no_saving": ratio(f"local_every_{every}ba", "no_saving"),
                                 "s3_over_no_saving": ratio(f"s3_every_{every}ba", "no_saving")}
            for every in (20, 100)}
    finally:
        server.terminate()
        server.wait(timeout=30)
        shutil.rmtree(tmp, ignore_errors=True)
    out = results_path("remote_checkpoints", args.smoke, args.out)
    write_json(out, {"benchmark": "remote_checkpoints", "smoke": args.smoke, "server": "moto (loopback, own process)",
                     "machine": machine_facts(), "results": results}, indent=1)
    up, step = results["upload"], results["step_ms"]
    print(f"\nupload of {up['file_mb']} MB: obstore {up['mb_per_s']['obstore']} MB/s, boto3 {up['mb_per_s']['boto3']} "
          f"MB/s (obstore/boto3 {up['obstore_over_boto3']})")
    print(f"{'side':<20}{'ms/step':>9}")
    for name, ms in step.items():
        if name not in ("rounds", "checkpoint_mb"):
            print(f"{name:<20}{ms:>9}")
    for every, r in results["ratios"].items():
        print(f"saving {every}: s3/local {r['s3_over_local']}, local/none {r['local_over_no_saving']}, s3/none "
              f"{r['s3_over_no_saving']} (checkpoints of {step['checkpoint_mb']} MB, median of per-round ratios)")
    print(f"results: {out}")


if __name__ == "__main__":
    main()
