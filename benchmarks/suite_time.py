"""The README's test-time line: how long ``make test`` takes, on which CPU, rewritten in place from a run's log.

The line sits between ``<!-- test-time -->`` and ``<!-- /test-time -->`` in README.md; this script is the only
thing that writes it, so the README's figure always comes from a log rather than from hand-copied numbers.

From the log it reads pytest's summary (``4403 passed, 12 skipped in 443.21s``: the tests and pytest's own time),
the xdist worker count from the pytest command line the log shows (``-n 2``), and, when present, the whole
command's wall and CPU time: ``/usr/bin/time -v``'s report, bash's ``time`` (also ``-p``), or the footer this script
writes when it runs the command itself (then measured with ``resource.getrusage(RUSAGE_CHILDREN)``). The machine is
named by its CPU model and ISA class (``/proc/cpuinfo``) and the cores this process may run on.

Run:  .venv/bin/python benchmarks/suite_time.py                      (runs ``make test``, then rewrites README.md)
      .venv/bin/python benchmarks/suite_time.py --from-log make_test.log [--dry-run]
      .venv/bin/python benchmarks/suite_time.py --label '`make test` on a clean clone' -- bash .ci/run
"""
from __future__ import annotations

import argparse
import datetime
import importlib.util
import os
import re
import resource
import subprocess
import sys
import textwrap
import time
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
START, END = "<!-- test-time -->", "<!-- /test-time -->"
FOOTER = "suite_time:"  # the footer line this script appends to a log it writes
OUTCOMES = ("passed", "failed", "skipped", "xfailed", "xpassed", "error", "errors", "deselected", "warnings",
            "warning", "rerun")
COUNTED = ("passed", "failed", "skipped", "xfailed", "xpassed")  # what "N tests" sums

# pytest's last line, with or without -q's missing equals signs: "4403 passed, 2 skipped in 443.21s (0:07:23)"
SUMMARY = re.compile(r"^=*\s*(?P<body>\d+ [a-z]+(?:, \d+ [a-z]+)*) in (?P<secs>[\d.]+)s\b.*?=*\s*$", re.M)
# the worker count: the pytest command line make echoes (-n 2), or xdist's "created: 2/2 workers" under -v
WORKERS = re.compile(r"^[^\n]*\bpytest\b[^\n]*?\s(?:-n\s*|--numprocesses[= ])(?P<n>\d+)\b"
                     r"|created: (?P<created>\d+)/\d+ workers", re.M)
TIME_V_WALL = re.compile(r"Elapsed \(wall clock\) time \(h:mm:ss or m:ss\):\s*(?P<t>[\d:.]+)")
TIME_V_USER = re.compile(r"User time \(seconds\):\s*(?P<t>[\d.]+)")
TIME_V_SYS = re.compile(r"System time \(seconds\):\s*(?P<t>[\d.]+)")
BASH_TIME = re.compile(r"^(?P<what>real|user|sys)\s+(?:(?P<m>\d+)m)?(?P<s>[\d.]+)s?\s*$", re.M)
OWN_FOOTER = re.compile(rf"^{FOOTER} wall (?P<wall>[\d.]+) s, cpu (?P<cpu>[\d.]+) s, cores (?P<cores>\d+), "
                        r"cpu model (?P<model>.*?), date (?P<date>\S+)\s*$", re.M)


@dataclass
class Run:
    """What one run's log says; None where the log does not say it."""
    counts: dict[str, int] = field(default_factory=dict)
    pytest_s: float | None = None
    workers: int | None = None
    wall_s: float | None = None
    cpu_s: float | None = None
    cores: int | None = None
    cpu_model: str | None = None
    date: str | None = None

    @property
    def tests(self) -> int:
        return sum(self.counts.get(k, 0) for k in COUNTED)


def clock_seconds(text: str) -> float:
    """``h:mm:ss``, ``m:ss`` or ``ss`` (fractions allowed) as seconds."""
    seconds = 0.0
    for part in text.split(":"):
        seconds = seconds * 60 + float(part)
    return seconds


def parse_log(text: str) -> Run:
    """The run a ``make test`` / pytest log describes; its last pytest summary counts (an earlier one may be a
    nested pytest's). Raises ``ValueError`` when the log has no pytest summary."""
    summaries = list(SUMMARY.finditer(text))
    if not summaries:
        raise ValueError("no pytest summary ('N passed ... in X s') in the log")
    last = summaries[-1]
    counts = {}
    for item in last["body"].split(", "):
        n, word = item.split(" ", 1)
        if word in OUTCOMES:
            key = {"errors": "error", "warning": "warnings"}.get(word, word)
            counts[key] = counts.get(key, 0) + int(n)
    run = Run(counts=counts, pytest_s=float(last["secs"]))
    if workers := WORKERS.search(text, 0, last.start()):
        run.workers = int(workers["n"] or workers["created"])
    if own := list(OWN_FOOTER.finditer(text)):
        f = own[-1]
        run.wall_s, run.cpu_s, run.cores = float(f["wall"]), float(f["cpu"]), int(f["cores"])
        run.cpu_model, run.date = f["model"], f["date"]
        return run
    if wall := list(TIME_V_WALL.finditer(text)):
        run.wall_s = clock_seconds(wall[-1]["t"])
        user, system = list(TIME_V_USER.finditer(text)), list(TIME_V_SYS.finditer(text))
        if user and system:
            run.cpu_s = float(user[-1]["t"]) + float(system[-1]["t"])
        return run
    bash = {m["what"]: int(m["m"] or 0) * 60 + float(m["s"]) for m in BASH_TIME.finditer(text)}
    if "real" in bash:
        run.wall_s = bash["real"]
        if "user" in bash and "sys" in bash:
            run.cpu_s = bash["user"] + bash["sys"]
    return run


