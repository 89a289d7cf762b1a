"""Composer's surface for torch users: import paths, ComposerClassifier as a torch module, Evaluators, device=,
seed=, predict's torch tensors and the State fields a Composer callback reads. One small torch classifier and
loader shared by the cases, so the compiled steps are reused."""
import copy

import numpy as np
import pytest
import torch
from torch.utils.data import DataLoader, TensorDataset

from jaxcomposer.core.events import Callback
from jaxcomposer.errors import ConfigurationError
from jaxcomposer.loggers.logger import LoggerDestination

pytestmark = pytest.mark.xdist_group("test_composer_surface")

NUM_CLASSES = 4


def _data(n=64, seed=0):
    g = torch.Generator().manual_seed(seed)
    return TensorDataset(torch.randn(n, 1, 4, 4, generator=g), torch.randint(0, NUM_CLASSES, (n,), generator=g))


def _net(seed=0):
    torch.manual_seed(seed)
    return torch.nn.Sequential(torch.nn.Flatten(), torch.nn.Linear(16, 8), torch.nn.ReLU(),
                               torch.nn.Linear(8, NUM_CLASSES))


class Keys(LoggerDestination):
    def __init__(self):
        self.logged = []

    def log_metrics(self, metrics, step):
        self.logged.append((step, sorted(metrics)))


def _trainer(model, **kwargs):
    from jaxcomposer.trainer import Trainer
    kwargs.setdefault("train_dataloader", DataLoader(_data(), batch_size=16, shuffle=True))
    kwargs.setdefault("max_duration", "2ep")
    return Trainer(model=model, progress_bar=False, **kwargs)


def test_composer_import_paths():
    import jaxcomposer
    import torch_bridge
    from jaxcomposer import core, models, trainer, utils
    from jaxcomposer.core.run_state import RunState

    assert trainer.Trainer is jaxcomposer.Trainer
    assert core.State is RunState and core.DataSpec is jaxcomposer.DataSpec and core.Time is jaxcomposer.Time
    for name in ("Event", "Timestamp", "TimeUnit", "Callback", "Evaluator", "Precision"):
        assert getattr(core, name) is not None
    assert models.ComposerModel is torch_bridge.ComposerModel
    assert models.HuggingFaceModel is torch_bridge.HuggingFaceModel
    from jaxcomposer.models.huggingface import HuggingFaceModel
    assert HuggingFaceModel is torch_bridge.HuggingFaceModel
    assert callable(utils.reproducibility.seed_all)
    assert core.Precision.AMP_BF16 == "amp_bf16" and str(core.Precision.FP32) == "fp32"
    with pytest.raises(AttributeError, match="no attribute 'Nope'"):
        core.Nope
    assert jaxcomposer.State is RunState and jaxcomposer.Evaluator is core.Evaluator
    assert jaxcomposer.ComposerModel is torch_bridge.ComposerModel and jaxcomposer.trainer.Trainer is trainer.Trainer


def test_composers_torch_layers_from_the_methods_modules():
    import torch_bridge.methods.squeeze_excite as torch_se
    import torch_bridge.surgery as torch_blur
    from jaxcomposer.algorithms import blurpool, squeeze_excite

    assert blurpool.BlurConv2d is torch_blur.BlurConv2d and blurpool.blurmax_pool2d is torch_blur.blurmax_pool2d
    assert squeeze_excite.SqueezeExciteConv2d is torch_se.SqueezeExciteConv2d
    # where Composer's torch layer shares its name with the NNX one, a Composer script's isinstance holds for both
    assert isinstance(torch_blur.BlurMaxPool2d(2), blurpool.BlurMaxPool2d)
    assert isinstance(torch_se.SqueezeExcite2d(8, 4), squeeze_excite.SqueezeExcite2d)
    assert not isinstance(torch.nn.MaxPool2d(2), blurpool.BlurMaxPool2d)
    with pytest.raises(AttributeError, match="no attribute 'Nope'"):
        blurpool.Nope


