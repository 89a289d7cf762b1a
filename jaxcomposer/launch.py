"""``jaxcomposer launch -n N fit CONFIG``: N local processes of one JAX multi-controller run (Composer's launcher).

Two halves meet through three environment variables:

- the launcher (:func:`launch`) starts the processes, each with ``JAXCOMPOSER_COORDINATOR_ADDRESS``,
  ``JAXCOMPOSER_NUM_PROCESSES`` and ``JAXCOMPOSER_PROCESS_ID``, watches them, and stops them all when one is lost or
  when the launcher itself is asked to stop (SIGTERM / SIGINT, forwarded to every process);
- each worker calls :func:`initialize_from_env` before its first JAX computation, which joins the run
  (``jax.distributed.initialize``), or joins a SLURM / Open MPI job that JAX detects by itself, or does nothing in a
  plain single-process run.

What JAX does to signals once ``jax.distributed.initialize`` ran (measured with jax 0.10.2 on CPU): its preemption
notifier replaces the C-level SIGTERM handler with one that only records the signal (``signal.getsignal`` still
reports ``SIG_DFL``), so a worker that installs no Python SIGTERM handler *afterwards* no longer dies on SIGTERM. The
launcher does not rely on it: after ``grace_s`` it SIGKILLs whatever is left. A worker that exits (any code) while
its peers keep running then waits in JAX's shutdown barrier until they exit too, or ``shutdown_timeout_seconds``
(300 s) pass, after which every process aborts (SIGABRT): the launcher notices a failure only when a process
actually ends.

Only the standard library at import time; jax is imported inside :func:`initialize_from_env`, so the CLI parses
``launch`` without loading it.
"""
from __future__ import annotations

import argparse
import contextlib
import ctypes
import os
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Mapping, Sequence

from jaxcomposer.errors import ConfigurationError

ENV_COORDINATOR = "JAXCOMPOSER_COORDINATOR_ADDRESS"
ENV_NUM_PROCESSES = "JAXCOMPOSER_NUM_PROCESSES"
ENV_PROCESS_ID = "JAXCOMPOSER_PROCESS_ID"
ENV_HEARTBEAT_TIMEOUT = "JAXCOMPOSER_HEARTBEAT_TIMEOUT"
# =auto: let jax.distributed.initialize() find the job by itself (TPU pods, Kubernetes, and anything else JAX
# detects beyond the SLURM and Open MPI cases recognised here)
ENV_AUTO = "JAXCOMPOSER_DISTRIBUTED"
_REQUIRED_ENV = (ENV_COORDINATOR, ENV_NUM_PROCESSES, ENV_PROCESS_ID)

DEFAULT_HEARTBEAT_TIMEOUT_S = 100  # jax.distributed.initialize's own default
DEFAULT_INITIALIZATION_TIMEOUT_S = 300  # likewise
POLL_INTERVAL_S = 0.1
DEVICE_COUNT_FLAG = "--xla_force_host_platform_device_count"
FORWARDED_SIGNALS = (signal.SIGTERM, signal.SIGINT)
_TAIL_BYTES = 4096
_TAIL_LINES = 20
_PR_SET_PDEATHSIG = 1  # linux/prctl.h


# --------------------------------------------------------------------------------------------------- worker side


@dataclass(frozen=True)
class DistributedSettings:
    """What one worker passes to ``jax.distributed.initialize``, read and checked from the launcher's variables."""
    coordinator_address: str
    num_processes: int
    process_id: int
    heartbeat_timeout_s: int


def _int_value(name: str, value, minimum: int) -> int:
    """An integer argument or variable >= minimum; ``bool`` is refused so ``True`` cannot pass for 1."""
    if isinstance(value, str):
        try:
            value = int(value.strip())
        except ValueError:
            raise ConfigurationError(f"{name}={value!r} is not an integer; expected an integer >= {minimum}") from None
    if isinstance(value, bool) or not isinstance(value, int):
        raise ConfigurationError(f"{name}={value!r} is a {type(value).__name__}; expected an integer >= {minimum}")
    if value < minimum:
        raise ConfigurationError(f"{name}={value} is too small; expected an integer >= {minimum}")
    return value


