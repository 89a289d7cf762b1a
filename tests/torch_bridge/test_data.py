"""torch_bridge.data: torch Dataset/DataLoader -> numpy dict batches with the ArrayLoader protocol."""

from __future__ import annotations

import multiprocessing
import warnings

import jax  # noqa: F401  (the fork warning is about JAX being imported)
import numpy as np
import pytest
import torch
from torch.utils.data import DataLoader, Dataset, DistributedSampler, IterableDataset, TensorDataset

from jaxcomposer.data.loader import ArrayLoader
from tests.torch_bridge.worker_datasets import PairDataset
from torch_bridge.data import DataLoaderWrapper, DatasetLoader, from_dataloader, from_dataset, numpy_collate, to_numpy


class DictDataset(Dataset):
    def __init__(self, n: int = 10):
        self.n = n

    def __len__(self):
        return self.n

    def __getitem__(self, i):
        return {"image": np.full((2, 2), i, np.float64), "label": i, "meta": {"weight": float(i) / 2}}


class Stream(IterableDataset):
    def __iter__(self):
        return iter(range(5))


def _ids(batches, key="target"):
    return [b[key].tolist() for b in batches]


def _assert_numpy_tree(tree):
    for leaf in jax.tree_util.tree_leaves(tree):
        assert isinstance(leaf, np.ndarray) and not isinstance(leaf, torch.Tensor), type(leaf)


# ---- conversion -------------------------------------------------------------------------------------------------
def test_to_numpy_dtypes_and_structures():
    out = to_numpy((torch.zeros(2, 3, dtype=torch.float64), torch.arange(2)))
    assert set(out) == {"input", "target"}
    assert out["input"].dtype == np.float32 and out["target"].dtype == np.int32
    assert to_numpy(torch.ones(2, dtype=torch.bfloat16))["input"].dtype.name == "bfloat16"
    assert to_numpy(torch.ones(2, dtype=torch.uint8))["input"].dtype == np.uint8
    nested = to_numpy({"a": torch.ones(2, requires_grad=True), "b": {"c": [1, 2]}})
    assert nested["a"].dtype == np.float32 and nested["b"]["c"].dtype == np.int32
    _assert_numpy_tree(nested)
    with pytest.raises(ValueError, match="keys"):
        to_numpy((torch.ones(1), torch.ones(1), torch.ones(1)))
    with pytest.raises(TypeError, match="numeric"):
        to_numpy({"name": "abc"})


def test_numpy_collate_python_scalars_and_keys():
    out = numpy_collate([(1.5, 3), (2.5, 4)], keys=("x", "y"))
    np.testing.assert_array_equal(out["x"], np.array([1.5, 2.5], np.float32))
    assert out["x"].dtype == np.float32 and out["y"].dtype == np.int32 and out["y"].shape == (2,)
    single = numpy_collate([torch.ones(3), torch.zeros(3)])
    assert list(single) == ["input"] and single["input"].shape == (2, 3)


# ---- from_dataset -----------------------------------------------------------------------------------------------
def test_from_dataset_numpy_only_and_dtypes():
    loader = from_dataset(PairDataset(12), 4, seed=1)
    assert isinstance(loader, DatasetLoader)
    assert len(loader) == 3 and loader.batch_size == 4 and loader.num_samples == 12
    batches = list(loader)
    assert len(batches) == 3
    for b in batches:
        _assert_numpy_tree(b)
        assert b["input"].shape == (4, 3) and b["input"].dtype == np.float32
        assert b["target"].shape == (4,) and b["target"].dtype == np.int32
        np.testing.assert_array_equal(b["input"][:, 0], b["target"].astype(np.float32))  # pairs stay together


@pytest.mark.parametrize("read_threads", [1, 3])
@pytest.mark.parametrize("shuffle", [True, False])
def test_every_example_once_per_epoch(read_threads, shuffle):
    loader = from_dataset(PairDataset(10), 4, drop_last=False, shuffle=shuffle, read_threads=read_threads)
    assert len(loader) == 3
    for _ in range(2):
        batches = list(loader)
        assert [len(b["target"]) for b in batches] == [4, 4, 2]
        seen = np.concatenate([b["target"] for b in batches])
        assert sorted(seen.tolist()) == list(range(10))
        if not shuffle:
            assert seen.tolist() == list(range(10))
    # drop_last: only full batches, no example twice
    dropped = np.concatenate([b["target"] for b in from_dataset(PairDataset(10), 4, drop_last=True)])
    assert len(dropped) == 8 and len(set(dropped.tolist())) == 8