def cpu_model() -> str:
    """The CPU's model name and ISA class from /proc/cpuinfo (``AMD EPYC, AVX-512 with bf16``); the ISA matters
    because the same suite runs several times slower on an AVX2-only CPU (benchmarks/README.md)."""
    spec = importlib.util.spec_from_file_location("_benchmarks_common", Path(__file__).resolve().parent / "common.py")
    common = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(common)
    facts = common.cpu_facts()
    caps = f", capped by {', '.join(f'{k}={v}' for k, v in facts['isa_caps'].items())}" if facts["isa_caps"] else ""
    return f"{facts['model']} ({facts['isa']}{caps})"


def usable_cores() -> int:
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)


def minutes(seconds: float) -> str:
    return f"{seconds / 60:.1f} min"


def format_line(run: Run, label: str = "`make test`") -> str:
    """The README's sentence for ``run``: wall time in bold when known (else pytest's), the counts, the CPU time,
    the date and the machine; failures and errors are named, never hidden."""
    bad = [f"{run.counts[k]:,} {k}" for k in ("failed", "error") if run.counts.get(k)]
    tests = f"{run.tests:,} tests" + "".join(f", {b}" for b in bad)
    if run.workers:
        tests += f", {run.workers} xdist workers"
    if run.wall_s is not None:
        head = f"**{minutes(run.wall_s)}** in all"
        inner = [tests, f"tests {minutes(run.pytest_s)}"]
    else:
        head = f"**{minutes(run.pytest_s)}** of tests"
        inner = [tests]
    if run.cpu_s is not None:
        inner.append(f"{minutes(run.cpu_s)} of CPU")
    machine = f"{run.cores} cores of {run.cpu_model}" if run.cores else run.cpu_model
    return f"{label}: {head} ({'; '.join(inner)}), {run.date}, on {machine}."


def rewrite(readme: str, line: str, width: int = 120) -> str:
    """``readme`` with the text between the test-time markers replaced by ``line``, wrapped at ``width`` between the
    markers on their own lines. Raises ``ValueError`` unless the markers appear exactly once each, in order."""
    if readme.count(START) != 1 or readme.count(END) != 1 or readme.index(START) > readme.index(END):
        raise ValueError(f"README must hold {START} ... {END} once each, in that order")
    head, rest = readme.split(START, 1)
    _, tail = rest.split(END, 1)
    wrapped = textwrap.fill(line, width, break_long_words=False, break_on_hyphens=False)
    return f"{head}{START}\n{wrapped}\n{END}{tail}"


def current_label(readme: str) -> str | None:
    """How the README's test-time line now names what ran (the text before ``: **``), so a rerun keeps it."""
    if START in readme and END in readme:
        if m := re.match(r"\s*(.*?): \*\*", readme.split(START, 1)[1].split(END, 1)[0], re.S):
            return " ".join(m[1].split())
    return None


def run_command(cmd: list[str], log_path: Path) -> str:
    """Runs ``cmd`` from the repository root, its output to stdout and ``log_path``, and appends the footer with the
    wall time and the CPU time of every process it waited for (user + system, ``RUSAGE_CHILDREN``)."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    t0 = time.monotonic()
    with open(log_path, "w") as log:
        proc = subprocess.Popen(cmd, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        for out_line in proc.stdout:
            sys.stdout.write(out_line)
            log.write(out_line)
        proc.wait()
        wall = time.monotonic() - t0
        after = resource.getrusage(resource.RUSAGE_CHILDREN)
        cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
        date = datetime.date.today().isoformat()
        log.write(f"{FOOTER} wall {wall:.1f} s, cpu {cpu:.1f} s, cores {usable_cores()}, cpu model {cpu_model()}, "
                  f"date {date}\n")
    if proc.returncode:
        print(f"{cmd!r} exited with {proc.returncode}; the line names any failures", file=sys.stderr)
    return log_path.read_text()


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--from-log", type=Path, help="parse this log instead of running the command")
    ap.add_argument("--log", type=Path, default=Path("make_test.log"),
                    help="where a run's output is written (default: make_test.log in the current directory)")
    ap.add_argument("--readme", type=Path, default=ROOT / "README.md")
    ap.add_argument("--label", help="how the line names what ran (default: the README line's own, else `make test`)")
    ap.add_argument("--dry-run", action="store_true", help="print the line, leave the README alone")
    ap.add_argument("command", nargs="*", help="the command to run and time (default: make test)")
    args = ap.parse_args(argv)
    if args.from_log and args.command:
        ap.error("--from-log parses a log; a command is run only without it")
    text = args.from_log.read_text() if args.from_log else run_command(args.command or ["make", "test"], args.log)
    try:
        run = parse_log(text)
    except ValueError as e:
        print(f"{args.from_log or args.log}: {e}", file=sys.stderr)
        return 1
    if run.cpu_model is None:  # a log this script did not write: the machine is this one
        run.cores, run.cpu_model = usable_cores(), cpu_model()
        if run.date is None:
            source = args.from_log or args.log
            run.date = datetime.date.fromtimestamp(source.stat().st_mtime).isoformat()
    readme = args.readme.read_text()
    line = format_line(run, args.label or current_label(readme) or "`make test`")
    print(line)
    if not args.dry_run:
        args.readme.write_text(rewrite(readme, line))
        print(f"rewrote {args.readme}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
