"""``jaxcomposer launch``: N processes of one JAX run, and what happens when one is lost or the launcher is stopped.

Workers are small scripts written to ``tmp_path``; only the first test imports JAX in them (2 processes x 2 CPU
devices, one ``jit`` over a global array). The others are plain-Python sleepers, so the process management is
tested in milliseconds, not in JAX start-up times.
"""
import json
import os
import signal
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path

import pytest

from jaxcomposer import cli
from jaxcomposer.errors import ConfigurationError
from jaxcomposer.launch import (DEVICE_COUNT_FLAG, ENV_COORDINATOR, ENV_HEARTBEAT_TIMEOUT, ENV_NUM_PROCESSES,
                                ENV_PROCESS_ID, child_env, describe_exit, detected_cluster, exit_code_of,
                                initialize_from_env, launch, launch_call, plan_launch, settings_from_env,
                                with_device_count)

REPO = Path(__file__).resolve().parents[1]


def _script(tmp_path: Path, name: str, body: str) -> Path:
    path = tmp_path / name
    path.write_text(textwrap.dedent(body))
    return path


def _wait_for(paths, timeout_s: float) -> bool:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if all(Path(p).exists() for p in paths):
            return True
        time.sleep(0.02)
    return False


def _pid_gone(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    return False


# ------------------------------------------------------------------------------------------------- a real JAX run

JAX_WORKER = """
    import json, os, sys
    from jaxcomposer.launch import initialize_from_env
    assert initialize_from_env(initialization_timeout_s=60)
    assert initialize_from_env()  # a second call is harmless
    import jax, jax.numpy as jnp, numpy as np
    from jax.sharding import Mesh, NamedSharding, PartitionSpec as P
    mesh = Mesh(np.array(jax.devices()), ("d",))
    me = jax.process_index()
    local = np.arange(2, dtype=np.float32) + 2 * me  # process 0 holds [0, 1], process 1 [2, 3]
    global_array = jax.make_array_from_process_local_data(NamedSharding(mesh, P("d")), local, (4,))
    total = jax.jit(jnp.sum, out_shardings=NamedSharding(mesh, P()))(global_array)
    result = {"process_index": me, "process_count": jax.process_count(), "device_count": jax.device_count(),
              "local_device_count": jax.local_device_count(), "sum": float(total),
              "env_process_id": int(os.environ["JAXCOMPOSER_PROCESS_ID"])}
    # how the Trainer places its initial state: each process its own shards of the values all of them hold
    from jaxcomposer import parallel
    from jaxcomposer.errors import ConfigurationError
    state = {"a": np.arange(4, dtype=np.float32), "b": np.full(4, 7, np.float32)}
    placed = parallel.same_on_every_process(state, NamedSharding(mesh, P("d")), verify="the test state")
    result["own_shards"] = [s.data.tolist() for s in placed["a"].addressable_shards]
    state["b"] = np.full(4, me, np.float32)  # a process-dependent value: refused, naming the array
    try:
        parallel.same_on_every_process(state, NamedSharding(mesh, P("d")), verify="the test state")
    except ConfigurationError as e:
        result["refused"] = str(e)
    with open(os.path.join(sys.argv[1], f"result{me}.json"), "w") as f:
        json.dump(result, f)
"""


def test_two_processes_of_two_cpu_devices_run_one_jax_computation(tmp_path, capfd):
    worker = _script(tmp_path, "jax_worker.py", JAX_WORKER)
    out = tmp_path / "out"
    out.mkdir()
    start = time.monotonic()
    code = launch([sys.executable, str(worker), str(out)], 2, cpu_devices_per_process=2, log_dir=tmp_path / "logs",
                  grace_s=5)
    assert code == 0, (tmp_path / "logs" / "rank1.stderr").read_text()[-3000:]
    assert time.monotonic() - start < 60
    results = [json.loads((out / f"result{i}.json").read_text()) for i in range(2)]
    for i, r in enumerate(results):
        assert r.pop("refused").startswith("the test state: ['b'] differs between processes")
        assert r.pop("own_shards") == [[2.0 * i], [2.0 * i + 1]]
        # conftest's XLA_FLAGS asks for 2 devices too, but the launcher's flag replaces it rather than adding one
        assert r == {"process_index": i, "process_count": 2, "device_count": 4, "local_device_count": 2,
                     "sum": 6.0, "env_process_id": i}
    assert f"output of processes 1..1 in {tmp_path / 'logs'}" in capfd.readouterr().err


# -------------------------------------------------------------------------------------------- lost processes

SLEEPER = """
    import os, signal, sys, time
    rank = int(os.environ["JAXCOMPOSER_PROCESS_ID"])
    out, failing_rank, how = sys.argv[1], int(sys.argv[2]), sys.argv[3]
    if "ignore_term" in sys.argv[4:]:
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
    with open(os.path.join(out, f"pid{rank}"), "w") as f:
        f.write(str(os.getpid()))
    if rank == failing_rank:
        # fail only once every process has started and written its pid (a loaded machine starts Python slowly)
        deadline = time.monotonic() + 30
        while not all(os.path.exists(os.path.join(out, f"pid{r}")) for r in range(2)) and time.monotonic() < deadline:
            time.sleep(0.05)
        time.sleep(0.3)
        print(f"rank {rank} is about to fail ({how})", file=sys.stderr, flush=True)
        if how == "sigkill":
            os.kill(os.getpid(), signal.SIGKILL)
        sys.exit(int(how))
    while True:
        time.sleep(0.05)
"""


@pytest.mark.parametrize("ignore_term", [False, True], ids=["dies_on_sigterm", "ignores_sigterm"])
def test_a_process_killed_by_sigkill_stops_the_others(tmp_path, capfd, ignore_term):
    worker = _script(tmp_path, "sleeper.py", SLEEPER)
    grace_s = 1.5
    extra = ["ignore_term"] if ignore_term else []
    start = time.monotonic()
    code = launch([sys.executable, str(worker), str(tmp_path), "1", "sigkill", *extra], 2,
                  log_dir=tmp_path / "logs", grace_s=grace_s)
    elapsed = time.monotonic() - start
    assert code == 128 + signal.SIGKILL
    pid0, pid1 = (int((tmp_path / f"pid{i}").read_text()) for i in range(2))
    err = capfd.readouterr().err
    assert (f"jaxcomposer launch: process 1 (pid {pid1}) was killed by SIGKILL; stopping the other 1 process(es). "
            f"Its last output ({tmp_path / 'logs' / 'rank1.stderr'}):\n    rank 1 is about to fail (sigkill)") in err
    assert err.count("was killed by") == 1  # one message, not one per process
    assert _pid_gone(pid0)  # stopped and reaped
    if ignore_term:  # SIGTERM did nothing: SIGKILL after the grace period, not later
        assert grace_s <= elapsed < grace_s + 10
    else:
        assert elapsed < grace_s + 10


def test_a_process_exiting_with_an_error_code_gives_the_launch_its_code(tmp_path, capfd):
    worker = _script(tmp_path, "sleeper.py", SLEEPER)
    start = time.monotonic()
    code = launch([sys.executable, str(worker), str(tmp_path), "1", "3"], 2, log_dir=tmp_path / "logs", grace_s=5)
    assert code == 3
    assert time.monotonic() - start < 15
    pid1 = int((tmp_path / "pid1").read_text())
    err = capfd.readouterr().err
    assert f"process 1 (pid {pid1}) exited with code 3; stopping the other 1 process(es)" in err
    assert "rank 1 is about to fail (3)" in err
    assert _pid_gone(int((tmp_path / "pid0").read_text()))


def test_process_0_failing_points_at_the_launchers_own_stderr(tmp_path, capfd):
    worker = _script(tmp_path, "sleeper.py", SLEEPER)
    code = launch([sys.executable, str(worker), str(tmp_path), "0", "7"], 2, log_dir=tmp_path / "logs", grace_s=5)
    assert code == 7
    err = capfd.readouterr().err
    pid0 = int((tmp_path / "pid0").read_text())
    assert "rank 0 is about to fail (7)" in err  # process 0 writes to the launcher's stderr
    assert f"process 0 (pid {pid0}) exited with code 7; stopping the other 1 process(es). Its output is above" in err
    assert _pid_gone(int((tmp_path / "pid1").read_text()))


ENV_REPORTER = """
    import json, os, sys
    keys = ["JAXCOMPOSER_COORDINATOR_ADDRESS", "JAXCOMPOSER_NUM_PROCESSES", "JAXCOMPOSER_PROCESS_ID",
            "JAXCOMPOSER_HEARTBEAT_TIMEOUT", "XLA_FLAGS", "JAX_PLATFORMS"]
    rank = os.environ["JAXCOMPOSER_PROCESS_ID"]
    with open(os.path.join(sys.argv[1], f"env{rank}.json"), "w") as f:
        json.dump({k: os.environ.get(k) for k in keys}, f)
    print(f"hello from rank {rank}")
    print(f"warning from rank {rank}", file=sys.stderr)
"""


def test_every_process_gets_its_id_the_coordinator_and_its_devices(tmp_path, capfd, monkeypatch):
    monkeypatch.setenv("XLA_FLAGS", f"--xla_foo=1 {DEVICE_COUNT_FLAG}=2 --xla_bar")
    worker = _script(tmp_path, "env_reporter.py", ENV_REPORTER)
    logs = tmp_path / "logs"
    code = launch([sys.executable, str(worker), str(tmp_path)], 3, world_size=6, node_rank=1, master_port=23456,
                  cpu_devices_per_process=3, heartbeat_timeout_s=7, log_dir=logs)
    assert code == 0
    envs = {i: json.loads((tmp_path / f"env{i}.json").read_text()) for i in (3, 4, 5)}  # node 1: ids 3..5
    for i, env in envs.items():
        assert env == {ENV_COORDINATOR: "127.0.0.1:23456", ENV_NUM_PROCESSES: "6", ENV_PROCESS_ID: str(i),
                       ENV_HEARTBEAT_TIMEOUT: "7", "XLA_FLAGS": f"--xla_foo=1 --xla_bar {DEVICE_COUNT_FLAG}=3",
                       "JAX_PLATFORMS": "cpu"}
    captured = capfd.readouterr()
    assert "hello from rank 3" in captured.out and "warning from rank 3" in captured.err  # the launcher's own
    assert "rank 4" not in captured.out + captured.err
    assert (logs / "rank4.stdout").read_text() == "hello from rank 4\n"
    assert (logs / "rank5.stderr").read_text() == "warning from rank 5\n"
    assert captured.err.count("jaxcomposer launch:") == 1  # the log dir, said once
    assert f"output of processes 4..5 in {logs}" in captured.err


def test_a_single_process_needs_no_log_dir_and_picks_a_port(tmp_path, capfd):
    worker = _script(tmp_path, "env_reporter.py", ENV_REPORTER)
    assert launch([sys.executable, str(worker), str(tmp_path)], 1) == 0
    env = json.loads((tmp_path / "env0.json").read_text())
    host, port = env[ENV_COORDINATOR].rsplit(":", 1)
    assert host == "127.0.0.1" and 0 < int(port) < 65536 and env[ENV_NUM_PROCESSES] == "1"
    assert env[ENV_HEARTBEAT_TIMEOUT] is None and env["JAX_PLATFORMS"] == os.environ.get("JAX_PLATFORMS")
    assert "jaxcomposer launch:" not in capfd.readouterr().err


# ------------------------------------------------------------------------------------- signals to the launcher

SIGNALLED = """
    import os, signal, sys, time
    rank = os.environ["JAXCOMPOSER_PROCESS_ID"]
    out, mode = sys.argv[1], sys.argv[2]
    def on_signal(signum, frame):
        # Written then renamed: the test polls for the file and must never read it half-written.
        with open(os.path.join(out, f"got{rank}.tmp"), "w") as f:
            f.write(signal.Signals(signum).name)
        os.replace(os.path.join(out, f"got{rank}.tmp"), os.path.join(out, f"got{rank}"))
        if mode == "exit":
            sys.exit(128 + signum)
    for s in (signal.SIGTERM, signal.SIGINT):
        signal.signal(s, on_signal)
    open(os.path.join(out, f"ready{rank}"), "w").close()
    while True:
        time.sleep(0.05)
"""


def _signal_me_when_ready(ready_files, signums, done: threading.Event) -> threading.Thread:
    """A thread that sends the signals to this (the launcher's) process once every worker installed its handler."""
    def send():
        if _wait_for(ready_files, 30):
            for s in signums:
                if not done.is_set():
                    os.kill(os.getpid(), s)
                    time.sleep(0.3)
    thread = threading.Thread(target=send, daemon=True)
    thread.start()
    return thread


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGINT], ids=["SIGTERM", "SIGINT"])
def test_a_signal_to_the_launcher_reaches_every_process(tmp_path, signum):
    worker = _script(tmp_path, "signalled.py", SIGNALLED)
    before = {s: signal.getsignal(s) for s in (signal.SIGTERM, signal.SIGINT)}
    done = threading.Event()
    thread = _signal_me_when_ready([tmp_path / "ready0", tmp_path / "ready1"], [signum], done)
    start = time.monotonic()
    code = launch([sys.executable, str(worker), str(tmp_path), "exit"], 2, log_dir=tmp_path / "logs", grace_s=20)
    done.set()
    thread.join()
    assert code == 128 + signum  # 143 / 130
    assert time.monotonic() - start < 15  # the processes exited on the signal: no wait for the grace period
    assert [(tmp_path / f"got{i}").read_text() for i in range(2)] == [signum.name] * 2
    assert {s: signal.getsignal(s) for s in before} == before  # the caller's handlers are back