def test_read_threads_preserve_order():
    a = _ids(from_dataset(PairDataset(40), 8, seed=5, read_threads=1))
    b = _ids(from_dataset(PairDataset(40), 8, seed=5, read_threads=4))
    assert a == b


def test_determinism_per_seed_and_epoch():
    def epoch(seed, e):
        loader = from_dataset(PairDataset(32), 8, seed=seed)
        loader.set_epoch(e)
        return _ids(loader)

    assert epoch(0, 0) == epoch(0, 0)
    assert epoch(0, 3) == epoch(0, 3)
    assert epoch(0, 0) != epoch(0, 1)
    assert epoch(0, 0) != epoch(1, 0)
    loader = from_dataset(PairDataset(32), 8, seed=0)
    first, second = _ids(loader), _ids(loader)  # a plain loop advances the epoch
    assert first == epoch(0, 0) and second == epoch(0, 1)
    assert [ix.tolist() for ix in loader.epoch_indices(1)] == second


def test_tensor_dataset_matches_array_loader_order():
    x = torch.randn(20, 3, dtype=torch.float64)
    y = torch.arange(20)
    ours = from_dataset(TensorDataset(x, y), 5, seed=7)
    ref = ArrayLoader({"input": x.numpy().astype(np.float32), "target": y.numpy().astype(np.int32)}, 5, seed=7)
    for _ in range(2):
        for a, b in zip(ours, ref, strict=True):
            assert a["target"].dtype == np.int32 and a["input"].dtype == np.float32
            np.testing.assert_array_equal(a["target"], b["target"])
            np.testing.assert_array_equal(a["input"], b["input"])


def test_exact_mid_epoch_resume():
    def make():
        return from_dataset(PairDataset(30), 4, seed=3, drop_last=False)

    reference = make()
    full = _ids(reference) + _ids(reference)  # two epochs of 8 batches
    assert len(full) == 16
    first = make()
    consumed = []
    for i, b in enumerate(first):
        consumed.append(b["target"].tolist())
        if i == 2:
            break
    state = first.get_state()
    assert state["epoch"] == 0 and state["batch_index"] == 3
    resumed = make()
    resumed.set_state(state)
    resumed.set_epoch(0)  # a trainer calling set_epoch for the current epoch keeps the position
    rest = _ids(resumed)
    assert consumed + rest == full[:8]
    assert _ids(resumed) == full[8:]
    # the Trainer's form: only epoch and batch_index, and the end-of-epoch position rolls over
    other = make()
    other.set_state({"epoch": 1, "batch_index": 5})
    assert _ids(other) == full[13:]
    other.set_state({"epoch": 0, "batch_index": 8})
    assert other.get_state()["epoch"] == 1 and other.get_state()["batch_index"] == 0


def test_set_state_validation():
    loader = from_dataset(PairDataset(8), 4)
    with pytest.raises(ValueError, match="missing"):
        loader.set_state({"epoch": 0})
    with pytest.raises(ValueError, match="seed=9"):
        loader.set_state({"epoch": 0, "batch_index": 0, "seed": 9})
    with pytest.raises(ValueError, match="invalid loader position"):
        loader.set_state({"epoch": 0, "batch_index": 3})


def test_dict_examples_and_transform():
    def transform(batch, rng):
        return {**batch, "noise": rng.normal(size=len(batch["label"])).astype(np.float32)}

    loader = from_dataset(DictDataset(10), 5, seed=2, transform=transform)
    batches = list(loader)
    assert len(batches) == 2
    for b in batches:
        assert set(b) == {"image", "label", "meta", "noise"}
        assert b["image"].shape == (5, 2, 2) and b["image"].dtype == np.float32
        assert b["label"].dtype == np.int32 and b["meta"]["weight"].dtype == np.float32
        np.testing.assert_allclose(b["meta"]["weight"], b["label"] / 2)
        _assert_numpy_tree(b)
    again = from_dataset(DictDataset(10), 5, seed=2, transform=transform)
    again.set_state({"epoch": 0, "batch_index": 1})
    np.testing.assert_array_equal(next(iter(again))["noise"], batches[1]["noise"])  # transform rng resumes too