def test_composer_classifier_of_a_torch_module_is_a_torch_module():
    from jaxcomposer import ComposerClassifier
    from jaxcomposer.models import ComposerModel

    net = _net()
    model = ComposerClassifier(net, num_classes=NUM_CLASSES)
    assert isinstance(model, torch.nn.Module) and isinstance(model, ComposerModel)
    assert model.module is net
    assert [n for n, _ in model.named_parameters()] == ["module.1.weight", "module.1.bias", "module.3.weight",
                                                        "module.3.bias"]
    x, y = _data(8).tensors
    torch.testing.assert_close(model((x, y)), net(x), rtol=0, atol=0)
    torch.testing.assert_close(model.loss(model((x, y)), (x, y)), torch.nn.functional.cross_entropy(net(x), y))
    assert sorted(model.get_metrics(is_train=False)) == ["CrossEntropy", "MulticlassAccuracy"]
    assert sorted(model.get_metrics(is_train=True)) == ["MulticlassAccuracy"]
    assert set(model.state_dict()) == {"module." + k for k in net.state_dict()}


def test_classifier_trains_in_the_trainer_and_state_model_is_the_wrapper():
    from jaxcomposer import ComposerClassifier
    from jaxcomposer.core import Evaluator

    net = _net()
    before = copy.deepcopy(net.state_dict())
    model = ComposerClassifier(net, num_classes=NUM_CLASSES)
    keys = Keys()
    evals = [Evaluator(label="val", dataloader=DataLoader(_data(32, 1), batch_size=16),
                       metric_names=["MulticlassAccuracy"]),
             Evaluator(label="every_batch", dataloader=DataLoader(_data(32, 2), batch_size=16), eval_interval="2ba",
                       subset_num_batches=1)]
    trainer = _trainer(model, eval_dataloader=evals, loggers=[keys], device="cpu")
    trainer.fit()
    assert trainer.state.model is model and model.module is net
    assert any(not torch.equal(before[k], v) for k, v in net.state_dict().items())  # trained, in place
    assert sorted(trainer.state.eval_metrics) == ["every_batch", "val"]
    assert list(trainer.state.eval_metrics["val"]) == ["MulticlassAccuracy"]  # metric_names picks
    assert sorted(trainer.state.eval_metrics["every_batch"]) == ["CrossEntropy", "MulticlassAccuracy"]
    val_at = [step for step, names in keys.logged if "metrics/val/MulticlassAccuracy" in names]
    every_at = [step for step, names in keys.logged if "metrics/every_batch/CrossEntropy" in names]
    assert val_at == [4, 8]  # the Trainer's eval_interval: each epoch of 4 batches
    assert every_at == [2, 4, 6, 8]  # its own
    acc = trainer.state.eval_metrics["val"]["MulticlassAccuracy"]
    assert acc.compute() == float(acc) and 0.0 <= acc <= 1.0  # Composer's callbacks call .compute()

    # the same evaluation through the torch forward: the metrics mean what they mean in Composer
    x, y = _data(32, 1).tensors
    with torch.no_grad():
        expected = float((net(x).argmax(1) == y).float().mean())
    assert float(acc) == pytest.approx(expected, abs=1e-6)

    # predict gives torch tensors, as Composer's, equal to the trained module's eval forward
    out = trainer.predict(DataLoader(_data(32, 1), batch_size=16))
    assert len(out) == 2 and all(isinstance(o, torch.Tensor) for o in out)
    with torch.no_grad():
        torch.testing.assert_close(torch.cat(out), net(x), rtol=1e-5, atol=1e-5)


def test_custom_loss_classifier_runs_the_composer_model_path():
    from jaxcomposer import ComposerClassifier

    net = _net()
    model = ComposerClassifier(net, num_classes=NUM_CLASSES, loss_fn=torch.nn.functional.multi_margin_loss)
    assert not model.uses_defaults
    seen = []

    class FirstLoss(Callback):
        def batch_end(self, state, logger):
            seen.append(float(state.loss))

    x, y = next(iter(DataLoader(_data(), batch_size=16)))
    with torch.no_grad():
        expected = float(torch.nn.functional.multi_margin_loss(net(x), y))
    trainer = _trainer(model, train_dataloader=DataLoader(_data(), batch_size=16), max_duration="1ba",
                       callbacks=[FirstLoss()])
    trainer.fit()
    assert seen == [pytest.approx(expected, abs=1e-5)]


