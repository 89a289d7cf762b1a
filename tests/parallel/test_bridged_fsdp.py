"""FSDP shards a bridged torch model by parameter size (it has no logical axes) and trains it as unsharded."""
import numpy as np
import pytest
import torch

from jaxcomposer.trainer.trainer import Trainer

pytestmark = pytest.mark.xdist_group("bridged_fsdp")

BATCHES = [{"input": np.random.default_rng(i).normal(size=(8, 16)).astype(np.float32),
            "target": np.random.default_rng(i).integers(0, 4, 8).astype(np.int64)} for i in range(3)]


def train(parallelism):
    torch.manual_seed(0)
    module = torch.nn.Sequential(torch.nn.Linear(16, 64), torch.nn.ReLU(), torch.nn.Linear(64, 4))
    initial = module[0].weight.detach().clone()
    t = Trainer(model=module, train_dataloader=BATCHES, max_duration="3ba", seed=0, progress_bar=False,
                parallelism_config=parallelism)
    t.fit()
    return t, module, initial


def test_a_bridged_torch_model_is_sharded_by_size_and_trains_as_unsharded():
    _, plain_module, initial = train(None)
    sharded, sharded_module, _ = train({"fsdp": {"min_shard_size": 512}})
    specs = {k: tuple(v.sharding.spec) for k, v in sharded.state.train_state.params.items()}
    # state_dict names; the two weights (1024 and 256 elements) against min_shard_size 512, biases below it
    assert specs == {"0.weight": ("fsdp", None), "0.bias": (None,), "2.weight": (None, None), "2.bias": (None,)}
    for (name, a), b in zip(plain_module.state_dict().items(), sharded_module.state_dict().values()):
        np.testing.assert_allclose(b.numpy(), a.numpy(), rtol=1e-6, atol=1e-7, err_msg=name)
    assert not torch.equal(sharded_module[0].weight, initial)  # trained, and written back into the module