def test_a_second_signal_skips_the_grace_period(tmp_path):
    worker = _script(tmp_path, "signalled.py", SIGNALLED)
    done = threading.Event()
    thread = _signal_me_when_ready([tmp_path / "ready0", tmp_path / "ready1"], [signal.SIGINT, signal.SIGINT], done)
    start = time.monotonic()
    code = launch([sys.executable, str(worker), str(tmp_path), "stay"], 2, log_dir=tmp_path / "logs", grace_s=60)
    done.set()
    thread.join()
    assert code == 130
    assert time.monotonic() - start < 20  # SIGKILL on the second Ctrl-C, not after 60 s
    assert (tmp_path / "got1").read_text() == "SIGINT"


JAX_SIGTERM_WORKER = """
    import os, signal, sys, time
    from jaxcomposer.launch import initialize_from_env
    assert initialize_from_env(initialization_timeout_s=60)
    import jax
    out, rank = sys.argv[1], jax.process_index()
    def on_sigterm(signum, frame):  # installed after initialize: JAX's own SIGTERM notifier would swallow it
        open(os.path.join(out, f"got{rank}"), "w").close()
        sys.exit(143)
    signal.signal(signal.SIGTERM, on_sigterm)
    open(os.path.join(out, f"ready{rank}"), "w").close()
    while True:
        time.sleep(0.05)
"""