def test_bad_evaluators_and_devices_are_refused_before_anything_compiles():
    from jaxcomposer import ComposerClassifier
    from jaxcomposer.core import Evaluator

    model = ComposerClassifier(_net(), num_classes=NUM_CLASSES)
    loader = DataLoader(_data(), batch_size=16)
    with pytest.raises(ConfigurationError, match=r"a list must hold Evaluators .* Evaluator\(label="):
        _trainer(model, eval_dataloader=[loader, loader])
    with pytest.raises(ConfigurationError, match=r"metric_names \['F1'\] are not among"):
        _trainer(model, eval_dataloader=Evaluator(label="val", dataloader=loader, metric_names=["F1"]))
    with pytest.raises(ConfigurationError, match="labels must be unique"):
        _trainer(model, eval_dataloader=[Evaluator("val", loader), Evaluator("val", loader)])
    with pytest.raises(ConfigurationError, match="label"):
        Evaluator(label="a/b", dataloader=loader)
    with pytest.raises(ConfigurationError, match="device: 'tpu' asked for, but JAX has no such device"):
        _trainer(model, device="tpu")
    with pytest.raises(ConfigurationError, match="device: got 'mps'"):
        _trainer(model, device="mps")
    with pytest.raises(ConfigurationError, match="both given"):
        _trainer(model, device="cpu", devices=[])


def _run_with_seed(seed):
    net = _net()  # the same initial weights every time: only the loader's shuffle draws from the seed
    loader = DataLoader(_data(), batch_size=16, shuffle=True)  # shuffles with torch's global generator
    _trainer(net, train_dataloader=loader, seed=seed).fit()
    return torch.cat([p.detach().flatten() for p in net.parameters()])


def test_seed_repeats_a_torch_shuffle_bit_for_bit():
    a, b, c = _run_with_seed(7), _run_with_seed(7), _run_with_seed(8)
    assert torch.equal(a, b)
    assert not torch.equal(a, c)  # another seed, another order


def test_seed_all_seeds_python_numpy_and_torch():
    import random

    from jaxcomposer.utils.reproducibility import seed_all

    seed_all(3)
    first = (random.random(), np.random.rand(), torch.rand(()).item())
    seed_all(3)
    assert (random.random(), np.random.rand(), torch.rand(()).item()) == first
    with pytest.raises(ValueError, match="seed=-1"):
        seed_all(-1)


def test_state_has_composers_fields():
    from jaxcomposer import ComposerClassifier
    from jaxcomposer.core import Precision

    model = ComposerClassifier(_net(), num_classes=NUM_CLASSES)
    loader = DataLoader(_data(), batch_size=16)
    seen = {}

    class Reader(Callback):
        def batch_end(self, state, logger):
            seen.update(model=state.model, optimizers=state.optimizers, seed=state.seed,
                        rank_zero_seed=state.rank_zero_seed, precision=state.precision, loss=float(state.loss),
                        dataloader=state.dataloader, dataloader_len=state.dataloader_len,
                        batch=state.timestamp.batch, max_duration=state.max_duration, device=state.device,
                        batch_keys=sorted(state.batch))
            with pytest.raises(AttributeError, match="state.outputs: the model's outputs stay inside"):
                state.outputs

    trainer = _trainer(model, train_dataloader=loader, max_duration="1ba", seed=5, callbacks=[Reader()],
                       precision=Precision.FP32)
    trainer.fit()
    assert seen["model"] is model and seen["optimizers"] == [trainer.optimizer]
    assert seen["seed"] == seen["rank_zero_seed"] == 5 and seen["precision"] == "fp32"
    assert seen["dataloader"] is loader and seen["dataloader_len"].value == 4 and seen["batch"] == 1
    assert seen["max_duration"].to_timestring() == "1ba" and seen["device"].platform == "cpu"
    assert np.isfinite(seen["loss"]) and seen["batch_keys"] == ["input", "target"]