def _check_address(name: str, address: str) -> str:
    """``host:port`` with a port in 1..65535: JAX would otherwise fail deep inside gRPC with a vaguer message."""
    host, sep, port = address.rpartition(":")
    if not sep or not host:
        raise ConfigurationError(f"{name}={address!r} is not an address; expected HOST:PORT, e.g. 127.0.0.1:12345")
    if _int_value(f"{name} (port)", port, 1) > 65535:
        raise ConfigurationError(f"{name}={address!r} has port {port}; expected a port in 1..65535")
    return address


def settings_from_env(environ: Mapping[str, str]) -> DistributedSettings | None:
    """The launcher's settings, or None when none of its variables is set. Some set and not others is an error: a
    worker silently training alone while its peers wait for it would hang the run until the init timeout."""
    present = [name for name in _REQUIRED_ENV if environ.get(name, "").strip()]
    if not present:
        return None
    missing = [name for name in _REQUIRED_ENV if name not in present]
    if missing:
        raise ConfigurationError(f"{', '.join(missing)} not set while {', '.join(present)} is: expected all three "
                                 "(jaxcomposer launch sets them together) or none (a single-process run)")
    num_processes = _int_value(ENV_NUM_PROCESSES, environ[ENV_NUM_PROCESSES], 1)
    process_id = _int_value(ENV_PROCESS_ID, environ[ENV_PROCESS_ID], 0)
    if process_id >= num_processes:
        raise ConfigurationError(f"{ENV_PROCESS_ID}={process_id} with {ENV_NUM_PROCESSES}={num_processes}; expected a "
                                 f"process id in 0..{num_processes - 1}")
    heartbeat = environ.get(ENV_HEARTBEAT_TIMEOUT, "").strip()
    heartbeat_s = _int_value(ENV_HEARTBEAT_TIMEOUT, heartbeat, 1) if heartbeat else DEFAULT_HEARTBEAT_TIMEOUT_S
    return DistributedSettings(coordinator_address=_check_address(ENV_COORDINATOR, environ[ENV_COORDINATOR].strip()),
                               num_processes=num_processes, process_id=process_id, heartbeat_timeout_s=heartbeat_s)


def _task_count(name: str, environ: Mapping[str, str]) -> int:
    return _int_value(name, environ[name], 0) if environ.get(name, "").strip() else 0


def detected_cluster(environ: Mapping[str, str]) -> str | None:
    """``"slurm"`` or ``"openmpi"`` when this process is one task of several in a job that
    ``jax.distributed.initialize()`` detects by itself, else None. One task (``srun -n 1``, a plain ``sbatch``
    shell outside any step) is a single-process run, as it would be without a cluster."""
    # SLURM: JAX reads these five; SLURM_STEP_NODELIST only exists inside a step (srun), not in the batch shell
    slurm = ("SLURM_JOB_ID", "SLURM_STEP_NODELIST", "SLURM_NTASKS", "SLURM_PROCID", "SLURM_LOCALID")
    if all(environ.get(v) for v in slurm) and _task_count("SLURM_NTASKS", environ) > 1:
        return "slurm"
    if _task_count("OMPI_COMM_WORLD_SIZE", environ) > 1:
        if not environ.get("OMPI_MCA_orte_hnp_uri") and not environ.get("JAX_COORDINATOR_ADDRESS"):
            raise ConfigurationError(
                f"OMPI_COMM_WORLD_SIZE={environ['OMPI_COMM_WORLD_SIZE']} but OMPI_MCA_orte_hnp_uri is unset (Open MPI "
                ">= 5 no longer sets it), so JAX cannot find the coordinator: set JAX_COORDINATOR_ADDRESS=HOST:PORT of "
                "rank 0, or start the processes with jaxcomposer launch")
        return "openmpi"
    return None