def test_custom_collate_output_is_converted():
    def collate(examples):  # returns torch tensors as a tuple, like torch's default_collate
        return torch.stack([e[0] for e in examples]), torch.stack([e[1] for e in examples])

    b = next(iter(from_dataset(PairDataset(6), 3, collate=collate, keys=("x", "y"))))
    assert set(b) == {"x", "y"} and b["x"].dtype == np.float32 and b["y"].dtype == np.int32


def test_from_dataset_errors():
    with pytest.raises(ValueError, match="empty"):
        from_dataset(PairDataset(0), 2)
    with pytest.raises(ValueError, match="larger than the dataset size 5.*drop_last=False"):
        from_dataset(PairDataset(5), 8)
    assert len(from_dataset(PairDataset(5), 8, drop_last=False)) == 1
    with pytest.raises(TypeError, match="map-style.*from_dataloader"):
        from_dataset(Stream(), 2)
    with pytest.raises(TypeError, match="map-style.*from_dataloader"):
        from_dataset(iter([1, 2, 3]), 2)
    with pytest.raises(TypeError, match="from_dataloader"):
        from_dataset(DataLoader(PairDataset(4)), 2)
    with pytest.raises(ValueError, match="batch_size"):
        from_dataset(PairDataset(4), 0)
    with pytest.raises(ValueError, match="read_threads"):
        from_dataset(PairDataset(4), 2, read_threads=0)
    with pytest.raises(ValueError, match="from_dataloader"):
        from_dataset(PairDataset(4), 2, worker_count=2)
    with pytest.raises(ValueError, match="keys"):
        from_dataset(PairDataset(4), 2, keys="input")
    with pytest.raises(ValueError, match="keys=.*one name per item"):
        next(iter(from_dataset(PairDataset(4), 2, keys=("only",))))


# ---- from_dataloader --------------------------------------------------------------------------------------------
def test_from_dataloader_tensor_dataset():
    x, y = torch.randn(10, 4, dtype=torch.float64), torch.arange(10)
    dl = DataLoader(TensorDataset(x, y), batch_size=4, shuffle=False, num_workers=0)
    loader = from_dataloader(dl)
    assert isinstance(loader, DataLoaderWrapper)
    assert len(loader) == 3 and loader.batch_size == 4 and loader.num_samples == 10
    batches = list(loader)
    assert [len(b["target"]) for b in batches] == [4, 4, 2]
    for b in batches:
        _assert_numpy_tree(b)
        assert b["input"].dtype == np.float32 and b["target"].dtype == np.int32
    np.testing.assert_array_equal(np.concatenate([b["target"] for b in batches]), np.arange(10))
    np.testing.assert_allclose(np.concatenate([b["input"] for b in batches]), x.numpy().astype(np.float32))
    assert loader.get_state() == {"epoch": 1, "batch_index": 0}
    # dict batches and custom keys
    dict_dl = DataLoader(DictDataset(4), batch_size=2)
    b = next(iter(from_dataloader(dict_dl)))
    assert b["image"].shape == (2, 2, 2) and b["label"].dtype == np.int32
    assert set(next(iter(from_dataloader(dl, keys=("a", "b"))))) == {"a", "b"}
    with pytest.raises(TypeError, match="from_dataset"):
        from_dataloader(TensorDataset(x, y))


