"""Peak resident memory (RSS) of ``jaxcomposer fit configs/quickstart.yaml``, against a 3 GiB budget.

The run is a child process; its peak RSS is read two ways and the larger is reported: polling
``/proc/<pid>/status`` (``VmHWM``, the kernel's high-water mark, and ``VmRSS``) while it runs, and
``resource.getrusage(RUSAGE_CHILDREN).ru_maxrss`` after it ends. The run directory is a temporary folder
(``--set run_dir=...``) unless ``--run-dir`` is given.

Run:  .venv/bin/python benchmarks/peak_memory.py             (the full quickstart run, ~minutes)
      .venv/bin/python benchmarks/peak_memory.py --smoke     (5 batches, 1 eval batch)
"""
from __future__ import annotations

import argparse
import json
import os
import resource
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from common import ROOT, host_facts, results_path, write_json  # benchmarks/common.py

NAME = "peak_memory"
BUDGET_GIB = 3.0
GIB = 1024 ** 3


def machine_facts() -> dict:
    """The host's facts and its total memory; JAX is not imported here, only in the measured child."""
    mem_total = None
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemTotal:"):
                mem_total = round(int(line.split()[1]) * 1024 / GIB, 2)
    except OSError:
        pass
    return host_facts(mem_total_gib=mem_total)


def read_status(pid: int) -> dict[str, int]:
    """VmHWM / VmRSS in bytes from /proc/<pid>/status ({} once the process is gone)."""
    out = {}
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            key, _, rest = line.partition(":")
            if key in ("VmHWM", "VmRSS"):
                out[key] = int(rest.split()[0]) * 1024  # kB
    except (OSError, ValueError, IndexError):
        return {}
    return out


def command(config: str) -> list[str]:
    script = Path(sys.executable).parent / "jaxcomposer"
    if script.is_file() and os.access(script, os.X_OK):
        return [str(script), "fit", config]
    return [sys.executable, "-m", "jaxcomposer.cli", "fit", config]


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--config", default="configs/quickstart.yaml")
    ap.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE",
                    help="extra overrides passed on to `jaxcomposer fit --set` (repeatable)")
    ap.add_argument("--run-dir", default=None, help="run_dir for the child (default: a temporary folder)")
    ap.add_argument("--interval", type=float, default=0.05, help="seconds between /proc polls")
    ap.add_argument("--smoke", action="store_true", help="5 batches and 1 eval batch: checks the script")
    ap.add_argument("--out", default=None, help=f"default: benchmarks/results/{NAME}[.smoke].json")
    args = ap.parse_args(argv)
    args.out = results_path(NAME, args.smoke, args.out)

    tmp = tempfile.mkdtemp(prefix="jaxcomposer-peakmem-")
    run_dir = args.run_dir or tmp
    overrides = [f"run_dir={run_dir}", "progress_bar=false"]
    if args.smoke:
        overrides += ["max_duration=5ba", "train_subset_num_batches=5", "eval_subset_num_batches=1"]
    overrides += args.overrides
    cmd = command(args.config)
    for o in overrides:
        cmd += ["--set", o]

    log_path, out_path = Path(tmp) / "child.stderr.log", Path(tmp) / "child.stdout.log"
    peak_hwm = peak_rss = samples = 0
    t0 = time.perf_counter()
    with open(log_path, "wb") as log, open(out_path, "wb") as out:
        # Both streams go to files (a pipe nobody reads could fill up and stall the child). Poll until it exits.
        child = subprocess.Popen(cmd, cwd=ROOT, stdout=out, stderr=log)
        while child.poll() is None:
            st = read_status(child.pid)
            if st:
                samples += 1
                peak_hwm = max(peak_hwm, st.get("VmHWM", 0))
                peak_rss = max(peak_rss, st.get("VmRSS", 0))
            time.sleep(args.interval)
    wall = time.perf_counter() - t0
    ru_maxrss = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss * 1024  # kB on Linux
    stderr_tail = log_path.read_text(errors="replace")[-3000:]
    stdout = out_path.read_text(errors="replace")

    summary = None
    start = stdout.rfind("\n{")
    start = 0 if stdout.startswith("{") and start < 0 else start
    if start >= 0:
        try:
            summary = json.loads(stdout[start:])
        except json.JSONDecodeError:
            summary = None
    peak = max(peak_hwm, ru_maxrss)
    result = {"benchmark": NAME, "smoke": args.smoke, "machine": machine_facts(),
              "command": " ".join(cmd), "returncode": child.returncode, "wall_s": round(wall, 2),
              "peak_rss_gib": round(peak / GIB, 3), "budget_gib": BUDGET_GIB,
              "within_budget": child.returncode == 0 and peak / GIB <= BUDGET_GIB,
              "measurements": {"proc_VmHWM_gib": round(peak_hwm / GIB, 3),
                               "proc_max_VmRSS_sampled_gib": round(peak_rss / GIB, 3),
                               "getrusage_children_ru_maxrss_gib": round(ru_maxrss / GIB, 3),
                               "proc_samples": samples, "poll_interval_s": args.interval},
              "child_summary": summary}
    if child.returncode != 0:
        result["child_stderr_tail"] = stderr_tail
    write_json(args.out, result)
    if args.run_dir is None:
        shutil.rmtree(tmp, ignore_errors=True)

    if child.returncode != 0:
        print(stderr_tail, file=sys.stderr)
    print(f"\n{NAME}: {' '.join(cmd[1:])}{'  [SMOKE]' if args.smoke else ''}")
    print(f"{'measure':<34} {'GiB':>8}")
    print(f"{'/proc VmHWM (polled)':<34} {peak_hwm / GIB:>8.3f}")
    print(f"{'/proc VmRSS max of samples':<34} {peak_rss / GIB:>8.3f}")
    print(f"{'getrusage(CHILDREN).ru_maxrss':<34} {ru_maxrss / GIB:>8.3f}")
    print(f"{'peak RSS (reported)':<34} {peak / GIB:>8.3f}   budget {BUDGET_GIB:.1f} GiB: "
          f"{'OK' if result['within_budget'] else 'OVER' if child.returncode == 0 else 'run FAILED'}")
    print(f"{'wall s':<34} {wall:>8.1f}   exit code {child.returncode}")
    if summary:
        print(f"child metrics: {summary.get('metrics')}")
    print(f"results: {args.out}")
    return 0 if child.returncode == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