def initialize_from_env(environ: Mapping[str, str] = os.environ, *,
                        initialization_timeout_s: int = DEFAULT_INITIALIZATION_TIMEOUT_S) -> bool:
    """Join the multi-process run this process belongs to, if any; True when JAX now runs distributed.

    Must run before the first JAX computation (JAX refuses to initialize afterwards). Three cases:

    - started by ``jaxcomposer launch``: its variables give the coordinator, process count and id;
    - one task of several under SLURM (``srun``) or Open MPI (``mpirun``), or ``JAXCOMPOSER_DISTRIBUTED=auto`` (TPU
      pods, Kubernetes): ``jax.distributed.initialize()`` without arguments, JAX detects the rest (from
      ``os.environ``, whatever ``environ`` says);
    - otherwise a single-process run: nothing to do, False.

    Calling it again is harmless (True once initialized), so a library and its caller may both call it. After it
    returned True, install any SIGTERM handler afterwards (see the module docstring).
    """
    import jax  # here, not at module level: `jaxcomposer launch` itself never needs JAX

    if jax.distributed.is_initialized():
        return True
    settings = settings_from_env(environ)
    if settings is not None:
        jax.distributed.initialize(coordinator_address=settings.coordinator_address,
                                   num_processes=settings.num_processes, process_id=settings.process_id,
                                   heartbeat_timeout_seconds=settings.heartbeat_timeout_s,
                                   initialization_timeout=initialization_timeout_s)
        return True
    if environ.get(ENV_AUTO, "").strip().lower() in ("1", "true", "auto") or detected_cluster(environ) is not None:
        jax.distributed.initialize(initialization_timeout=initialization_timeout_s)
        return True
    return False


# ------------------------------------------------------------------------------------------------- launcher side


@dataclass(frozen=True)
class LaunchPlan:
    """The checked arguments of one launch: which global process ids run here, and how they find each other."""
    num_processes: int  # on this node
    world_size: int
    node_rank: int
    master_addr: str
    master_port: int | None  # None: pick a free one (single node only)

    @property
    def process_ids(self) -> range:
        return range(self.node_rank * self.num_processes, (self.node_rank + 1) * self.num_processes)


def plan_launch(num_processes, world_size=None, node_rank=0, master_addr="127.0.0.1", master_port=None) -> LaunchPlan:
    """Check the launcher's arguments before anything starts. Every node runs the same number of processes
    (Composer's rule too), so ``world_size`` must be a multiple of ``num_processes``, and the nodes are
    ``0 .. world_size / num_processes - 1``."""
    num_processes = _int_value("num_processes", num_processes, 1)
    world_size = num_processes if world_size is None else _int_value("world_size", world_size, 1)
    if world_size % num_processes:
        raise ConfigurationError(f"world_size={world_size} with num_processes={num_processes}; expected a multiple "
                                 f"of num_processes (every node runs num_processes processes)")
    nodes = world_size // num_processes
    node_rank = _int_value("node_rank", node_rank, 0)
    if node_rank >= nodes:
        raise ConfigurationError(f"node_rank={node_rank} with world_size={world_size} and num_processes="
                                 f"{num_processes} ({nodes} node(s)); expected a node rank in 0..{nodes - 1}")
    if not isinstance(master_addr, str) or not master_addr.strip():
        raise ConfigurationError(f"master_addr={master_addr!r}; expected the host name or IP address of node 0")
    if master_port is not None:
        master_port = _int_value("master_port", master_port, 1)
        if master_port > 65535:
            raise ConfigurationError(f"master_port={master_port}; expected a port in 1..65535")
    elif nodes > 1:
        raise ConfigurationError(f"master_port=None with {nodes} nodes (world_size={world_size}, num_processes="
                                 f"{num_processes}); expected the same fixed --master_port on every node")
    return LaunchPlan(num_processes, world_size, node_rank, master_addr.strip(), master_port)


