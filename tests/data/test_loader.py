"""ArrayLoader (permutation, epochs, exact resume, transforms, errors) and prefetch_to_device."""

import gc
import json
import threading
import time

import jax
import numpy as np
import pytest
from jax.sharding import Mesh, NamedSharding
from jax.sharding import PartitionSpec as P

from jaxcomposer.data import ArrayLoader, TokenWindows, prefetch_to_device


def _arrays(n=50):
    return {"x": np.arange(n * 3, dtype=np.float32).reshape(n, 3), "y": np.arange(n, dtype=np.int32)}


def _epoch_ids(loader):
    return [b["y"].copy() for b in loader]


# -- permutation and epochs ----------------------------------------------------------------------------------
def test_batches_gather_rows_consistently_and_sizes():
    loader = ArrayLoader(_arrays(50), 8, seed=1)
    assert len(loader) == 6 and loader.num_samples == 50
    for batch in loader:
        assert batch["x"].shape == (8, 3) and batch["x"].dtype == np.float32 and batch["y"].dtype == np.int32
        np.testing.assert_array_equal(batch["x"][:, 0], batch["y"] * 3)  # same rows picked from every array


def test_permutation_is_pure_function_of_seed_and_epoch():
    a, b = ArrayLoader(_arrays(), 8, seed=7), ArrayLoader(_arrays(), 8, seed=7)
    b.set_epoch(3)
    b.set_epoch(0)
    assert [x.tolist() for x in _epoch_ids(a)] == [x.tolist() for x in _epoch_ids(b)]
    for epoch in (0, 1, 5):
        a2, b2 = ArrayLoader(_arrays(), 8, seed=7), ArrayLoader(_arrays(), 8, seed=7)
        a2.set_epoch(epoch)
        b2.set_epoch(epoch)
        np.testing.assert_array_equal(np.concatenate(_epoch_ids(a2)), np.concatenate(_epoch_ids(b2)))
        fresh = ArrayLoader(_arrays(), 8, seed=7)
        np.testing.assert_array_equal(np.concatenate(a2.epoch_indices(epoch)), np.concatenate(fresh.epoch_indices(epoch)))
    seed7 = np.concatenate(ArrayLoader(_arrays(), 8, seed=7).epoch_indices(0))
    assert not np.array_equal(np.concatenate(_epoch_ids(ArrayLoader(_arrays(), 8, seed=8))), seed7)


def test_every_example_exactly_once_per_epoch_without_drop_last():
    loader = ArrayLoader(_arrays(50), 8, seed=3, drop_last=False)
    assert len(loader) == 7
    for epoch in range(3):
        loader.set_epoch(epoch)
        batches = _epoch_ids(loader)
        assert [len(b) for b in batches] == [8] * 6 + [2]
        np.testing.assert_array_equal(np.sort(np.concatenate(batches)), np.arange(50))


def test_drop_last_yields_distinct_full_batches():
    batches = _epoch_ids(ArrayLoader(_arrays(50), 8, seed=3))
    ids = np.concatenate(batches)
    assert len(ids) == 48 and len(np.unique(ids)) == 48


def test_epochs_differ_and_loop_auto_advances():
    loader = ArrayLoader(_arrays(), 10, seed=0)
    first, second = np.concatenate(_epoch_ids(loader)), np.concatenate(_epoch_ids(loader))
    assert loader.epoch == 2
    assert not np.array_equal(first, second)
    loader.set_epoch(1)
    np.testing.assert_array_equal(np.concatenate(_epoch_ids(loader)), second)


def test_no_shuffle_is_in_order():
    ids = np.concatenate(_epoch_ids(ArrayLoader(_arrays(23), 5, shuffle=False, drop_last=False)))
    np.testing.assert_array_equal(ids, np.arange(23))


