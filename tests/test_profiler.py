"""The profiler (Composer's ``composer.profiler``): the schedule batch by batch, markers, the JSON traces and the
device trace, driven through the host events as the Trainer fires them (no Trainer needed)."""
from __future__ import annotations

import json
import time
import warnings
from pathlib import Path

import jax
import jax.numpy as jnp
import pytest

from jaxcomposer.core.events import Event
from jaxcomposer.core.time import Timestamp
from jaxcomposer.profiler import (JSONTraceHandler, Marker, Profiler, ProfilerAction, TraceHandler,
                                  cyclic_schedule)
from tests.loggers.helpers import make_state

S, W, A, Z = (ProfilerAction.SKIP, ProfilerAction.WARMUP, ProfilerAction.ACTIVE, ProfilerAction.ACTIVE_AND_SAVE)
LETTERS = {"S": S, "W": W, "A": A, "Z": Z}
NO_SYSTEM = dict(sys_prof_cpu=False)
NO_DEVICE = dict(torch_prof_record_shapes=False, torch_prof_profile_memory=False, torch_prof_with_stack=False,
                 torch_prof_with_flops=False)


@pytest.fixture(autouse=True)
def no_trace_left_running():
    """jax.profiler traces one thing per process: a test that left its trace running would fail the next."""
    yield
    try:
        jax.profiler.stop_trace()
    except RuntimeError:  # "No profile started": the expected case
        return
    pytest.fail("a jax.profiler trace was left running")


class Recorder(TraceHandler):
    """A handler written as for Composer: only Composer's methods, durations as start/end pairs."""

    def __init__(self):
        self.durations, self.instants, self.counters, self.windows = [], [], [], []

    def process_duration_event(self, name, categories, is_start, timestamp, wall_clock_time_ns):
        self.durations.append((name, is_start, wall_clock_time_ns))

    def process_instant_event(self, name, categories, timestamp, wall_clock_time_ns):
        self.instants.append(name)

    def process_counter_event(self, name, categories, timestamp, wall_clock_time_ns, values):
        self.counters.append((name, dict(values)))

    def window_end(self, state, logger):
        self.windows.append(int(state.timestamp.batch))


def fire(profiler, state, *events):
    for event in events:
        profiler.run_event(event, state, None)


def fake_fit(profiler, state, *, epochs=2, eval_after=(), save_after=()):
    """The Trainer's loop as the profiler sees it: events, and markers around its phases. ``eval_after`` and
    ``save_after``: batch counts after which an evaluation / a checkpoint runs."""
    step = jax.jit(lambda x: x @ x)
    x = jnp.ones((8, 8))
    fire(profiler, state, Event.FIT_START)
    for _ in range(epochs):
        fire(profiler, state, Event.EPOCH_START)
        for _ in profiler.marked_iter("dataloader/train", range(state.steps_per_epoch)):
            fire(profiler, state, Event.BATCH_START)
            with profiler.marker("step", device_step=True):
                state.train_state = step(x)
            state.timestamp = state.timestamp.to_next_batch(samples=state.batch_size)
            fire(profiler, state, Event.BATCH_END)
            if state.timestamp.batch in eval_after:
                with profiler.marker("eval/eval"):
                    fire(profiler, state, Event.EVAL_START, Event.EVAL_BATCH_END, Event.EVAL_END)
            if state.timestamp.batch in save_after:
                with profiler.marker("checkpoint"):
                    pass
        state.timestamp = state.timestamp.to_next_epoch()
        fire(profiler, state, Event.EPOCH_END)
    fire(profiler, state, Event.FIT_END)


def bound(profiler, state):
    state.profiler = profiler  # (the Trainer sets state.profiler, as Composer's)
    fire(profiler, state, Event.INIT)
    return profiler


def trace_events(path: Path) -> list[dict]:
    data = json.loads(path.read_text())
    assert set(data) >= {"traceEvents"}
    return data["traceEvents"]


