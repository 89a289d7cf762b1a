"""ActivationMonitor: Composer's per-module activation statistics, checked against values computed by hand (NNX)
and with torch forward hooks on the user's module (torch), in real runs of the Trainer."""
import types
import warnings

import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from jaxcomposer import Callback, Trainer
from jaxcomposer.callbacks import ActivationMonitor
from jaxcomposer.callbacks._current_model import current_nnx_module
from jaxcomposer.callbacks.activation_monitor import activation_stats
from jaxcomposer.loggers import InMemoryLogger
from jaxcomposer.optim import DecoupledSGDW
from tests.trainer.helpers import loaders, mlp_task


def monitor(**kwargs) -> ActivationMonitor:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # intervals under 10ba warn, as Composer's
        return ActivationMonitor(**kwargs)


def by_hand(x: np.ndarray) -> dict:
    """Composer's statistics in numpy: over the last axis, then the mean."""
    x = np.asarray(x, np.float64)
    d = x - x.mean(-1, keepdims=True)
    return {"l2_norm": np.linalg.norm(x, axis=-1).mean(), "average": x.mean(),
            "kurtosis": ((d ** 4).mean(-1) / (d ** 2).mean(-1) ** 2).mean(), "max": x.max(-1).mean()}


def activation_batches(mem: InMemoryLogger) -> dict:
    return {k: [ts.batch for ts, _ in v] for k, v in mem.data.items() if k.startswith("activations/")}


class Recorder(Callback):
    """At each batch's end, after the monitor: the batch and what ``fn(state)`` makes of the current weights."""

    def __init__(self, fn):
        self.fn, self.seen = fn, {}

    def batch_end(self, state, logger):
        self.seen[int(state.timestamp.batch)] = self.fn(state)


def test_activation_stats_match_composer_formulas():
    x = np.random.default_rng(0).normal(size=(3, 5, 7)).astype(np.float32)
    got = {k: float(v) for k, v in activation_stats(jnp.asarray(x)).items()}
    assert got == pytest.approx(by_hand(x), rel=1e-5)
    assert activation_stats(jnp.arange(4)) is None and activation_stats(jnp.ones(3, bool)) is None
    assert float(activation_stats(jnp.float32(2.0))["max"]) == 2.0


def test_nnx_mlp_in_a_trainer():
    train, _ = loaders(batch_size=32, n_train=128)  # 4 batches
    mem = InMemoryLogger()

    def hidden0(state):
        model = current_nnx_module(state)
        x = np.asarray(state.batch["input"]).reshape(32, -1)
        return x @ np.asarray(model.hidden[0].kernel[...]) + np.asarray(model.hidden[0].bias[...])

    rec = Recorder(hidden0)
    trainer = Trainer(model=mlp_task(), train_dataloader=train, max_duration="1ep",
                      optimizers=DecoupledSGDW(lr=0.1), seed=0, progress_bar=False,
                      callbacks=[monitor(interval="2ba"), rec], loggers=[mem])
    trainer.fit()
    batches = activation_batches(mem)
    assert set(batches) == {f"activations/{s}/{m}_output.0" for s in ("l2_norm", "average", "kurtosis", "max")
                            for m in ("", "hidden.0", "drop", "head")}
    assert all(b == [2, 4] for b in batches.values())  # nothing at batches 1 and 3
    for step in (2, 4):
        expected = by_hand(rec.seen[step])
        for stat in ("max", "l2_norm", "average", "kurtosis"):
            logged = dict((ts.batch, v) for ts, v in mem.data[f"activations/{stat}/hidden.0_output.0"])
            assert logged[step] == pytest.approx(expected[stat], rel=1e-4, abs=1e-5), (step, stat)
    # the weights changed between the two: the values are the ones at each batch
    assert mem.data["activations/max/hidden.0_output.0"][0][1] != mem.data["activations/max/hidden.0_output.0"][1][1]


def test_nnx_ignore_module_types_and_epoch_interval():
    train, _ = loaders(batch_size=32, n_train=128)
    mem = InMemoryLogger()
    Trainer(model=mlp_task(), train_dataloader=train, max_duration="2ep", optimizers=DecoupledSGDW(lr=0.1),
            seed=0, progress_bar=False, loggers=[mem],
            callbacks=[monitor(interval="1ep", ignore_module_types=[nnx.Dropout, "head"])]).fit()
    batches = activation_batches(mem)
    assert {k.split("/", 2)[2] for k in batches} == {"_output.0", "hidden.0_output.0"}
    assert all(b == [1, 5] for b in batches.values())  # the first batch of each epoch