# -- resume --------------------------------------------------------------------------------------------------
def test_resume_mid_epoch_yields_exactly_the_remaining_batches():
    reference = ArrayLoader(_arrays(), 6, seed=11)
    reference.set_epoch(2)
    expected = _epoch_ids(reference)

    loader = ArrayLoader(_arrays(), 6, seed=11)
    loader.set_epoch(2)
    it = iter(loader)
    seen = [next(it)["y"].copy() for _ in range(3)]
    state = json.loads(json.dumps(loader.get_state()))  # must survive a JSON round trip
    assert state["epoch"] == 2 and state["batch_index"] == 3

    resumed = ArrayLoader(_arrays(), 6, seed=11)
    resumed.set_state(state)
    resumed.set_epoch(2)  # a trainer re-announcing the current epoch must not lose the position
    rest = _epoch_ids(resumed)
    assert len(rest) == len(expected) - 3
    for got, want in zip(seen + rest, expected):
        np.testing.assert_array_equal(got, want)
    assert resumed.get_state()["epoch"] == 3 and resumed.get_state()["batch_index"] == 0


def test_resume_skips_without_gathering():
    class CountingArray:
        shape = (40, 2)

        def __init__(self):
            self.calls = 0

        def __getitem__(self, idx):
            self.calls += 1
            return np.stack([idx, idx], axis=1)

    arr = CountingArray()
    loader = ArrayLoader({"x": arr}, 4, seed=0)
    loader.set_state({"epoch": 0, "batch_index": 8})
    assert len(list(loader)) == 2 and arr.calls == 2


def test_state_after_last_batch_points_to_next_epoch_and_break_keeps_position():
    loader = ArrayLoader(_arrays(20), 5, seed=0)
    it = iter(loader)
    for _ in range(4):
        next(it)
    assert loader.get_state()["epoch"] == 1 and loader.get_state()["batch_index"] == 0
    it2 = iter(loader)
    next(it2)
    del it2  # consumer stopped early
    assert loader.get_state()["batch_index"] == 1
    assert len(list(loader)) == 3  # continues, does not restart


def test_set_state_validates():
    loader = ArrayLoader(_arrays(20), 5, seed=0)
    with pytest.raises(ValueError, match="seed=1"):
        loader.set_state({"epoch": 0, "batch_index": 1, "seed": 1})
    with pytest.raises(ValueError, match="missing"):
        loader.set_state({"epoch": 0})
    with pytest.raises(ValueError, match="batch_index=9"):
        loader.set_state({"epoch": 0, "batch_index": 9})


# -- transform -----------------------------------------------------------------------------------------------
def _noise(batch, rng):
    return {**batch, "x": batch["x"] + rng.standard_normal(batch["x"].shape).astype(np.float32)}


def test_transform_is_deterministic_and_resumable():
    full = [b["x"] for b in ArrayLoader(_arrays(), 5, seed=4, transform=_noise)]
    again = [b["x"] for b in ArrayLoader(_arrays(), 5, seed=4, transform=_noise)]
    for a, b in zip(full, again):
        np.testing.assert_array_equal(a, b)
    resumed = ArrayLoader(_arrays(), 5, seed=4, transform=_noise)
    resumed.set_state({"epoch": 0, "batch_index": 6})
    for a, b in zip(full[6:], [b["x"] for b in resumed], strict=True):
        np.testing.assert_array_equal(a, b)
    assert not np.allclose(full[0] - full[0].round(), full[1] - full[1].round())  # fresh noise per batch


# -- validation ----------------------------------------------------------------------------------------------
def test_argument_errors_are_clear():
    with pytest.raises(ValueError, match="batch_size must be a positive int"):
        ArrayLoader(_arrays(), 0)
    with pytest.raises(ValueError, match="dataset is empty"):
        ArrayLoader({"x": np.zeros((0, 3))}, 4)
    with pytest.raises(ValueError, match=r"batch_size=64.*dataset size 50.*batch_size <= 50 or drop_last=False"):
        ArrayLoader(_arrays(50), 64)
    assert len(ArrayLoader(_arrays(50), 64, drop_last=False)) == 1
    with pytest.raises(ValueError, match=r"'x': 50, 'y': 49"):
        ArrayLoader({"x": np.zeros((50, 2)), "y": np.zeros(49)}, 4)
    with pytest.raises(ValueError, match="worker_count"):
        ArrayLoader(_arrays(), 4, worker_count=-1)


def test_accepts_lazy_token_windows():
    tokens = np.arange(101, dtype=np.uint8)
    loader = ArrayLoader({"input_ids": TokenWindows(tokens, 10)}, 3, shuffle=False, drop_last=False)
    batches = list(loader)
    assert loader.num_samples == 10 and batches[0]["input_ids"].shape == (3, 11)
    assert batches[0]["input_ids"].dtype == np.int32
    np.testing.assert_array_equal(batches[0]["input_ids"][1], np.arange(10, 21))