def check_well_formed(events: list[dict]) -> None:
    for e in events:
        assert isinstance(e["name"], str) and e["name"], e
        assert e["ph"] in ("X", "i", "C", "M"), e
        assert e["pid"] == 0 and isinstance(e["tid"], int), e
        if e["ph"] != "M":
            assert isinstance(e["ts"], (int, float)) and e["ts"] > 0, e
        if e["ph"] == "X":
            assert isinstance(e["dur"], (int, float)) and e["dur"] >= 0, e
            assert set(e["args"]) == {"epoch", "batch"}, e
        if e["ph"] == "i":
            assert e["s"] == "p", e
        if e["ph"] == "C":
            assert e["args"] and all(isinstance(v, (int, float)) for v in e["args"].values()), e


# ---- the schedule ----------------------------------------------------------------------------------------------
# Composer's documented behaviour, written out batch by batch (S skip, W warmup, A active, Z active_and_save): in
# each epoch skip `skip_first` batches, then cycles of `wait` skipped, `warmup` warm-up and `active` recorded
# batches, `repeat` cycles (0: until the epoch ends); the cycle's last active batch saves, and so does an active
# batch that is the epoch's last.
SCHEDULES = [
    # (skip_first, wait, warmup, active, repeat), batches per epoch (None: no len), sequence over batch_in_epoch
    ((0, 0, 1, 4, 1), None, "WAAAZSSS"),
    ((1, 2, 3, 4, 1), None, "SSSWWWAAAZSSSSSS"),  # Composer's own test's configuration
    ((1, 2, 3, 4, 0), None, "SSSWWWAAAZSSWWWAAAZS"),
    ((1, 2, 3, 4, 2), None, "SSSWWWAAAZSSWWWAAAZSSSS"),
    ((0, 0, 1, 4, 1), 3, "WAZ"),  # the epoch's last batch saves a cycle cut short
    ((0, 0, 1, 4, 0), 4, "WAAZ"),
    ((0, 0, 1, 2, 0), 7, "WAZWAZW"),  # (a warm-up batch that is the epoch's last stays warm-up)
    ((0, 1, 0, 1, 3), None, "SZSZSZSS"),
    ((2, 0, 0, 3, 1), None, "SSAAZSS"),
]


@pytest.mark.parametrize("args, per_epoch, expected", SCHEDULES)
def test_cyclic_schedule_batch_by_batch(args, per_epoch, expected):
    names = ("skip_first", "wait", "warmup", "active", "repeat")
    schedule = cyclic_schedule(**dict(zip(names, args)))
    state = make_state(total_steps=100, steps_per_epoch=per_epoch)
    got = []
    for i in range(len(expected)):
        state.timestamp = Timestamp(epoch=3, batch=40 + i, batch_in_epoch=i)  # only batch_in_epoch counts
        got.append(schedule(state))
    assert got == [LETTERS[c] for c in expected]


def test_cyclic_schedule_counts_skip_first_from_the_resumed_batch():
    state = make_state(total_steps=100, steps_per_epoch=None)
    state.timestamp = Timestamp(batch=3, batch_in_epoch=3)  # resumed mid-epoch, before INIT (as the Trainer)
    profiler = bound(Profiler(cyclic_schedule(skip_first=1), [], **NO_SYSTEM, **NO_DEVICE), state)
    assert profiler.resumption_batch_idx == 3
    schedule = profiler.schedule
    got = []
    for i in range(10):
        state.timestamp = Timestamp(batch_in_epoch=i)
        got.append(schedule(state))
    assert got == [LETTERS[c] for c in "SSSSWAAAZS"]


@pytest.mark.parametrize("kwargs", [dict(wait=-1), dict(active=1.5), dict(repeat=True),
                                    dict(wait=0, warmup=0, active=0)])
def test_cyclic_schedule_refuses_bad_arguments(kwargs):
    with pytest.raises(ValueError, match="cyclic_schedule"):
        cyclic_schedule(**kwargs)


def test_profiler_action_is_a_string_enum_as_composers():
    assert ProfilerAction("ACTIVE_AND_SAVE") is Z and ProfilerAction("warmup") is W and ProfilerAction("Skip") is S
    assert ProfilerAction.ACTIVE == "active"
    with pytest.raises(ValueError):
        ProfilerAction("sometimes")


