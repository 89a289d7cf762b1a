"""Where the GPU suite's Trainer steps spend their time: per-kernel device time of ``gpu_suite.py``'s
``jaxcomposer`` sides (ResNet-50 bs 256, GPT-2 124M 16x1024), and their step rate under XLA flag variants.

Two parts, each section's Trainer side built exactly as ``gpu_suite.py`` builds it (same shapes, optimizer, AMP):

- ``--profile``: in this process, per section: warm up, time ``--rounds`` rounds of ``--steps`` steps, then trace
  ``--trace-steps`` steps with ``jax.profiler`` and read the trace back (``jax.profiler.ProfileData``): device time
  per kernel (a fusion's kernel is named after the fusion), their shares of the busy time, and the idle gaps
  between kernels by length. The optimized HLO of each compiled step goes beside the JSON
  (``gpu_profile_hlo.txt.gz``, one file, not committed) to look the fusions up in.
- ``--variants``: each entry of :data:`VARIANTS` in its own child process (XLA reads ``XLA_FLAGS`` once, at
  start): the same side timed the same way, so each variant's rate compares with its section's ``base``.

The JSON goes to ``--out-dir`` as ``gpu_profile_xla_flag_variants.json`` when ``--variants`` ran, else
``gpu_profile.json``.

On the lent GPU machine, with ``.whl`` carried (see ``gpu_device_run.sh``)::

    python3 benchmarks/gpu_profile.py --profile --variants --out-dir $OUT

Check it on a CPU (tiny shapes, fp32, the host's XLA threads in place of a device; its numbers mean nothing):
``--cpu-smoke`` (``tests/test_gpu_suite.py`` runs it).
"""
from __future__ import annotations

import argparse
import collections
import gzip
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import gpu_suite as suite  # puts the repository root on sys.path
from common import write_json

# name -> (section, XLA flags). Each a lever that XLA exposes for these steps; "base" is the suite's setting.
VARIANTS = {
    "resnet50/base": ("resnet50", ""),
    "resnet50/conv_fusion": ("resnet50", "--xla_gpu_experimental_enable_conv_fusion=true"),
    "resnet50/no_command_buffer": ("resnet50", "--xla_gpu_enable_command_buffer="),
    "gpt2/base": ("gpt2", ""),
    "gpt2/cublas_gemms": ("gpt2", "--xla_gpu_enable_triton_gemm=false"),
    "gpt2/cublaslt": ("gpt2", "--xla_gpu_enable_cublaslt=true"),
    "gpt2/no_command_buffer": ("gpt2", "--xla_gpu_enable_command_buffer="),
}


def log(msg: str) -> None:
    print(f"[gpu_profile +{time.perf_counter() - suite._T0:6.1f}s] {msg}", file=sys.stderr, flush=True)


def suite_args(args: argparse.Namespace) -> argparse.Namespace:
    """The options ``gpu_suite``'s section builders read."""
    return argparse.Namespace(cpu_smoke=args.cpu_smoke, precision="fp32" if args.cpu_smoke else "bf16",
                              attention="cudnn", resnet_batch=None, gpt_batch=None, steps=args.steps,
                              rounds=args.rounds, warmup=args.warmup, compile_reserve_s=60.0, peak_tflops=None)


def build_env(args: argparse.Namespace):
    if not args.cpu_smoke:
        os.environ.setdefault("XLA_PYTHON_CLIENT_PREALLOCATE", "false")
    import jax
    import torch
    device = jax.devices("cpu")[0] if args.cpu_smoke else jax.devices()[0]
    torch_device = torch.device("cuda" if suite.is_gpu(device) and torch.cuda.is_available() else "cpu")
    return suite.Env(suite_args(args), device, torch_device, deadline=float("inf"))


def trainer_side(env, section: str):
    """(plan, rec, side): the section's ``jaxcomposer`` side, warmed up (``rec`` holds its build and compile)."""
    plan = suite.SECTION_BUILDERS[section](env)
    spec = next(s for s in plan.pop("specs") if s.name == "jaxcomposer")
    rec: dict = {}
    side = suite.warm_up(env, spec, rec)
    if side is None:
        raise RuntimeError(f"{section}: the jaxcomposer side did not build: {rec.get('error') or rec}")
    return plan, rec, side


def time_side(env, plan: dict, rec: dict, side) -> dict:
    secs = [side.run(env.args.steps) for _ in range(env.args.rounds)]
    peak, _ = suite.peak_flops(env.jax_device, None)
    suite.summarize_side(rec, secs, plan["items_per_step"], env.args.steps, plan["flops_per_item"], peak)
    return rec


def device_plane(profile):
    """The first accelerator plane of a trace, else the host CPU plane (a CPU run's XLA ops live there)."""
    planes = list(profile.planes)
    for plane in planes:
        if plane.name.startswith("/device:GPU") or plane.name.startswith("/device:TPU"):
            return plane
    return next(p for p in planes if p.name == "/host:CPU")