def free_port(host: str = "127.0.0.1") -> int:
    """A port nobody listens on right now, for the coordinator of a single-node run. It is released before process
    0 binds it, so another program could take it in between (the usual, accepted race)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        try:
            s.bind((host, 0))
        except OSError:  # not one of this machine's addresses (a name for it that resolves elsewhere): any will do
            s.bind(("", 0))
        return s.getsockname()[1]


def with_device_count(xla_flags: str, count: int) -> str:
    """``XLA_FLAGS`` with exactly one ``--xla_force_host_platform_device_count=count``: an existing one is replaced,
    not duplicated, so the launcher's count wins over an inherited one whatever order XLA reads them in."""
    kept = [f for f in xla_flags.split() if f.split("=", 1)[0] != DEVICE_COUNT_FLAG]
    return " ".join(kept + [f"{DEVICE_COUNT_FLAG}={count}"])


def child_env(base: Mapping[str, str], *, coordinator: str, num_processes: int, process_id: int,
              cpu_devices_per_process: int | None = None, heartbeat_timeout_s: int | None = None) -> dict[str, str]:
    """One child's environment: the launcher's own plus the variables :func:`initialize_from_env` reads, and, for
    CPU runs, JAX on the CPU with ``cpu_devices_per_process`` devices."""
    env = dict(base)
    env.update({ENV_COORDINATOR: coordinator, ENV_NUM_PROCESSES: str(num_processes), ENV_PROCESS_ID: str(process_id)})
    if heartbeat_timeout_s is not None:
        env[ENV_HEARTBEAT_TIMEOUT] = str(heartbeat_timeout_s)
    if cpu_devices_per_process is not None:
        env["XLA_FLAGS"] = with_device_count(env.get("XLA_FLAGS", ""), cpu_devices_per_process)
        env["JAX_PLATFORMS"] = "cpu"
    return env


def exit_code_of(returncode: int) -> int:
    """A shell's exit code for a child's ``returncode``: ``-N`` (killed by signal N) becomes ``128 + N``."""
    return 128 - returncode if returncode < 0 else returncode


def describe_exit(returncode: int) -> str:
    if returncode < 0:
        try:
            return f"was killed by {signal.Signals(-returncode).name}"
        except ValueError:
            return f"was killed by signal {-returncode}"
    return f"exited with code {returncode}"


def tail_of(path: Path, max_lines: int = _TAIL_LINES, max_bytes: int = _TAIL_BYTES) -> str:
    """The last lines of a log file, enough to see a traceback's end without flooding the terminal."""
    try:
        with open(path, "rb") as f:
            f.seek(0, os.SEEK_END)
            f.seek(max(0, f.tell() - max_bytes))
            text = f.read().decode("utf-8", errors="replace")
    except OSError:
        return ""
    return "\n".join(text.strip("\n").splitlines()[-max_lines:])


@dataclass
class _Child:
    process_id: int
    popen: subprocess.Popen
    stderr_path: Path | None  # None: it writes to the launcher's stderr


def _set_parent_death_signal(parent_pid: int, libc) -> None:
    """In the child, before exec: SIGTERM when the launcher dies (even by SIGKILL), so no child outlives it for long
    (it saves and exits on SIGTERM like on a forwarded one). Linux only; best effort."""
    if libc.prctl(_PR_SET_PDEATHSIG, int(signal.SIGTERM), 0, 0, 0) == 0 and os.getppid() != parent_pid:
        os._exit(128 + signal.SIGTERM)  # the launcher died before prctl took effect: exit as if terminated


def _death_signal_hook():
    """A ``preexec_fn`` arming the parent-death signal, or None where there is no ``prctl`` (not Linux). Only
    async-signal-safe calls run in it (prctl, getppid, _exit), as a forked child of a threaded process needs."""
    if not sys.platform.startswith("linux"):
        return None
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl  # noqa: B018  (resolve it here, not in the forked child)
    except (OSError, AttributeError):
        return None
    parent_pid = os.getpid()
    return lambda: _set_parent_death_signal(parent_pid, libc)