# ---- a run through the events ----------------------------------------------------------------------------------
def test_fake_run_writes_one_json_trace_and_one_device_trace_per_window(tmp_path, monkeypatch):
    calls = []
    real_start, real_stop = jax.profiler.start_trace, jax.profiler.stop_trace
    monkeypatch.setattr(jax.profiler, "start_trace", lambda *a, **k: (calls.append("start"), real_start(*a, **k)))
    monkeypatch.setattr(jax.profiler, "stop_trace", lambda: (calls.append("stop"), real_stop()))
    state = make_state(total_steps=10, steps_per_epoch=5, run_name="prof-run")
    handler = JSONTraceHandler(folder=str(tmp_path / "{run_name}" / "traces"), overwrite=True)
    profiler = bound(Profiler(cyclic_schedule(wait=0, warmup=1, active=2, repeat=1), [handler],
                              torch_prof_folder=str(tmp_path / "{run_name}" / "device"),
                              torch_prof_overwrite=True), state)
    fake_fit(profiler, state, epochs=2, eval_after=(1, 4, 6, 9), save_after=(2, 4, 7, 9))

    # per epoch: batch 0 warm-up, 1 active, 2 active_and_save (the window ends after it: batch count 3), 3-4 skipped
    folder = tmp_path / "prof-run" / "traces"
    assert sorted(p.name for p in folder.iterdir()) == ["ep0-ba3-rank0.json", "ep1-ba8-rank0.json",
                                                        "merged_trace.json"]
    assert [int(ts.batch) for ts, _ in handler.saved_traces] == [3, 8]
    for name, batches in (("ep0-ba3-rank0.json", [0, 1, 2]), ("ep1-ba8-rank0.json", [5, 6, 7])):
        events = trace_events(folder / name)
        check_well_formed(events)
        durations = [e for e in events if e["ph"] == "X"]
        by_name = {}
        for e in durations:
            by_name.setdefault(e["name"], []).append(e)
        # markers record during the window's batches only: nothing of batches 3-4 (or of the other epoch)
        assert [e["args"]["batch"] for e in by_name["step"]] == batches
        assert [e["args"]["batch"] for e in by_name["event/batch"]] == batches
        assert [e["args"]["batch"] for e in by_name["dataloader/train"]] == batches
        assert all(e["cat"] == "dataloader" for e in by_name["dataloader/train"])
        for step, batch in zip(by_name["step"], by_name["event/batch"]):  # the step nests in its batch
            assert batch["ts"] <= step["ts"] and step["ts"] + step["dur"] <= batch["ts"] + batch["dur"] + 1e-3
        # between batches the next batch's action holds: the evaluation after batch 0 (5) and the checkpoint
        # after batch 1 (6) are in the window; those after batch 3 (8), once the window is over, are not
        assert [e["args"]["batch"] for e in by_name["eval/eval"]] == [batches[0] + 1]
        assert [e["args"]["batch"] for e in by_name["event/eval"]] == [batches[0] + 1]
        assert [e["args"]["batch"] for e in by_name["checkpoint"]] == [batches[0] + 2]
        instants = {e["name"] for e in events if e["ph"] == "i"}
        assert instants == {"event/epoch_start", "event/eval_batch_end"} | ({"event/fit_start"} if not batches[0]
                                                                             else set())
        metadata = {(e["name"], json.dumps(e["args"])) for e in events if e["ph"] == "M"}
        assert ("process_name", json.dumps({"name": "Rank 0 training loop process"})) in metadata
        assert ("thread_name", json.dumps({"name": "Training Loop"})) in metadata
        assert any(e["ph"] == "C" and e["name"] == "cpu" for e in events)  # sys_prof_cpu=True (the default)
    merged = trace_events(folder / "merged_trace.json")
    check_well_formed(merged)
    assert [e["args"]["batch"] for e in merged if e["name"] == "step"] == [0, 1, 2, 5, 6, 7]
    assert [e["args"]["batch"] for e in merged if e["name"] == "checkpoint"] == [2, 7]
    assert sum(e["name"] == "process_name" for e in merged) == 1

    # the device trace: started at the first active batch of each window, stopped when the window ends
    assert calls == ["start", "stop", "start", "stop"]
    device = tmp_path / "prof-run" / "device"
    assert sorted(p.name for p in device.iterdir()) == ["rank0.3", "rank0.8"]
    assert profiler.device_traces == [device / "rank0.3", device / "rank0.8"]
    for window in ("rank0.3", "rank0.8"):
        assert list((device / window / "plugins" / "profile").glob("*/*.xplane.pb"))  # TensorBoard, XProf
        assert list((device / window / "plugins" / "profile").glob("*/perfetto_trace.json.gz"))  # Perfetto