def summarize_trace(path: Path, wall_ns: float, steps: int, top: int) -> dict:
    """Per line of the device plane: events and busy time; for the op and kernel lines, the top entries by
    total time (per step, and as a share of the traced wall time)."""
    from jax.profiler import ProfileData
    plane = device_plane(ProfileData.from_file(str(path)))
    lines = {}
    for line in plane.lines:
        totals: dict = collections.defaultdict(lambda: [0, 0.0])
        events = sorted(((e.start_ns, e.duration_ns, e.name) for e in line.events))
        for _, duration, name in events:
            t = totals[name]
            t[0] += 1
            t[1] += duration
        busy = sum(t[1] for t in totals.values())
        ranked = sorted(totals.items(), key=lambda kv: -kv[1][1])
        lines[line.name] = {
            "events": sum(t[0] for t in totals.values()), "busy_ms_per_step": round(busy / steps / 1e6, 3),
            "busy_share_of_wall": round(busy / wall_ns, 4) if wall_ns else None,
            "top": [{"name": name[:200], "count_per_step": round(n / steps, 2),
                     "ms_per_step": round(ns / steps / 1e6, 4),
                     "share_of_busy": round(ns / busy, 4) if busy else None}
                    for name, (n, ns) in ranked[:top]],
            "gaps": idle_gaps(events, steps)}
    return {"plane": plane.name, "wall_ms_per_step": round(wall_ns / steps / 1e6, 3), "lines": lines}


def trace_steps_of(side, steps: int, top: int) -> dict:
    import jax
    with tempfile.TemporaryDirectory(prefix="gpu_profile-") as tmp:
        jax.profiler.start_trace(tmp)
        t0 = time.perf_counter_ns()
        side.run(steps)
        wall = time.perf_counter_ns() - t0
        jax.profiler.stop_trace()
        return summarize_trace(next(Path(tmp).rglob("*.xplane.pb")), wall, steps, top)


def idle_gaps(events: list[tuple], steps: int) -> dict:
    """The device's idle time between consecutive kernels of one stream, per step, by gap length: short gaps are
    launch latency, long ones a device waiting on the host."""
    buckets = {"under_5us": [0, 0.0], "5_to_50us": [0, 0.0], "over_50us": [0, 0.0]}
    largest = []
    for (s0, d0, n0), (s1, _, n1) in zip(events, events[1:]):
        gap = s1 - (s0 + d0)
        if gap <= 0:
            continue
        key = "under_5us" if gap < 5e3 else "5_to_50us" if gap < 5e4 else "over_50us"
        buckets[key][0] += 1
        buckets[key][1] += gap
        largest.append((gap, n0[:60], n1[:60]))
    largest.sort(reverse=True)
    return {**{k: {"count_per_step": round(n / steps, 1), "ms_per_step": round(ns / steps / 1e6, 3)}
               for k, (n, ns) in buckets.items()},
            "largest_us": [{"us": round(g / 1e3, 1), "after": a, "before": b} for g, a, b in largest[:8]]}


def profile_section(env, section: str, trace_steps: int, top: int) -> tuple[dict, str]:
    """(the section's record, the optimized HLO of its compiled step)."""
    log(f"profile {section}: build and compile")
    plan, rec, side = trainer_side(env, section)
    time_side(env, plan, rec, side)
    log(f"profile {section}: {rec['median_items_per_s']:,.1f} {plan['unit']}, tracing {trace_steps} steps")
    hlo = side.trainer.compiled_train_step(side.pool[0]).as_text()
    try:
        summary = trace_steps_of(side, trace_steps, top)
    except Exception as e:  # noqa: BLE001 - no profiler on the machine: the timing still counts
        summary = {"error": suite.error_text(e)}
    return {"timing": rec, "unit": plan["unit"], "trace_steps": trace_steps, "trace": summary}, hlo


def run_variant(args: argparse.Namespace, name: str) -> dict:
    """One variant in a child process with its XLA flags; returns its record."""
    section, flags = VARIANTS[name]
    env_vars = {**os.environ, "XLA_FLAGS": f"{os.environ.get('XLA_FLAGS', '')} {flags}".strip()}
    with tempfile.TemporaryDirectory(prefix="gpu_profile-") as tmp:
        out = Path(tmp) / "variant.json"
        cmd = [sys.executable, str(Path(__file__).resolve()), f"--child={name}", f"--child-out={out}",
               f"--steps={args.steps}", f"--rounds={args.rounds}", f"--warmup={args.warmup}"]
        cmd += ["--cpu-smoke"] if args.cpu_smoke else []
        t0 = time.perf_counter()
        try:
            proc = subprocess.run(cmd, env=env_vars, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
                                  timeout=args.variant_timeout_s)
            rc, err = proc.returncode, proc.stderr
        except subprocess.TimeoutExpired as e:
            rc, err = "timeout", (e.stderr or b"").decode() if isinstance(e.stderr, bytes) else (e.stderr or "")
        rec = json.loads(out.read_text()) if out.exists() else {}
    rec.update(section=section, xla_flags=flags, wall_s=round(time.perf_counter() - t0, 1))
    if rc != 0:
        rec.update(status="error", returncode=rc, stderr_tail=err[-2000:])
    return rec