def test_optimizer_monitor_logs_torchs_gradient_norms_by_the_models_names():
    import torch.nn.functional as F

    from jaxcomposer import ComposerClassifier
    from jaxcomposer.callbacks import OptimizerMonitor
    from jaxcomposer.loggers import InMemoryLogger

    net = _net()
    model = ComposerClassifier(net, num_classes=NUM_CLASSES)
    x, y = next(iter(DataLoader(_data(), batch_size=16)))
    F.cross_entropy(model((x, y)), y).backward()
    expected = {name: float(p.grad.norm()) for name, p in model.named_parameters()}
    logger = InMemoryLogger()
    trainer = _trainer(model, train_dataloader=DataLoader(_data(), batch_size=16), max_duration="1ba",
                       optimizers=torch.optim.SGD(model.parameters(), lr=0.1), loggers=[logger],
                       callbacks=[OptimizerMonitor(batch_log_interval=1)])
    trainer.fit()
    got = logger.most_recent_values
    for name, norm in expected.items():
        assert got[f"l2_norm/grad/{name}"] == pytest.approx(norm, rel=1e-5)
        assert got[f"l2_norm/update/{name}"] == pytest.approx(0.1 * norm, rel=1e-5)  # plain SGD: lr * grad
    assert got["l2_norm/grad/global"] == pytest.approx(sum(v * v for v in expected.values()) ** 0.5, rel=1e-5)
    for name, p in model.named_parameters():  # the weights after the step: their norms are the ones logged
        assert got[f"l2_norm/param/{name}"] == pytest.approx(float(p.detach().norm()), rel=1e-5)
    # a run without the monitor computes no norms in its step
    plain = _trainer(ComposerClassifier(_net(), num_classes=NUM_CLASSES), max_duration="1ba")
    plain.fit()
    assert "layer_norms" not in plain.state.batch_metrics


def test_predict_shows_each_batchs_outputs_and_counts_its_batches():
    from jaxcomposer import ComposerClassifier

    model = ComposerClassifier(_net(), num_classes=NUM_CLASSES)
    seen = []

    class Saver(Callback):  # Composer's PredictionSaver, from Trainer.predict's docstring
        def predict_batch_end(self, state, logger):
            seen.append((int(state.predict_timestamp.batch), state.outputs.shape))
            logger.upload_file(remote_file_name="x.pt", file_path="x.pt")  # no remote destination: nothing

        def eval_batch_end(self, state, logger):
            seen.append(("eval", int(state.eval_timestamp.batch)))

    trainer = _trainer(model, max_duration="1ba", callbacks=[Saver()])
    assert trainer.predict(DataLoader(_data(40), batch_size=16), return_outputs=False) == []
    assert seen == [(1, (16, NUM_CLASSES)), (2, (16, NUM_CLASSES)), (3, (8, NUM_CLASSES))]
    trainer.eval(DataLoader(_data(32), batch_size=16))
    assert seen[3:] == [("eval", 1), ("eval", 2)]
    with pytest.raises(AttributeError, match="PREDICT_BATCH_END"):
        trainer.state.outputs
    assert trainer.state.algorithms == [] and trainer.state.device_train_microbatch_size is None


def test_compute_training_metrics_logs_the_epochs_train_accuracy_as_composer():
    """metrics/train/MulticlassAccuracy after each batch is the epoch's accuracy so far, each batch scored by the
    weights it was trained with (before its update), as Composer computes it from the train forward."""
    from jaxcomposer import ComposerClassifier
    from jaxcomposer.loggers import InMemoryLogger

    net = _net()
    model = ComposerClassifier(net, num_classes=NUM_CLASSES)
    weights_before = []

    class BeforeEachBatch(Callback):
        def batch_start(self, state, logger):
            state.sync_model()
            weights_before.append(copy.deepcopy(net.state_dict()))

    logger = InMemoryLogger()
    trainer = _trainer(model, train_dataloader=DataLoader(_data(), batch_size=16), max_duration="2ep",
                       compute_training_metrics=True, loggers=[logger], callbacks=[BeforeEachBatch()])
    trainer.fit()
    logged = [v for _, v in logger.data["metrics/train/MulticlassAccuracy"]]
    probe = _net()
    expected, correct, seen = [], 0, 0
    for i, (x, y) in enumerate(list(DataLoader(_data(), batch_size=16)) * 2):
        if i % 4 == 0:
            correct, seen = 0, 0  # a new epoch
        probe.load_state_dict(weights_before[i])
        with torch.no_grad():
            correct += int((probe(x).argmax(1) == y).sum())
        seen += len(y)
        expected.append(correct / seen)
    assert logged == pytest.approx(expected, abs=1e-6)
    assert trainer.state.train_metrics["MulticlassAccuracy"].compute() == pytest.approx(expected[-1], abs=1e-6)
    plain = _trainer(ComposerClassifier(_net(), num_classes=NUM_CLASSES), max_duration="1ba")
    plain.fit()
    assert "train_metrics" not in plain.state.batch_metrics  # off by default: no extra forward
    with pytest.raises(AttributeError, match="compute_training_metrics=True"):
        plain.state.train_metrics