def test_device_trace_holds_the_markers_as_annotations(tmp_path):
    import gzip
    state = make_state(total_steps=5, steps_per_epoch=5)
    profiler = bound(Profiler(cyclic_schedule(warmup=0, active=2), [], torch_prof_folder=str(tmp_path),
                              **NO_SYSTEM), state)
    fake_fit(profiler, state, epochs=1)
    (trace,) = (tmp_path / "rank0.2" / "plugins" / "profile").glob("*/perfetto_trace.json.gz")
    names = {e.get("name") for e in json.loads(gzip.decompress(trace.read_bytes()))["traceEvents"]}
    assert {"step", "event/batch", "dataloader/train"} <= names


def test_markers_outside_windows_record_nothing_and_cost_little():
    state = make_state(total_steps=100, steps_per_epoch=None)
    recorder = Recorder()
    profiler = bound(Profiler(cyclic_schedule(skip_first=50), [recorder], **NO_SYSTEM, **NO_DEVICE), state)
    marker = profiler.marker("step")
    with marker:  # before fit: nothing is recorded
        pass
    fire(profiler, state, Event.FIT_START, Event.EPOCH_START, Event.BATCH_START)
    n = 20000
    start = time.perf_counter()
    for _ in range(n):
        with marker:
            pass
    per_marker_us = (time.perf_counter() - start) / n * 1e6
    for _ in range(100):
        with profiler.marker("dataloader/train"):
            pass
        profiler.marker("x").instant()
        profiler.marker("y").counter({"v": 1})
    fire(profiler, state, Event.BATCH_END, Event.EPOCH_END, Event.FIT_END)
    assert recorder.durations == recorder.instants == recorder.counters == recorder.windows == []
    print(f"inactive marker: {per_marker_us:.2f} us")
    assert per_marker_us < 5.0  # far above an inactive marker's cost, which leaves room for a busy machine


# ---- markers ----------------------------------------------------------------------------------------------------
def test_marker_api_as_composers():
    state = make_state(total_steps=10, steps_per_epoch=None)
    recorder = Recorder()
    profiler = bound(Profiler(cyclic_schedule(), [recorder], **NO_SYSTEM, **NO_DEVICE), state)
    fire(profiler, state, Event.FIT_START)  # batch 0: warm-up, in which markers record by default
    marker = profiler.marker("name", actions=[S, W, A], categories=["cat1"])
    assert isinstance(marker, Marker) and profiler.marker("name") is marker
    marker.start()
    with pytest.raises(RuntimeError):
        marker.start()
    marker.finish()
    with pytest.raises(RuntimeError):
        marker.finish()
    with marker:
        pass

    @marker
    def double(v):
        return 2 * v

    @marker()
    def triple(v):
        return 3 * v

    assert double(2) == 4 and triple(2) == 6
    marker.instant()
    # a handler with only Composer's process_duration_event gets each duration as a start and an end
    assert [is_start for _, is_start, _ in recorder.durations] == [True, False] * 4
    assert all(end >= start for (_, _, start), (_, _, end) in zip(recorder.durations[::2], recorder.durations[1::2]))
    assert recorder.instants == ["event/fit_start", "name"]

    edges = profiler.marker("edges", record_instant_on_start=True, record_instant_on_finish=True)
    with edges:
        pass
    assert recorder.instants[-2:] == ["edges", "edges"]
    profiler.marker("counts").counter({"items": 3})
    assert recorder.counters == [("counts", {"items": 3})]