def test_from_dataloader_set_epoch_and_best_effort_resume():
    ds = PairDataset(16)
    sampler = DistributedSampler(ds, num_replicas=1, rank=0, shuffle=True, seed=4)
    loader = from_dataloader(DataLoader(ds, batch_size=4, sampler=sampler))
    loader.set_epoch(2)
    assert sampler.epoch == 2
    epoch2 = _ids(loader)
    assert sampler.epoch == 2 and loader.get_state() == {"epoch": 3, "batch_index": 0}
    epoch3 = _ids(loader)
    assert sampler.epoch == 3 and epoch3 != epoch2
    # resume mid-epoch 2: re-seeds the sampler and skips the consumed batches
    fresh_sampler = DistributedSampler(ds, num_replicas=1, rank=0, shuffle=True, seed=4)
    resumed = from_dataloader(DataLoader(ds, batch_size=4, sampler=fresh_sampler))
    resumed.set_state({"epoch": 2, "batch_index": 1})
    assert fresh_sampler.epoch == 2
    assert _ids(resumed) == epoch2[1:]
    with pytest.raises(ValueError, match="invalid loader position"):
        resumed.set_state({"epoch": 0, "batch_index": 9})


def test_from_dataloader_iterable_dataset_without_len():
    loader = from_dataloader(DataLoader(Stream(), batch_size=2))
    with pytest.raises(TypeError):
        len(loader)
    assert _ids(loader, "input") == [[0, 1], [2, 3], [4]]
    assert loader.get_state() == {"epoch": 1, "batch_index": 0}


def test_fork_warning():
    ds = PairDataset(4)
    with pytest.warns(RuntimeWarning, match="fork.*multiprocessing_context='spawn'.*persistent_workers=True"):
        from_dataloader(DataLoader(ds, batch_size=2, num_workers=2, multiprocessing_context="fork"))
    default = multiprocessing.get_start_method(allow_none=True) or multiprocessing.get_all_start_methods()[0]
    if default == "fork":
        with pytest.warns(RuntimeWarning, match="fork"):
            from_dataloader(DataLoader(ds, batch_size=2, num_workers=2))  # platform default start method
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        from_dataloader(DataLoader(ds, batch_size=2, num_workers=2, multiprocessing_context="spawn"))
        from_dataloader(DataLoader(ds, batch_size=2, num_workers=0, multiprocessing_context=None))


@pytest.mark.slow  # each spawned worker imports torch and the dataset's module (torch only: worker_datasets.py)
def test_from_dataloader_spawn_workers():
    dl = DataLoader(PairDataset(12), batch_size=4, num_workers=2, multiprocessing_context="spawn",
                    persistent_workers=True)
    with warnings.catch_warnings():
        warnings.simplefilter("error", RuntimeWarning)
        loader = from_dataloader(dl)
    assert len(loader) == 3
    for _ in range(2):  # persistent workers: the second epoch reuses them
        batches = list(loader)
        assert [b["target"].tolist() for b in batches] == [[0, 1, 2, 3], [4, 5, 6, 7], [8, 9, 10, 11]]
        for b in batches:
            _assert_numpy_tree(b)
            assert b["input"].dtype == np.float32 and b["target"].dtype == np.int32
    assert loader.epoch == 2


# ---- end to end -------------------------------------------------------------------------------------------------
def test_trainer_end_to_end():
    from flax import nnx

    import jaxcomposer
    from jaxcomposer.models import MLP

    gen = torch.Generator().manual_seed(0)
    centers = torch.randn(3, 8, generator=gen) * 3
    y = torch.randint(0, 3, (96,), generator=gen)
    x = centers[y] + 0.1 * torch.randn(96, 8, generator=gen)  # separable: accuracy should be high quickly
    train = from_dataset(TensorDataset(x, y), 16, seed=0)
    evals = from_dataloader(DataLoader(TensorDataset(x[:40], y[:40]), batch_size=16))  # last batch partial
    model = jaxcomposer.ComposerClassifier(MLP(8, hidden=(16,), num_classes=3, rngs=nnx.Rngs(0)))
    trainer = jaxcomposer.Trainer(model=model, train_dataloader=train, eval_dataloader=evals, max_duration="2ep",
                                  optimizers=[jaxcomposer.optim.DecoupledSGDW(lr=0.2)], seed=0, progress_bar=False)
    state = trainer.fit()
    assert state.timestamp.epoch == 2 and state.timestamp.batch == 2 * len(train)
    metrics = trainer.eval()
    assert set(metrics) >= {"MulticlassAccuracy", "CrossEntropy"}
    assert 0.0 <= metrics["MulticlassAccuracy"] <= 1.0 and np.isfinite(metrics["CrossEntropy"])
    assert metrics["MulticlassAccuracy"] > 0.8, metrics
