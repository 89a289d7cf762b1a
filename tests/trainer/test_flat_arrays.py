"""Small states as ``.npz`` checkpoint items (jaxcomposer/trainer/flat_arrays.py): which states take that format,
exact round trips of every dtype, and the same restored bits whichever format wrote them."""
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxcomposer.core.state import TrainState
from jaxcomposer.core.time import Timestamp
from jaxcomposer.errors import CheckpointError
from jaxcomposer.trainer import flat_arrays
from jaxcomposer.trainer.checkpoint import CheckpointStore, save_checkpoint, restore


def _state(n=6) -> TrainState:
    k = jax.random.split(jax.random.PRNGKey(3), 4)
    return TrainState(step=jnp.asarray(5, jnp.int32), key=jax.random.PRNGKey(9),
                      params={"dense": {"kernel": jax.random.normal(k[0], (n, 3)),
                                        "bias": jax.random.normal(k[1], (3,)).astype(jnp.bfloat16)}},
                      model_state={"bn": {"count": jnp.asarray(7, jnp.uint32)}},
                      opt_state={"momentum": jax.random.normal(k[2], (n, 3))},
                      extras={"ema": {"on": jnp.asarray(True)}})


def _zeros_like(state: TrainState) -> TrainState:
    return jax.tree.map(jnp.zeros_like, state)


def _assert_same_bits(a, b):
    la, lb = jax.tree_util.tree_leaves(a), jax.tree_util.tree_leaves(b)
    assert len(la) == len(lb)
    for x, y in zip(la, lb):
        assert x.dtype == y.dtype and x.shape == y.shape
        assert np.asarray(x).tobytes() == np.asarray(y).tobytes()


def test_every_dtype_round_trips_bit_for_bit(tmp_path):
    arrays = {"f32": np.float32([1.5, -0.0, np.inf]), "bf16": np.asarray(jnp.array([1.0, -2.5, 3e38], jnp.bfloat16)),
              "f8": np.asarray(jnp.array([0.5, -1.0], jnp.float8_e4m3fn)), "i64": np.int64([-(2 ** 40)]),
              "u32": np.uint32(7), "bool": np.array([True, False]), "empty": np.zeros((0, 3), np.float16)}
    flat_arrays.write(tmp_path / "a.npz", arrays)
    back = flat_arrays.read(tmp_path / "a.npz")
    assert set(back) == set(arrays)
    for name, x in arrays.items():
        x = np.asarray(x)
        assert back[name].dtype == x.dtype and back[name].shape == x.shape, name
        assert back[name].tobytes() == x.tobytes(), name


def test_which_states_take_the_npz_format():
    state = _state()
    assert flat_arrays.is_small_state(state)
    assert not flat_arrays.is_small_state(state, limit_bytes=0)  # 0: always orbax's format
    size = sum(x.size * x.dtype.itemsize for x in jax.tree_util.tree_leaves(state))
    assert flat_arrays.is_small_state(state, limit_bytes=size) and not flat_arrays.is_small_state(state, size - 1)
    assert not flat_arrays.is_small_state(state._replace(key=jax.random.key(0)))  # typed keys: no host array
    assert not flat_arrays.is_small_state(state._replace(extras={"count": 3}))  # a Python scalar: orbax's format


def test_store_writes_npz_items_and_both_formats_restore_the_same_bits(tmp_path):
    state = _state()
    for name, limit in (("npz", flat_arrays.SMALL_STATE_BYTES), ("orbax", 0)):
        store = CheckpointStore(tmp_path / name, small_state_bytes=limit)
        store.save(5, state, Timestamp())
        store.close()
        item_files = {p.name for p in (tmp_path / name / "5" / "train").iterdir()}
        assert (flat_arrays.FILE in item_files) == (name == "npz"), item_files
    from_npz, ts, _ = CheckpointStore(tmp_path / "npz").restore(5, _zeros_like(state))
    from_orbax, _, _ = CheckpointStore(tmp_path / "orbax").restore(5, _zeros_like(state))
    assert ts == Timestamp()
    _assert_same_bits(from_npz, state)
    _assert_same_bits(from_orbax, state)


def test_save_checkpoint_directory_in_npz_format_restores_and_detects_a_mismatch(tmp_path):
    state = _state()
    path = save_checkpoint(tmp_path / "ck", state, Timestamp())
    assert (path / "weights" / flat_arrays.FILE).is_file() and (path / "train" / flat_arrays.FILE).is_file()
    restored, _, _ = restore(path, _zeros_like(state))
    _assert_same_bits(restored, state)
    with pytest.raises(CheckpointError, match=r"params\.dense\.kernel: checkpoint has \(6, 3\) float32, the model/recipe "
                                        r"has \(4, 3\) float32"):
        restore(path, _zeros_like(_state(n=4)))