def test_marker_with_skip_in_its_actions_records_outside_windows():
    state = make_state(total_steps=10, steps_per_epoch=None)
    recorder = Recorder()
    profiler = bound(Profiler(cyclic_schedule(skip_first=5), [recorder], **NO_SYSTEM, **NO_DEVICE), state)
    fire(profiler, state, Event.FIT_START)
    with profiler.marker("always", actions=list(ProfilerAction)):
        pass
    with profiler.marker("default"):
        pass
    assert [name for name, _, _ in recorder.durations] == ["always", "always"]


def test_marked_iter_times_each_next_and_closes_its_source():
    state = make_state(total_steps=10, steps_per_epoch=None)
    recorder = Recorder()
    profiler = bound(Profiler(cyclic_schedule(), [recorder], **NO_SYSTEM, **NO_DEVICE), state)
    fire(profiler, state, Event.FIT_START)
    closed = []

    def source():
        try:
            yield from range(10)
        finally:
            closed.append(True)

    items = profiler.marked_iter("dataloader/train", source())
    assert [next(items) for _ in range(3)] == [0, 1, 2]
    items.close()
    assert closed == [True]
    assert [(name, is_start) for name, is_start, _ in recorder.durations] == [("dataloader/train", True),
                                                                             ("dataloader/train", False)] * 3


# ---- windows ----------------------------------------------------------------------------------------------------
def test_window_without_active_and_save_is_written_at_the_epoch_end_and_at_fit_end(tmp_path):
    # no len(): the schedule cannot tell the epoch's last batch, so the window is still open when the epoch ends
    state = make_state(total_steps=6, steps_per_epoch=None)
    handler = JSONTraceHandler(folder=str(tmp_path), merged_trace_filename=None)
    profiler = bound(Profiler(cyclic_schedule(warmup=1, active=10), [handler], **NO_SYSTEM, **NO_DEVICE), state)
    fire(profiler, state, Event.FIT_START, Event.EPOCH_START)
    for _ in range(3):
        fire(profiler, state, Event.BATCH_START)
        state.timestamp = state.timestamp.to_next_batch(samples=8)
        fire(profiler, state, Event.BATCH_END)
    state.timestamp = state.timestamp.to_next_epoch()
    fire(profiler, state, Event.EPOCH_END, Event.EPOCH_START, Event.BATCH_START)
    state.timestamp = state.timestamp.to_next_batch(samples=8)
    fire(profiler, state, Event.BATCH_END, Event.FIT_END)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["ep1-ba3-rank0.json", "ep1-ba4-rank0.json"]
    steps = [e["args"]["batch"] for e in trace_events(tmp_path / "ep1-ba3-rank0.json") if e["name"] == "event/batch"]
    assert steps == [0, 1, 2]


def test_a_schedule_that_leaves_a_window_without_saving_gets_it_written(tmp_path):
    state = make_state(total_steps=6, steps_per_epoch=None)
    recorder = Recorder()
    plan = {0: W, 1: A, 2: S, 3: A, 4: Z}
    profiler = bound(Profiler(lambda s: plan.get(int(s.timestamp.batch), S), [recorder], **NO_SYSTEM,
                              torch_prof_folder=str(tmp_path)), state)
    fire(profiler, state, Event.FIT_START, Event.EPOCH_START)
    for _ in range(6):
        fire(profiler, state, Event.BATCH_START)
        state.timestamp = state.timestamp.to_next_batch(samples=8)
        fire(profiler, state, Event.BATCH_END)
    fire(profiler, state, Event.FIT_END)
    assert recorder.windows == [2, 5]  # closed when batch 2 was skipped; saved after batch 4
    assert [p.name for p in profiler.device_traces] == ["rank0.2", "rank0.5"]


def test_num_traces_to_keep_and_no_merged_file(tmp_path):
    state = make_state(total_steps=15, steps_per_epoch=5)
    handler = JSONTraceHandler(folder=str(tmp_path / "json"), merged_trace_filename=None, num_traces_to_keep=1)
    profiler = bound(Profiler(cyclic_schedule(warmup=0, active=1), [handler], **NO_SYSTEM,
                              torch_prof_folder=str(tmp_path / "dev"), torch_prof_num_traces_to_keep=1), state)
    fake_fit(profiler, state, epochs=3)
    assert [p.name for p in (tmp_path / "json").iterdir()] == ["ep2-ba11-rank0.json"]
    assert [p.name for p in (tmp_path / "dev").iterdir()] == ["rank0.11"]
    assert [int(ts.batch) for ts, _ in handler.saved_traces] == [11]