def _start_children(command: list[str], plan: LaunchPlan, coordinator: str, log_dir: Path | None,
                    cpu_devices_per_process, heartbeat_timeout_s, stack: contextlib.ExitStack) -> list[_Child]:
    """Every local process, each in its own session: a terminal's Ctrl-C reaches only the launcher, which forwards
    it once (in the terminal's process group the children would get it twice). Local rank 0 writes to the
    launcher's stdout / stderr, the others to ``log_dir/rank{process_id}.stdout|.stderr`` (global ids, so nodes
    sharing a log_dir do not collide)."""
    hook = _death_signal_hook()
    children = []
    for local_rank, process_id in enumerate(plan.process_ids):
        env = child_env(os.environ, coordinator=coordinator, num_processes=plan.world_size, process_id=process_id,
                        cpu_devices_per_process=cpu_devices_per_process, heartbeat_timeout_s=heartbeat_timeout_s)
        stdout: IO | None = None
        stderr: IO | None = None
        stderr_path = None
        if local_rank > 0:
            stdout = stack.enter_context(open(log_dir / f"rank{process_id}.stdout", "wb"))
            stderr_path = log_dir / f"rank{process_id}.stderr"
            stderr = stack.enter_context(open(stderr_path, "wb"))
        popen = subprocess.Popen(command, env=env, stdout=stdout, stderr=stderr, start_new_session=True,
                                 preexec_fn=hook)
        children.append(_Child(process_id, popen, stderr_path))
    return children


def _running(children: list[_Child]) -> list[_Child]:
    return [c for c in children if c.popen.poll() is None]


def _stop(children: list[_Child], signum: int, grace_s: float, received: list[int]) -> None:
    """Send ``signum`` to every running child, wait up to ``grace_s`` for them, then SIGKILL the process group of
    each one left (its own subprocesses too). A further signal to the launcher meanwhile (a second Ctrl-C) cuts the
    wait short. Bounded: grace_s plus a moment to reap."""
    for child in _running(children):
        with contextlib.suppress(ProcessLookupError):
            child.popen.send_signal(signum)
    signals_before = len(received)
    deadline = time.monotonic() + grace_s
    while _running(children) and time.monotonic() < deadline and len(received) == signals_before:
        time.sleep(POLL_INTERVAL_S / 2)
    for child in _running(children):  # not reaped, so its pid (= its process group id) is still its own
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(child.popen.pid, signal.SIGKILL)
        with contextlib.suppress(ProcessLookupError):
            child.popen.kill()
    for child in children:
        with contextlib.suppress(subprocess.TimeoutExpired):
            child.popen.wait(timeout=10)


def _loss_message(lost: _Child, others_running: int) -> str:
    what = (f"jaxcomposer launch: process {lost.process_id} (pid {lost.popen.pid}) "
            f"{describe_exit(lost.popen.returncode)}")
    what += (f"; stopping the other {others_running} process(es)." if others_running
             else "; no other process is running.")
    if lost.stderr_path is None:
        return what + " Its output is above (it shares the launcher's stderr)."
    tail = tail_of(lost.stderr_path)
    if not tail:
        return what + f" Its stderr ({lost.stderr_path}) is empty."
    indented = "\n".join("    " + line for line in tail.splitlines())
    return what + f" Its last output ({lost.stderr_path}):\n{indented}"


def _monitor(children: list[_Child], received: list[int], grace_s: float, err: IO) -> int:
    """Wait for the children: 0 when all exit 0; on a lost child or a signal to the launcher, stop the others and
    return the lost child's exit code, or 128 + the launcher's signal."""
    while True:
        if received:
            _stop(children, received[0], grace_s, received)
            return 128 + received[0]
        codes = [(c, c.popen.poll()) for c in children]
        failed = [c for c, code in codes if code not in (None, 0)]
        if failed:
            lost = failed[0]  # of those found ended by this poll, the lowest process id
            print(_loss_message(lost, len(_running(children))), file=err, flush=True)
            _stop(children, signal.SIGTERM, grace_s, received)
            return exit_code_of(lost.popen.returncode)
        if all(code == 0 for _, code in codes):
            return 0
        time.sleep(POLL_INTERVAL_S)