# -- prefetch_to_device --------------------------------------------------------------------------------------
def test_prefetch_preserves_order_and_values():
    loader = ArrayLoader(_arrays(40), 4, seed=2)
    expected = list(ArrayLoader(_arrays(40), 4, seed=2))
    got = list(prefetch_to_device(loader, size=3))
    assert len(got) == len(expected)
    for g, e in zip(got, expected):
        assert isinstance(g["x"], jax.Array)
        np.testing.assert_array_equal(np.asarray(g["x"]), e["x"])
        np.testing.assert_array_equal(np.asarray(g["y"]), e["y"])


def test_prefetch_places_with_the_given_function():
    batches = [{"x": np.full((2,), i)} for i in range(3)]
    got = list(prefetch_to_device(iter(batches), place=lambda b: {"x": b["x"] + 10}))
    assert [int(g["x"][0]) for g in got] == [10, 11, 12]


def test_prefetch_propagates_exceptions_in_position():
    def source():
        yield {"a": np.ones(2)}
        yield {"a": np.ones(2)}
        raise RuntimeError("boom at 2")

    it = prefetch_to_device(source(), size=2)
    assert len([next(it), next(it)]) == 2
    with pytest.raises(RuntimeError, match="boom at 2"):
        next(it)


def test_prefetch_with_named_sharding_over_two_devices():
    assert jax.device_count() == 2
    mesh = Mesh(np.array(jax.devices()), ("data",))
    sharding = NamedSharding(mesh, P("data"))
    expected = list(ArrayLoader(_arrays(40), 8, seed=5))
    got = list(prefetch_to_device(ArrayLoader(_arrays(40), 8, seed=5), sharding=sharding))
    assert len(got) == 5
    for g, e in zip(got, expected):
        assert g["x"].sharding == sharding and len(g["x"].addressable_shards) == 2
        assert g["x"].addressable_shards[0].data.shape == (4, 3)
        np.testing.assert_array_equal(np.asarray(g["x"]), e["x"])


def _prefetch_threads():
    return [t for t in threading.enumerate() if t.name == "jaxcomposer-prefetch" and t.is_alive()]


def _wait_no_prefetch_threads(timeout=5.0):
    deadline = time.monotonic() + timeout
    while _prefetch_threads() and time.monotonic() < deadline:
        time.sleep(0.02)
    return not _prefetch_threads()


def test_prefetch_stops_thread_on_break_and_on_garbage_collection():
    closed = threading.Event()

    def endless():
        try:
            i = 0
            while True:
                yield {"i": np.array([i])}
                i += 1
        finally:
            closed.set()

    it = prefetch_to_device(endless(), size=2)
    assert int(next(it)["i"][0]) == 0
    it.close()
    assert _wait_no_prefetch_threads() and closed.is_set()

    it = prefetch_to_device(endless(), size=2)
    next(it)
    del it
    gc.collect()
    assert _wait_no_prefetch_threads()


def test_prefetch_rejects_bad_size():
    with pytest.raises(ValueError, match="size"):
        next(prefetch_to_device([], size=0))


def test_process_shards_together_yield_the_one_process_batches_with_the_same_transform_draws():
    from jaxcomposer.data import ArrayLoader
    data = {"x": np.arange(40, dtype=np.float32).reshape(20, 2), "y": np.arange(20)}
    noisy = lambda batch, rng: {**batch, "x": batch["x"] + rng.normal(size=batch["x"].shape)}
    whole = ArrayLoader(data, 8, shuffle=True, seed=4, drop_last=True, transform=noisy)
    parts = [ArrayLoader(data, 8, shuffle=True, seed=4, drop_last=True, transform=noisy).shard_for_processes(i, 2)
             for i in range(2)]
    for epoch in range(2):
        for loader in (whole, *parts):
            loader.set_epoch(epoch)
        for full, a, b in zip(whole, *parts):
            assert a["y"].shape == (4,)
            for k in full:
                np.testing.assert_array_equal(np.concatenate([a[k], b[k]]), full[k])
    from jaxcomposer.errors import DataError
    with pytest.raises(DataError, match="batch_size=8 does not split evenly over 3 processes"):
        whole.shard_for_processes(0, 3)