def test_flush_stops_a_running_device_trace_when_fit_is_cut_short(tmp_path):
    state = make_state(total_steps=10, steps_per_epoch=None)
    recorder = Recorder()
    profiler = bound(Profiler(cyclic_schedule(warmup=0, active=4), [recorder], **NO_SYSTEM,
                              torch_prof_folder=str(tmp_path)), state)
    fire(profiler, state, Event.FIT_START, Event.EPOCH_START, Event.BATCH_START)
    profiler.flush()  # as the Trainer's fit does in its `finally`, after an exception in the step
    assert recorder.windows == [0] and [p.name for p in profiler.device_traces] == ["rank0.0"]
    profiler.flush()  # nothing open: nothing happens


def test_device_trace_already_taken_by_the_user_warns_and_keeps_the_json_trace(tmp_path, monkeypatch):
    def busy(*args, **kwargs):
        raise RuntimeError("Profile has already been started. Only one profile may be run at a time.")

    monkeypatch.setattr(jax.profiler, "start_trace", busy)
    state = make_state(total_steps=5, steps_per_epoch=5)
    handler = JSONTraceHandler(folder=str(tmp_path / "json"))
    profiler = bound(Profiler(cyclic_schedule(), [handler], **NO_SYSTEM, torch_prof_folder=str(tmp_path / "dev")),
                     state)
    with pytest.warns(RuntimeWarning, match="device trace of this window was not taken"):
        fake_fit(profiler, state, epochs=1)
    assert profiler.device_traces == [] and len(handler.saved_traces) == 1


def test_device_trace_is_off_when_composers_torch_flags_are_all_false(tmp_path, monkeypatch):
    monkeypatch.setattr(jax.profiler, "start_trace", lambda *a, **k: pytest.fail("no device trace was asked for"))
    state = make_state(total_steps=5, steps_per_epoch=5)
    profiler = bound(Profiler(cyclic_schedule(), [Recorder()], **NO_SYSTEM, **NO_DEVICE,
                              torch_prof_folder=str(tmp_path / "dev")), state)
    fake_fit(profiler, state, epochs=1)
    assert not (tmp_path / "dev").exists()


# ---- what is refused ---------------------------------------------------------------------------------------------
@pytest.mark.parametrize("kwargs, match", [
    (dict(remote_file_name="{run_name}/traces/x.json"), "remote_file_name"),
    (dict(merged_trace_remote_file_name="s3://bucket/merged.json"), "merged_trace_remote_file_name"),
    (dict(filename="ep{epoch}-{nonsense}.json"), "nonsense"),
    (dict(num_traces_to_keep=-2), "num_traces_to_keep"),
])
def test_json_trace_handler_refuses(kwargs, match):
    with pytest.raises(ValueError, match=match):
        JSONTraceHandler(**kwargs)


def test_json_trace_handler_without_overwrite_needs_an_empty_folder(tmp_path):
    (tmp_path / "old.json").write_text("{}")
    state = make_state()
    profiler = Profiler(cyclic_schedule(), [JSONTraceHandler(folder=str(tmp_path))], **NO_SYSTEM, **NO_DEVICE)
    with pytest.raises(FileExistsError, match="overwrite=True"):
        bound(profiler, state)
    bound(Profiler(cyclic_schedule(), [JSONTraceHandler(folder=str(tmp_path), overwrite=True)], **NO_SYSTEM,
                   **NO_DEVICE), make_state())