@contextlib.contextmanager
def _catching_signals(received: list[int]):
    """SIGTERM / SIGINT append to ``received`` instead of killing the launcher (so it can forward them); the
    previous handlers come back on exit. Outside the main thread Python cannot install handlers: the caller then
    has to forward signals itself."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    previous = {s: signal.signal(s, lambda signum, frame: received.append(signum)) for s in FORWARDED_SIGNALS}
    try:
        yield
    finally:
        for s, handler in previous.items():
            signal.signal(s, handler)


def _check_command(command) -> list[str]:
    if isinstance(command, (str, bytes)) or not isinstance(command, Sequence) or not command \
            or not all(isinstance(a, (str, os.PathLike)) for a in command):
        raise ConfigurationError(f"command={command!r}; expected a non-empty list of strings, e.g. "
                                 "[sys.executable, '-m', 'jaxcomposer.cli', 'fit', 'cfg.yaml']")
    return [os.fspath(a) for a in command]


def _check_optional_int(name: str, value, minimum: int) -> int | None:
    return None if value is None else _int_value(name, value, minimum)


def launch(command: Sequence[str], num_processes: int, *, world_size: int | None = None, node_rank: int = 0,
           master_addr: str = "127.0.0.1", master_port: int | None = None,
           cpu_devices_per_process: int | None = None, log_dir: str | os.PathLike | None = None,
           grace_s: float = 30.0, heartbeat_timeout_s: int | None = None, err: IO | None = None) -> int:
    """Run ``command`` as ``num_processes`` local processes of one JAX run (of ``world_size`` processes over all
    nodes) and return the exit code for the whole: 0 when every process exits 0; the first lost process's code
    (``128 + signal`` when killed) when one fails, after stopping the others; 143 / 130 when the launcher gets
    SIGTERM / SIGINT, which it forwards to every process first. Never waits longer than ``grace_s`` for processes
    asked to stop; SIGKILL follows.

    If the launcher itself is killed (SIGKILL), each child gets SIGTERM from the kernel (Linux's parent-death signal;
    elsewhere the children keep running). ``err`` (default ``sys.stderr``) receives the launcher's own messages.
    """
    err = sys.stderr if err is None else err
    command = _check_command(command)
    plan = plan_launch(num_processes, world_size, node_rank, master_addr, master_port)
    cpu_devices_per_process = _check_optional_int("cpu_devices_per_process", cpu_devices_per_process, 1)
    heartbeat_timeout_s = _check_optional_int("heartbeat_timeout_s", heartbeat_timeout_s, 1)
    if isinstance(grace_s, bool) or not isinstance(grace_s, (int, float)) or not grace_s >= 0:
        raise ConfigurationError(f"grace_s={grace_s!r}; expected a number of seconds >= 0")
    port = plan.master_port if plan.master_port is not None else free_port(plan.master_addr)
    coordinator = f"{plan.master_addr}:{port}"

    if plan.num_processes > 1:
        if log_dir is None:
            log_dir = tempfile.mkdtemp(prefix="jaxcomposer-launch-")
        log_dir = Path(log_dir)
        log_dir.mkdir(parents=True, exist_ok=True)
        others = list(plan.process_ids)[1:]
        print(f"jaxcomposer launch: {plan.num_processes} processes, coordinator {coordinator}; output of processes "
              f"{others[0]}..{others[-1]} in {log_dir}/rank{{id}}.stdout|.stderr", file=err, flush=True)

    received: list[int] = []
    with contextlib.ExitStack() as stack:
        stack.enter_context(_catching_signals(received))  # before the first child starts: no signal gets lost
        children: list[_Child] = []
        try:
            children.extend(_start_children(command, plan, coordinator, None if log_dir is None else Path(log_dir),
                                            cpu_devices_per_process, heartbeat_timeout_s, stack))
            return _monitor(children, received, grace_s, err)
        finally:  # an exception in the launcher (a child failing to start, ...): leave no child behind
            if _running(children):
                _stop(children, signal.SIGTERM, grace_s, received)


# ------------------------------------------------------------------------------------------------------------ CLI


def add_launch_parser(subparsers) -> argparse.ArgumentParser:
    """The ``launch`` subcommand, on the ``jaxcomposer`` parser's subparsers. Everything after the launcher's own
    flags is the jaxcomposer command each process runs (``fit CONFIG --max_duration 2ba``)."""
    p = subparsers.add_parser(
        "launch", help="run a jaxcomposer command as N processes of one JAX multi-process run",
        usage="jaxcomposer launch -n N [--world_size W] [--node_rank R] [--master_addr A] [--master_port P] "
              "[--cpu_devices_per_process K] [--log_dir D] fit CONFIG [fit flags ...]",
        description="Start N local processes of a jaxcomposer command that join one JAX run (Composer's "
                    "`composer -n N`). Process 0 of this node writes to this terminal, the others to --log_dir.")
    p.add_argument("-n", "--nproc", dest="num_processes", type=int, required=True, metavar="N",
                   help="processes on this node")
    p.add_argument("--world_size", type=int, default=None, metavar="W",
                   help="processes over all nodes (default: N, a single node); a multiple of N")
    p.add_argument("--node_rank", type=int, default=0, metavar="R", help="this node's index (default: 0)")
    p.add_argument("--master_addr", default="127.0.0.1", metavar="A",
                   help="host of node 0, where process 0 runs the coordinator (default: 127.0.0.1)")
    p.add_argument("--master_port", type=int, default=None, metavar="P",
                   help="coordinator port (default: a free one; required with several nodes)")
    p.add_argument("--cpu_devices_per_process", type=int, default=None, metavar="K",
                   help="run JAX on the CPU with K devices in each process")
    p.add_argument("--log_dir", default=None, metavar="D",
                   help="where processes other than this node's first write rank{id}.stdout / .stderr "
                        "(default: a new temporary directory)")
    p.add_argument("--grace_s", type=float, default=30.0, metavar="S",
                   help="seconds processes get to exit after SIGTERM before SIGKILL (default: 30)")
    p.add_argument("--heartbeat_timeout_s", type=int, default=None, metavar="S",
                   help="seconds without a heartbeat before JAX declares a process dead (default: JAX's, 100)")
    p.add_argument("subcommand", nargs=argparse.REMAINDER, metavar="COMMAND ...",
                   help="the jaxcomposer command each process runs, e.g. fit CONFIG [fit flags ...]")
    p.set_defaults(launch_known_commands=subparsers.choices)  # read at run time: every subcommand registered by then
    return p


def launch_call(args: argparse.Namespace, python: str = sys.executable) -> tuple[list[str], dict]:
    """The parsed ``launch`` flags as ``launch()``'s command and keyword arguments; the check that a jaxcomposer
    subcommand follows happens here, before anything starts."""
    rest = list(args.subcommand)
    known = sorted(name for name in getattr(args, "launch_known_commands", {}) if name != "launch")
    if not rest or rest[0].startswith("-"):
        raise ConfigurationError(f"no command after the launcher's flags (got {rest!r}); expected a jaxcomposer "
                                 f"command, e.g. `jaxcomposer launch -n 2 fit CONFIG`")
    if known and rest[0] not in known:
        raise ConfigurationError(f"command {rest[0]!r} after the launcher's flags; expected one of {', '.join(known)}")
    kwargs = dict(world_size=args.world_size, node_rank=args.node_rank, master_addr=args.master_addr,
                  master_port=args.master_port, cpu_devices_per_process=args.cpu_devices_per_process,
                  log_dir=args.log_dir, grace_s=args.grace_s, heartbeat_timeout_s=args.heartbeat_timeout_s)
    return [python, "-m", "jaxcomposer.cli", *rest], dict(num_processes=args.num_processes, **kwargs)


def run_from_args(args: argparse.Namespace) -> int:
    """``jaxcomposer launch``: launch()'s exit code, or 2 with one line for bad arguments."""
    try:
        command, kwargs = launch_call(args)
        return launch(command, **kwargs)
    except ConfigurationError as e:
        print(f"jaxcomposer launch: {e}", file=sys.stderr)
        return 2