LAUNCHER_SCRIPT = """
    import sys
    from jaxcomposer.launch import launch
    sys.exit(launch([sys.executable, sys.argv[1], sys.argv[2], sys.argv[3]], 2, log_dir=sys.argv[4], grace_s=20))
"""


@pytest.mark.slow  # the helper imports jaxcomposer: seconds on a busy machine
def test_a_launcher_process_forwards_sigterm_and_exits_143(tmp_path):
    worker = _script(tmp_path, "signalled.py", SIGNALLED)
    helper = _script(tmp_path, "launcher.py", LAUNCHER_SCRIPT)
    proc = subprocess.Popen([sys.executable, str(helper), str(worker), str(tmp_path), "exit", str(tmp_path / "logs")],
                            cwd=REPO)
    try:
        assert _wait_for([tmp_path / "ready0", tmp_path / "ready1"], 60)
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=20) == 143
    finally:
        proc.kill()
    assert [(tmp_path / f"got{i}").read_text() for i in range(2)] == ["SIGTERM"] * 2


@pytest.mark.slow  # the helper imports jaxcomposer: seconds on a busy machine
@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="the parent-death signal is Linux's")
def test_children_of_a_sigkilled_launcher_get_sigterm(tmp_path):
    worker = _script(tmp_path, "signalled.py", SIGNALLED)
    helper = _script(tmp_path, "launcher.py", LAUNCHER_SCRIPT)
    proc = subprocess.Popen([sys.executable, str(helper), str(worker), str(tmp_path), "exit", str(tmp_path / "logs")],
                            cwd=REPO)
    try:
        assert _wait_for([tmp_path / "ready0", tmp_path / "ready1"], 60)
        proc.kill()
        proc.wait(timeout=10)
        assert _wait_for([tmp_path / "got0", tmp_path / "got1"], 10)
    finally:
        proc.kill()
    assert [(tmp_path / f"got{i}").read_text() for i in range(2)] == ["SIGTERM"] * 2