@pytest.mark.parametrize("kwargs, match", [
    (dict(torch_prof_remote_file_name="{run_name}/torch_traces/x"), "torch_prof_remote_file_name"),
    (dict(torch_prof_memory_remote_file_name="s3://b/x.html"), "torch_prof_memory_remote_file_name"),
    (dict(torch_prof_memory_filename="memory.html"), "memory timeline"),
    (dict(sys_prof_stats_thread_interval_seconds=0), "interval"),
    (dict(sys_prof_memory="yes"), "sys_prof_memory"),
    (dict(torch_prof_num_traces_to_keep=-5), "torch_prof_num_traces_to_keep"),
    (dict(torch_prof_filename="rank{rank}.{unknown}"), "unknown"),
    (dict(trace_handlers=[object()]), "TraceHandler"),
    (dict(schedule="cyclic"), "schedule"),
])
def test_profiler_refuses(kwargs, match):
    args = dict(schedule=cyclic_schedule(), trace_handlers=[]) | kwargs
    with pytest.raises(ValueError, match=match):
        Profiler(**args)


def test_one_profiler_per_run():
    profiler = bound(Profiler(cyclic_schedule(), [], **NO_SYSTEM, **NO_DEVICE), make_state())
    with pytest.raises(RuntimeError, match="one Profiler per Trainer"):
        bound(profiler, make_state())


def test_composer_script_arguments_are_accepted(tmp_path):
    # the call of a Composer script, imports changed only
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        profiler = Profiler(trace_handlers=[JSONTraceHandler(folder=str(tmp_path / "traces"), overwrite=True)],
                            schedule=cyclic_schedule(wait=0, warmup=1, active=4, repeat=1),
                            torch_prof_folder=str(tmp_path / "torch"), torch_prof_overwrite=True,
                            torch_prof_filename="rank{rank}.{batch}.pt.trace.json", torch_prof_use_gzip=True)
    state = make_state(total_steps=5, steps_per_epoch=5)
    bound(profiler, state)
    fake_fit(profiler, state, epochs=1)
    assert [p.name for p in profiler.device_traces] == ["rank0.5"]  # Composer's file name, as the window's folder
    assert [p.name for p in sorted((tmp_path / "traces").iterdir())] == ["ep0-ba5-rank0.json", "merged_trace.json"]


def test_trainer_with_composers_profiler_writes_its_phases(tmp_path):
    """Composer's call, ``Trainer(profiler=Profiler(...))``: the window's JSON trace holds the loop's phases (the
    compiled step, waiting for data, the evaluation) and the device trace folder holds jax.profiler's trace."""
    import numpy as np
    from flax import nnx

    from jaxcomposer import ComposerClassifier, Trainer
    from jaxcomposer.errors import ConfigurationError
    from jaxcomposer.models import MLP

    rng = np.random.default_rng(0)
    batches = [{"input": rng.normal(size=(8, 6)).astype(np.float32), "target": rng.integers(0, 3, 8).astype(np.int32)}
               for _ in range(4)]
    profiler = Profiler(schedule=cyclic_schedule(wait=0, warmup=1, active=2, repeat=1),
                        trace_handlers=[JSONTraceHandler(folder=str(tmp_path / "traces"), overwrite=True)],
                        torch_prof_folder=str(tmp_path / "device"), torch_prof_overwrite=True)
    trainer = Trainer(model=ComposerClassifier(MLP(6, (8,), 3, rngs=nnx.Rngs(0)), num_classes=3),
                      train_dataloader=batches, eval_dataloader=batches[:1], max_duration="1ep", progress_bar=False,
                      profiler=profiler)
    assert trainer.state.profiler is profiler
    trainer.fit()
    files = sorted(p.name for p in (tmp_path / "traces").iterdir())
    assert "ep0-ba3-rank0.json" in files  # the window: warmup at batch 1, active at 2 and 3, saved after 3
    names = {e["name"] for e in json.loads((tmp_path / "traces" / "ep0-ba3-rank0.json").read_text())["traceEvents"]}
    assert {"step", "dataloader/train", "event/batch"} <= names
    assert list((tmp_path / "device").rglob("*.xplane.pb"))
    with pytest.raises(ConfigurationError, match="profiler: got object"):
        Trainer(model=ComposerClassifier(MLP(6, (8,), 3, rngs=nnx.Rngs(0)), num_classes=3),
                train_dataloader=batches, max_duration="1ep", profiler=object())