def test_refusals():
    with pytest.raises(ValueError, match="time unit"):
        ActivationMonitor(interval="0.5dur")
    with pytest.warns(UserWarning, match="10ba"):
        ActivationMonitor(interval="2ba")
    with pytest.raises(TypeError, match="ignore_module_types"):
        ActivationMonitor(ignore_module_types=[3])
    model = mlp_task().source
    graphdef, params, rest = nnx.split(model, nnx.Param, ...)
    state = types.SimpleNamespace(model=model, batch={"x": np.zeros((2, 64), np.float32)},
                                  train_state=types.SimpleNamespace(params=params, model_state=rest))
    cb = monitor(interval="1ba")
    cb.init(state, None)
    with pytest.raises(ValueError, match=r"batch\['input'\].*\['x'\]"):
        cb.compute(state)
    with pytest.raises(TypeError, match="flax.nnx.Module or a torch module"):
        cb.init(types.SimpleNamespace(model=object()), None)


# ---------------------------------------------------------------------------------------------------------- torch
torch = pytest.importorskip("torch")


def torch_mlp():
    class MLP(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.fc1 = torch.nn.Linear(6, 8)
            self.act = torch.nn.ReLU()
            self.block = torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.Tanh())
            self.fc2 = torch.nn.Linear(8, 3)

        def forward(self, x):
            return self.fc2(self.block(self.act(self.fc1(x))))

    torch.manual_seed(0)
    return MLP()


def torch_loader():
    from torch.utils.data import DataLoader, TensorDataset
    g = torch.Generator().manual_seed(0)
    return DataLoader(TensorDataset(torch.randn(64, 6, generator=g), torch.randint(0, 3, (64,), generator=g)),
                      batch_size=16)  # 4 batches


def hooked(state):
    """Every module's inputs and outputs by torch forward hooks on the user's module holding the current weights."""
    model = state.sync_model()
    module = model.module if hasattr(model, "module") else model
    seen, handles = {}, []
    for name, m in module.named_modules():
        handles.append(m.register_forward_hook(
            lambda m, i, o, name=name: seen.__setitem__(name, (i[0].detach().numpy(), o.detach().numpy()))))
    was = module.training
    module.eval()
    with torch.no_grad():
        module(torch.from_numpy(np.array(state.batch["input"])))
    module.train(was)
    for h in handles:
        h.remove()
    return seen


@pytest.mark.parametrize("wrap", [False, True], ids=["bare", "ComposerClassifier"])
def test_torch_mlp_in_a_trainer(wrap):
    from jaxcomposer.models.tasks import ComposerClassifier
    mem, rec = InMemoryLogger(), Recorder(hooked)
    model = torch_mlp()
    trainer = Trainer(model=ComposerClassifier(model, num_classes=3) if wrap else model,
                      train_dataloader=torch_loader(), max_duration="1ep", optimizers=DecoupledSGDW(lr=0.1), seed=0,
                      progress_bar=False, loggers=[mem], callbacks=[monitor(interval="2ba"), rec])
    trainer.fit()
    prefix = "module." if wrap else ""
    batches = activation_batches(mem)
    names = {"", "fc1", "act", "block", "block.0", "block.1", "fc2"}
    assert {k.split("/", 2)[2] for k in batches} == \
        {f"{(prefix + n) if n else prefix.rstrip('.')}_{g}.0" for n in names for g in ("input", "output")}
    assert all(b == [2, 4] for b in batches.values())
    for step in (2, 4):
        for name in ("fc1", "block", "fc2"):
            x_in, x_out = rec.seen[step][name]
            for group, value in (("input", x_in), ("output", x_out)):
                expected = by_hand(value)
                for stat in ("max", "l2_norm"):
                    logged = dict((ts.batch, v) for ts, v in mem.data[f"activations/{stat}/{prefix}{name}_{group}.0"])
                    assert logged[step] == pytest.approx(expected[stat], rel=1e-4, abs=1e-5), (step, name, stat)


def test_torch_ignore_module_types_and_missing_task():
    mem = InMemoryLogger()
    Trainer(model=torch_mlp(), train_dataloader=torch_loader(), max_duration="2ba", optimizers=DecoupledSGDW(lr=0.1),
            seed=0, progress_bar=False, loggers=[mem],
            callbacks=[monitor(interval="2ba", ignore_module_types=[torch.nn.ReLU, "block", "Linear"])]
            ).fit()
    assert {k.split("/", 2)[2] for k in activation_batches(mem)} == {"_input.0", "_output.0"}
    with pytest.raises(NotImplementedError, match="state.task"):  # a state that does not come from a Trainer
        monitor(interval="2ba").init(types.SimpleNamespace(model=torch_mlp(), task=None), None)