def child(args: argparse.Namespace) -> int:
    env = build_env(args)
    section, _ = VARIANTS[args.child]
    plan, rec, side = trainer_side(env, section)
    write_json(Path(args.child_out), {**time_side(env, plan, rec, side), "unit": plan["unit"]})
    return 0


def print_table(out: dict) -> None:
    for section, prof in out.get("profiles", {}).items():
        if "error" in prof:
            print(f"{section}: profile failed: {prof['error'][:300]}")
            continue
        tr = prof["trace"]
        if "error" in tr:
            rate = prof["timing"]["median_items_per_s"]
            print(f"{section}: {rate:,.0f} {prof['unit']}; trace failed: {tr['error'][:300]}")
            continue
        print(f"\n{section}: {prof['timing']['median_items_per_s']:,.0f} {prof['unit']}, "
              f"{tr['wall_ms_per_step']} ms/step traced ({tr['plane']})")
        for line, info in tr["lines"].items():
            gaps = " ".join(f"{k} {v['ms_per_step']} ms" for k, v in info["gaps"].items() if k != "largest_us")
            print(f"  line {line[:40]:40s} busy {info['busy_ms_per_step']:8.3f} ms/step "
                  f"({info['busy_share_of_wall'] or 0:.1%} of wall), {info['events']} events; idle gaps: {gaps}")
        ops = tr["lines"].get("XLA Ops") or max(tr["lines"].values(), key=lambda i: i["busy_ms_per_step"])
        for entry in ops["top"][:15]:
            print(f"    {entry['ms_per_step']:8.3f} ms {entry['share_of_busy']:6.1%}  x{entry['count_per_step']:<6g} "
                  f"{entry['name'][:90]}")
    if out.get("variants"):
        print("\nvariant                      rate          ms/step  vs base  flags")
        for name, rec in out["variants"].items():
            base = out["variants"].get(f"{rec['section']}/base", {}).get("median_items_per_s")
            rate = rec.get("median_items_per_s")
            ratio = f"{rate / base:.3f}" if rate and base else "-"
            shown = f"{rate:12,.0f}  {rec['ms_per_step']:8.2f}" if rate else f"{rec.get('status', '?'):>22s}"
            print(f"{name:28s} {shown}  {ratio:>7s}  {rec['xla_flags']}")


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--profile", action="store_true", help="trace the sections' Trainer steps in this process")
    ap.add_argument("--variants", action="store_true", help="time every VARIANTS entry, each in a child process")
    ap.add_argument("--sections", default="resnet50,gpt2")
    ap.add_argument("--only", default="", help="comma list of VARIANTS names (default: those of --sections)")
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--warmup", type=int, default=5)
    ap.add_argument("--trace-steps", type=int, default=5)
    ap.add_argument("--top", type=int, default=60)
    ap.add_argument("--variant-timeout-s", type=float, default=120.0)
    ap.add_argument("--cpu-smoke", action="store_true")
    ap.add_argument("--out-dir", default=str(suite.HERE / "results"))
    ap.add_argument("--child", default=None, help=argparse.SUPPRESS)
    ap.add_argument("--child-out", default=None, help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.child:
        return child(args)
    sections = [s for s in args.sections.split(",") if s]
    unknown = [s for s in sections if s not in ("resnet50", "gpt2")]
    names = [n for n in args.only.split(",") if n] or [n for n, (s, _) in VARIANTS.items() if s in sections]
    if unknown or any(n not in VARIANTS for n in names):
        ap.error(f"--sections: resnet50 and/or gpt2; --only: names from {list(VARIANTS)}")
    if not (args.profile or args.variants):
        ap.error("say --profile, --variants or both")
    out_dir = Path(args.out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    # named for what it measures: the flag variants' timings, or the profile alone
    name = "gpu_profile_xla_flag_variants" if args.variants else "gpu_profile"
    path = out_dir / f"{name}{'.smoke' if args.cpu_smoke else ''}.json"
    out: dict = {"benchmark": "gpu_profile", "smoke": args.cpu_smoke, "steps": args.steps, "rounds": args.rounds,
                 "profiles": {}, "variants": {}}
    if args.profile:
        env = build_env(args)
        from common import machine_facts
        out["machine"] = machine_facts(jax_device_kind=getattr(env.jax_device, "device_kind", None))
        hlo = {}
        for section in sections:
            try:
                out["profiles"][section], hlo[section] = profile_section(env, section, args.trace_steps, args.top)
            except Exception as e:  # noqa: BLE001 - one section's failure is recorded, the other still runs
                out["profiles"][section] = {"error": suite.error_text(e)}
            write_json(path, out)
        # one file for all sections (the device machine returns at most 8 files); git-ignored, ~0.3 MB a section
        with gzip.open(out_dir / "gpu_profile_hlo.txt.gz", "wt") as f:
            f.writelines(f"==== {section}: the compiled train step\n{text}\n" for section, text in hlo.items())
    if args.variants:  # in children: XLA reads its flags once per process
        for name in names:
            log(f"variant {name}")
            out["variants"][name] = run_variant(args, name)
            write_json(path, out)
    print_table(out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