def test_the_cli_runs_a_subcommand_in_every_process(tmp_path):
    logs = tmp_path / "logs"  # (``fit --help`` needs no JAX: three quick processes)
    result = subprocess.run([sys.executable, "-m", "jaxcomposer.cli", "launch", "--nproc", "2", "--log_dir", str(logs),
                             "fit", "--help"], cwd=REPO, capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    assert "usage: jaxcomposer fit CONFIG" in result.stdout
    assert "usage: jaxcomposer fit CONFIG" in (logs / "rank1.stdout").read_text()


# ------------------------------------------------------------------------------------------ argument checks


@pytest.mark.parametrize("kwargs, message", [
    (dict(num_processes=0), "num_processes=0 is too small; expected an integer >= 1"),
    (dict(num_processes=2, world_size=3), "world_size=3 with num_processes=2; expected a multiple of num_processes"),
    (dict(num_processes=2, world_size=4, node_rank=2, master_port=1234),
     "node_rank=2 with world_size=4 and num_processes=2 (2 node(s)); expected a node rank in 0..1"),
    (dict(num_processes=2, world_size=4, node_rank=1),
     "master_port=None with 2 nodes (world_size=4, num_processes=2); expected the same fixed --master_port"),
    (dict(num_processes=2, master_port=70000), "master_port=70000; expected a port in 1..65535"),
    (dict(num_processes=True), "num_processes=True is a bool; expected an integer >= 1"),
    (dict(num_processes=2, cpu_devices_per_process=0), "cpu_devices_per_process=0 is too small"),
    (dict(num_processes=2, grace_s=-1), "grace_s=-1; expected a number of seconds >= 0"),
])
def test_bad_arguments_are_refused_before_anything_starts(tmp_path, kwargs, message):
    worker = _script(tmp_path, "env_reporter.py", ENV_REPORTER)
    with pytest.raises(ConfigurationError, match=message.replace("(", r"\(").replace(")", r"\)").replace(".", r"\.")):
        launch([sys.executable, str(worker), str(tmp_path)], **kwargs)
    assert not list(tmp_path.glob("env*.json"))


def test_a_command_must_be_a_list():
    with pytest.raises(ConfigurationError, match="command='python x.py'; expected a non-empty list of strings"):
        launch("python x.py", 2)
    with pytest.raises(ConfigurationError, match="command=\\[\\]"):
        launch([], 2)


def test_a_plan_gives_each_node_its_process_ids():
    plan = plan_launch(4, world_size=8, node_rank=1, master_port=1234)
    assert list(plan.process_ids) == [4, 5, 6, 7] and plan.world_size == 8
    assert list(plan_launch(2).process_ids) == [0, 1] and plan_launch(2).master_port is None


# --------------------------------------------------------------------------------------------- worker's side

GOOD_ENV = {ENV_COORDINATOR: "10.0.0.1:1234", ENV_NUM_PROCESSES: "4", ENV_PROCESS_ID: "3"}


def test_settings_come_from_the_launchers_variables():
    s = settings_from_env(GOOD_ENV)
    assert (s.coordinator_address, s.num_processes, s.process_id, s.heartbeat_timeout_s) == ("10.0.0.1:1234", 4, 3, 100)
    assert settings_from_env({**GOOD_ENV, ENV_HEARTBEAT_TIMEOUT: "15"}).heartbeat_timeout_s == 15
    assert settings_from_env({}) is None


@pytest.mark.parametrize("change, message", [
    ({ENV_PROCESS_ID: "4"}, "JAXCOMPOSER_PROCESS_ID=4 with JAXCOMPOSER_NUM_PROCESSES=4; expected a process id in 0..3"),
    ({ENV_NUM_PROCESSES: "four"}, "JAXCOMPOSER_NUM_PROCESSES='four' is not an integer; expected an integer >= 1"),
    ({ENV_PROCESS_ID: "-1"}, "JAXCOMPOSER_PROCESS_ID=-1 is too small; expected an integer >= 0"),
    ({ENV_COORDINATOR: "10.0.0.1"}, "JAXCOMPOSER_COORDINATOR_ADDRESS='10.0.0.1' is not an address; expected HOST:PORT"),
    ({ENV_COORDINATOR: "h:99999"}, "JAXCOMPOSER_COORDINATOR_ADDRESS='h:99999' has port 99999"),
    ({ENV_HEARTBEAT_TIMEOUT: "0"}, "JAXCOMPOSER_HEARTBEAT_TIMEOUT=0 is too small"),
    ({ENV_COORDINATOR: ""}, "JAXCOMPOSER_COORDINATOR_ADDRESS not set while JAXCOMPOSER_NUM_PROCESSES, "
                            "JAXCOMPOSER_PROCESS_ID is: expected all three"),
])
def test_bad_launcher_variables_are_named(change, message):
    with pytest.raises(ConfigurationError) as e:
        settings_from_env({**GOOD_ENV, **change})
    assert message in str(e.value)


def test_bad_variables_fail_initialize_before_jax_is_touched():
    with pytest.raises(ConfigurationError, match="expected a process id in 0..3"):
        initialize_from_env({**GOOD_ENV, ENV_PROCESS_ID: "7"})


def test_a_single_process_run_initializes_nothing():
    assert initialize_from_env({}) is False
    assert initialize_from_env({"SLURM_JOB_ID": "1", "SLURM_NTASKS": "1"}) is False


@pytest.mark.parametrize("environ, calls", [
    ({"JAXCOMPOSER_DISTRIBUTED": "auto"}, [{"initialization_timeout": 300}]),  # TPU pods, Kubernetes: JAX detects
    ({"JAXCOMPOSER_DISTRIBUTED": "0"}, []),
    ({ENV_COORDINATOR: "h:5", ENV_NUM_PROCESSES: "2", ENV_PROCESS_ID: "1"},
     [{"coordinator_address": "h:5", "num_processes": 2, "process_id": 1, "heartbeat_timeout_seconds": 100,
       "initialization_timeout": 300}]),
])
def test_what_initialize_from_env_asks_of_jax(environ, calls, monkeypatch):
    import jax
    seen = []
    monkeypatch.setattr(jax.distributed, "initialize", lambda **kw: seen.append(kw))
    monkeypatch.setattr(jax.distributed, "is_initialized", lambda: False)
    assert initialize_from_env(environ) is bool(calls)
    assert seen == calls


SLURM_STEP = {"SLURM_JOB_ID": "77", "SLURM_STEP_NODELIST": "n[1-2]", "SLURM_NTASKS": "8", "SLURM_PROCID": "3",
              "SLURM_LOCALID": "1"}


@pytest.mark.parametrize("environ, expected", [
    ({}, None),
    (SLURM_STEP, "slurm"),
    ({**SLURM_STEP, "SLURM_NTASKS": "1"}, None),  # srun -n 1
    ({k: v for k, v in SLURM_STEP.items() if k != "SLURM_STEP_NODELIST"}, None),  # the batch shell, not a step
    ({"OMPI_COMM_WORLD_SIZE": "4", "OMPI_MCA_orte_hnp_uri": "123.0;tcp://10.0.0.1:5000"}, "openmpi"),
    ({"OMPI_COMM_WORLD_SIZE": "1", "OMPI_MCA_orte_hnp_uri": "123.0;tcp://10.0.0.1:5000"}, None),
])
def test_clusters_that_jax_detects(environ, expected):
    assert detected_cluster(environ) == expected


def test_open_mpi_without_a_coordinator_address_is_explained():
    with pytest.raises(ConfigurationError, match="OMPI_COMM_WORLD_SIZE=4 but OMPI_MCA_orte_hnp_uri is unset"):
        detected_cluster({"OMPI_COMM_WORLD_SIZE": "4"})
    with pytest.raises(ConfigurationError, match="SLURM_NTASKS='x' is not an integer"):
        detected_cluster({**SLURM_STEP, "SLURM_NTASKS": "x"})


# --------------------------------------------------------------------------------------------- pure helpers


def test_the_device_count_flag_is_replaced_not_duplicated():
    assert with_device_count("", 4) == f"{DEVICE_COUNT_FLAG}=4"
    flags = f"--a=1 {DEVICE_COUNT_FLAG}=2 --b {DEVICE_COUNT_FLAG}=8"
    assert with_device_count(flags, 3) == f"--a=1 --b {DEVICE_COUNT_FLAG}=3"


def test_child_env_keeps_the_rest_of_the_environment():
    env = child_env({"PATH": "/bin", "XLA_FLAGS": "--x"}, coordinator="h:1", num_processes=2, process_id=1)
    assert env == {"PATH": "/bin", "XLA_FLAGS": "--x", ENV_COORDINATOR: "h:1", ENV_NUM_PROCESSES: "2",
                   ENV_PROCESS_ID: "1"}


def test_exit_codes_and_their_descriptions():
    assert exit_code_of(-9) == 137 and exit_code_of(-15) == 143 and exit_code_of(3) == 3 and exit_code_of(0) == 0
    assert describe_exit(-9) == "was killed by SIGKILL" and describe_exit(3) == "exited with code 3"


# ------------------------------------------------------------------------------------------------------- CLI


def _parse(*argv):
    return launch_call(cli.build_parser().parse_args(list(argv)), python="PY")


def test_the_cli_passes_everything_after_its_flags_to_each_process():
    command, kwargs = _parse("launch", "-n", "2", "--cpu_devices_per_process", "2", "fit", "cfg.yaml",
                             "--max_duration", "2ba")
    assert command == ["PY", "-m", "jaxcomposer.cli", "fit", "cfg.yaml", "--max_duration", "2ba"]
    assert kwargs == dict(num_processes=2, world_size=None, node_rank=0, master_addr="127.0.0.1", master_port=None,
                          cpu_devices_per_process=2, log_dir=None, grace_s=30.0, heartbeat_timeout_s=None)


def test_the_cli_takes_composers_flag_names():
    command, kwargs = _parse("launch", "--nproc", "4", "--world_size", "8", "--node_rank", "1", "--master_addr",
                             "node0", "--master_port", "29500", "--log_dir", "logs", "fit", "c.yaml", "-n", "9")
    assert command[3:] == ["fit", "c.yaml", "-n", "9"]  # a flag after the command belongs to the command
    assert (kwargs["num_processes"], kwargs["world_size"], kwargs["node_rank"], kwargs["master_addr"],
            kwargs["master_port"], kwargs["log_dir"]) == (4, 8, 1, "node0", 29500, "logs")


@pytest.mark.parametrize("rest, message", [
    ([], "no command after the launcher's flags"),
    (["train.py"], "command 'train.py' after the launcher's flags; expected one of fit, methods"),
    (["launch", "-n", "2", "fit", "c.yaml"], "command 'launch' after the launcher's flags"),
])
def test_the_cli_needs_a_jaxcomposer_command(rest, message, capsys):
    with pytest.raises(ConfigurationError, match=message):
        _parse("launch", "-n", "2", *rest)
    assert cli.main(["launch", "-n", "2", *rest]) == 2
    assert f"jaxcomposer launch: {message}" in capsys.readouterr().err
