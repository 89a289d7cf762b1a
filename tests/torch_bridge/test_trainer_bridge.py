"""Bridged torch models inside jaxcomposer's Trainer: a bare torch CNN with torch DataLoaders and Composer
methods, back to torch afterwards; MixUp/CutOut on NCHW batches; a torch GPT as a causal LM; microbatching and
padded eval with a dynamic-batch export."""
import copy

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
import torch
from torch.utils.data import DataLoader, TensorDataset

from jaxcomposer.algorithms import EMA, CutOut, GradientClipping, LabelSmoothing, MixUp, cutout_batch
from jaxcomposer.core.events import Callback
from jaxcomposer.data import lm_arrays
from jaxcomposer.models.tasks import ComposerCausalLM, ComposerClassifier
from jaxcomposer.optim import DecoupledSGDW
from jaxcomposer.trainer import step as step_lib
from jaxcomposer.trainer.trainer import Trainer
from tests.torch_bridge.parity import LAYER_TOL, MODEL_TOL, assert_close_on_scale
from tests.torch_bridge.zoo import SmallCNN, TinyGPT, TorchMLP

# its module-scoped fixtures and caches are built once per worker: keep its tests on one xdist worker
pytestmark = pytest.mark.xdist_group("test_trainer_bridge")

NUM_CLASSES = 3


def quadrant_images(n, seed, hw=8):
    """NCHW images whose label is the quadrant (top-left, top-right, bottom-left) carrying a brighter patch."""
    g = torch.Generator().manual_seed(seed)
    x = 0.5 * torch.randn(n, 3, hw, hw, generator=g)
    y = torch.randint(0, NUM_CLASSES, (n,), generator=g)
    h = hw // 2
    for i, label in enumerate(y.tolist()):
        r, c = divmod(label, 2)
        x[i, :, r * h:(r + 1) * h, c * h:(c + 1) * h] += 1.0
    return x, y


def image_loaders(n_train=256, n_eval=100, batch_size=32):
    train = DataLoader(TensorDataset(*quadrant_images(n_train, 0)), batch_size=batch_size, shuffle=True,
                       drop_last=True, generator=torch.Generator().manual_seed(0))
    evals = DataLoader(TensorDataset(*quadrant_images(n_eval, 1)), batch_size=batch_size, shuffle=False)
    return train, evals  # 100 eval examples in batches of 32: the last batch (4) is padded by the Trainer


def make_cnn():
    torch.manual_seed(0)
    return SmallCNN(in_ch=3, num_classes=NUM_CLASSES, width=8, p=0.1)


class LossHistory(Callback):
    def __init__(self):
        self.losses = []

    def batch_end(self, state, logger):
        self.losses.append(float(state.batch_metrics["loss"]))


def eval_weights(trainer):
    """The params and model state evaluation and predict use (after EMA's ``eval`` slot)."""
    return step_lib.eval_weights(trainer.composed, trainer.state.train_state, trainer.run_info)


@pytest.fixture(scope="module")
def trained_cnn():
    train, evals = image_loaders()
    history = LossHistory()
    module = make_cnn()
    trainer = Trainer(model=module, train_dataloader=train, eval_dataloader=evals, max_duration="3ep",
                      optimizers=DecoupledSGDW(lr=0.05, momentum=0.9),
                      algorithms=[LabelSmoothing(), EMA(half_life="5ba"), GradientClipping("norm", 1.0)],
                      callbacks=[history], progress_bar=False, seed=0)
    trainer.fit()
    # what the user's module held right after fit (later tests load EMA weights into it)
    after_fit = {k: v.clone() for k, v in module.state_dict().items()}
    return trainer, history, evals, module, after_fit


def test_module_passed_holds_the_trained_weights(trained_cnn):
    """As Composer: after fit, the torch module given to the Trainer is the trained model."""
    trainer, _, _, module, after_fit = trained_cnn
    assert trainer.state.model is module
    ts = trainer.state.train_state
    for name, value in {**ts.params, **ts.model_state}.items():
        np.testing.assert_array_equal(after_fit[name].numpy(), np.asarray(value), err_msg=name)
    assert int(after_fit["bn1.num_batches_tracked"]) == 24
    probe = copy.deepcopy(module)
    probe.load_state_dict(after_fit)
    x = quadrant_images(8, 2)[0]
    raw = jax.jit(lambda p, s, x: trainer.task.forward(p, s, {"input": x}, train=False)[0])(ts.params, ts.model_state,
                                                                                           x.numpy())
    with torch.no_grad():
        assert_close_on_scale(np.asarray(raw), probe.eval()(x), MODEL_TOL)


def test_bare_torch_cnn_trains(trained_cnn):
    trainer, history, _, *_ = trained_cnn
    assert isinstance(trainer.task, ComposerClassifier) and trainer.task.is_bound
    losses = history.losses
    assert len(losses) == 3 * 8 and np.all(np.isfinite(losses))
    assert np.mean(losses[-4:]) < np.mean(losses[:4]) - 0.1
    metrics = trainer.state.eval_metrics["eval"]
    assert metrics["MulticlassAccuracy"] > 0.6, metrics  # chance is 1/3


def test_trained_weights_back_to_torch_match_predict(trained_cnn):
    trainer, _, evals, *_ = trained_cnn
    bridged = trainer.task.pure.bridged
    assert bridged.module is trainer.task.source
    params, state = eval_weights(trainer)  # EMA weights: what predict and eval use
    module = bridged.to_torch(params, state).eval()
    assert int(module.bn1.num_batches_tracked) == 24  # buffers came back too (EMA keeps the counter as is)
    preds = trainer.predict(evals)
    assert [p.shape[0] for p in preds] == [32, 32, 32, 4]
    with torch.no_grad():
        ref = torch.cat([module(x) for x, _ in evals]).numpy()
    assert_close_on_scale(np.concatenate(preds), ref, MODEL_TOL)


def test_padded_eval_matches_torch(trained_cnn):
    """(e) eval's last partial batch is padded and masked: metrics equal torch's over exactly the 100 examples."""
    trainer, _, evals, *_ = trained_cnn
    module = trainer.task.pure.bridged.to_torch(*eval_weights(trainer)).eval()
    metrics = trainer.eval(evals)
    xs, ys = evals.dataset.tensors
    with torch.no_grad():
        logits = module(xs)
    acc = (logits.argmax(-1) == ys).float().mean().item()
    ce = torch.nn.functional.cross_entropy(logits, ys).item()
    assert metrics["MulticlassAccuracy"] == pytest.approx(acc, abs=1e-6)
    assert metrics["CrossEntropy"] == pytest.approx(ce, abs=1e-4)


# ------------------------------------------------------------------------------------------------ (b) MixUp, CutOut
@pytest.mark.parametrize("method", [MixUp(alpha=0.4), CutOut(length=0.5, data_format="NCHW")], ids=["mixup", "cutout"])
def test_image_methods_on_nchw_bridged_batches(method):
    train, _ = image_loaders(n_train=64)
    history = LossHistory()
    trainer = Trainer(model=make_cnn(), train_dataloader=train, max_duration="2ba", optimizers=DecoupledSGDW(lr=0.05),
                      algorithms=[method], callbacks=[history], progress_bar=False, seed=0)
    trainer.fit()
    assert len(history.losses) == 2 and np.all(np.isfinite(history.losses))


def test_cutout_nchw_holes_span_channels():
    x = jnp.ones((2, 3, 8, 8))
    out = np.asarray(cutout_batch(x, length=0.5, key=jax.random.key(0), data_format="NCHW"))
    holes = out == 0
    assert holes.any()
    assert (holes == holes[:, :1]).all()  # the same (H, W) square on every channel
    assert holes[0, 0].sum() <= 16  # at most a 4x4 square on an 8x8 image


# ------------------------------------------------------------------------------------------------ (c) causal LM
def test_torch_gpt_as_causal_lm():
    torch.manual_seed(0)
    gpt = TinyGPT(vocab=64, block=16, d=32, heads=2, layers=2, p=0.1)
    tokens = np.random.default_rng(0).integers(0, 64, size=8 * 17 + 1)
    data = lm_arrays(tokens, 16)
    batch = {"input_ids": data["input_ids"][:8]}
    assert batch["input_ids"].shape == (8, 17)
    history = LossHistory()
    task = ComposerCausalLM(gpt)
    trainer = Trainer(model=task, train_dataloader=[batch] * 5, max_duration="5ba", optimizers=optax.adam(1e-2),
                      callbacks=[history], progress_bar=False, seed=0)
    trainer.fit()
    losses = history.losses
    assert len(losses) == 5 and np.all(np.isfinite(losses))
    assert losses[-1] < losses[0] - 0.2, losses
    assert np.all(np.diff(losses) < 0), losses  # same batch repeated: every step improves
    # the tied head stays tied through training and back to torch
    bridged = task.pure.bridged
    assert bridged.aliases == {"lm_head.weight": "wte.weight"}
    ts = trainer.state.train_state
    module = bridged.to_torch(ts.params, ts.model_state).eval()
    assert module.lm_head.weight is module.wte.weight
    preds = trainer.predict([batch])[0]
    with torch.no_grad():
        ref = module(torch.from_numpy(batch["input_ids"][:, :-1]).long()).numpy()
    assert_close_on_scale(preds, ref, MODEL_TOL)


# ------------------------------------------------------------------------------------------------ (d) microbatching
def test_microbatching_equals_full_batch():
    g = torch.Generator().manual_seed(0)
    x, y = torch.randn(16, 3, 8, 8, generator=g), torch.randint(0, 4, (16,), generator=g)
    torch.manual_seed(0)
    mlp = TorchMLP(d_in=3 * 8 * 8, hidden=32, num_classes=4)
    results = []
    for micro in (None, 4):
        loader = DataLoader(TensorDataset(x, y), batch_size=16, shuffle=False)
        trainer = Trainer(model=copy.deepcopy(mlp), train_dataloader=loader, max_duration="2ba",
                          optimizers=DecoupledSGDW(lr=0.5, momentum=0.9), device_train_microbatch_size=micro,
                          progress_bar=False, seed=0)
        trainer.fit()
        results.append(jax.tree.map(np.asarray, trainer.state.train_state.params))
    full, micro = results
    assert set(full) == set(dict(mlp.named_parameters()))
    for k in full:
        assert not np.allclose(full[k], mlp.state_dict()[k].numpy())  # it trained
        assert_close_on_scale(micro[k], full[k], LAYER_TOL)


def test_pure_model_carries_bridged_model():
    """Regression for the public path task -> BridgedModel (``PureModel.bridged``, set by ``as_pure_model``)."""
    from torch_bridge import from_torch
    mlp = TorchMLP(d_in=12, hidden=4, num_classes=2)
    bm = from_torch(mlp, (torch.randn(2, 12),), dynamic_batch=True)
    assert bm.as_pure_model().bridged is bm
    task = ComposerClassifier.for_module(mlp).bind({"input": np.zeros((3, 12), np.float32)})
    assert task.pure.bridged.module is mlp and task.pure.bridged.dynamic_batch


def test_frozen_parameters_stay_frozen():
    """``requires_grad=False`` (a frozen backbone, HF's frozen position tables): no gradient, no optimizer state,
    and the user's module keeps the frozen values after fit, bit for bit, while the rest trains."""
    torch.manual_seed(0)
    module = TorchMLP(num_classes=NUM_CLASSES)
    module.net[1].weight.requires_grad_(False)
    frozen, trainable = module.net[1].weight.detach().clone(), module.net[3].weight.detach().clone()
    train, _ = image_loaders(n_train=64)
    trainer = Trainer(model=module, train_dataloader=train, max_duration="2ba", progress_bar=False, seed=0,
                      optimizers=DecoupledSGDW(lr=0.1, momentum=0.9, weight_decay=1e-2))
    params = trainer.state.train_state.params
    assert "net.1.weight" not in params and {"net.1.bias", "net.3.weight"} <= set(params)
    assert "net.1.weight" not in str(jax.tree_util.tree_structure(trainer.state.train_state.opt_state))
    trainer.fit()
    assert torch.equal(module.net[1].weight, frozen) and not module.net[1].weight.requires_grad
    assert not torch.equal(module.net[3].weight, trainable)


def test_batch_size_one_dataloader_trains_and_evaluates_other_sizes():
    """Composer's DataLoader default is batch_size=1. torch.export would pin a batch-1 example's batch dimension to
    1; the bridge exports from a widened example instead, so the graph also takes the eval loader's batches of 7."""
    torch.manual_seed(0)
    module = make_cnn()
    before = copy.deepcopy(module.state_dict())
    x, y = quadrant_images(6, 0)
    train = DataLoader(TensorDataset(x, y), batch_size=1)
    evals = DataLoader(TensorDataset(*quadrant_images(7, 1)), batch_size=7)
    trainer = Trainer(model=module, train_dataloader=train, eval_dataloader=evals, max_duration="6ba",
                      optimizers=DecoupledSGDW(lr=0.05, momentum=0.9), progress_bar=False, seed=0,
                      devices=jax.devices()[:1])  # a batch of 1 does not split over the tests' 2 fake devices
    trainer.fit()
    assert int(trainer.state.timestamp.sample) == 6
    assert np.isfinite(trainer.state.eval_metrics["eval"]["MulticlassAccuracy"])
    assert int(module.state_dict()["bn1.num_batches_tracked"]) == 6
    assert not torch.equal(module.conv1.weight, before["conv1.weight"])  # the module holds the trained weights


def test_adaptive_clipping_uses_torch_output_units_on_bridged_models():
    """AGC clips per output unit: axis 0 of a torch Linear's (out, in) weight, where an NNX Dense keeps them last.
    One plain SGD step in the Trainer must equal torch's gradient clipped with Composer's (out, in) rule."""
    from jaxcomposer.algorithms import apply_gradient_clipping
    torch.manual_seed(0)
    module = TorchMLP(num_classes=NUM_CLASSES)
    start = {k: v.detach().clone() for k, v in module.named_parameters()}
    x, y = quadrant_images(16, 0)
    trainer = Trainer(model=module, train_dataloader=DataLoader(TensorDataset(x, y), batch_size=16),
                      max_duration="1ba", optimizers=DecoupledSGDW(lr=1.0, momentum=0.0), progress_bar=False,
                      algorithms=[GradientClipping("adaptive", 0.01)], seed=0, devices=jax.devices()[:1])
    assert trainer.model_view.param_layout == "torch"
    reference = copy.deepcopy(module)
    torch.nn.functional.cross_entropy(reference(x), y).backward()
    grads = {k: p.grad.numpy() for k, p in reference.named_parameters()}
    params = {k: v.numpy() for k, v in start.items()}
    clipped = {axis: apply_gradient_clipping(grads, "adaptive", 0.01, params, unit_axis=axis) for axis in (0, -1)}
    assert not np.allclose(clipped[0]["net.1.weight"], clipped[-1]["net.1.weight"])  # the axis matters here
    trainer.fit()
    for name, p in module.named_parameters():
        assert_close_on_scale(start[name].numpy() - p.detach().numpy(), clipped[0][name], LAYER_TOL, name)


def test_several_batches_per_call_train_the_torch_module_as_one_per_batch():
    """steps_per_execution with a bridged module and torch DataLoaders: the module the user passed ends with the
    weights (and BatchNorm counters) one call per batch gives it."""
    modules = {}
    for k in (1, 4):
        train, _ = image_loaders()
        modules[k] = make_cnn()
        Trainer(model=modules[k], train_dataloader=train, max_duration="10ba", optimizers=DecoupledSGDW(lr=0.05),
                algorithms=[EMA(half_life="3ba")], progress_bar=False, seed=0, steps_per_execution=k).fit()
    one, several = modules[1].state_dict(), modules[4].state_dict()
    assert int(several["bn1.num_batches_tracked"]) == 10
    for name in one:
        np.testing.assert_allclose(several[name].numpy(), one[name].numpy(), rtol=1e-5, atol=1e-6, err_msg=name)


@pytest.mark.parametrize("smoothing", [0.0, 0.1])
def test_a_bare_torch_segmentation_module_trains_with_torchs_class_axis(smoothing):
    """Composer's classifier loss on (N, C, H, W) outputs and (N, H, W) targets is F.cross_entropy over axis 1;
    with LabelSmoothing, on Composer's smoothed targets (dense, classes on axis 1)."""
    from jaxcomposer.algorithms import LabelSmoothing

    torch.manual_seed(0)
    net = torch.nn.Conv2d(3, 4, 1)
    g = torch.Generator().manual_seed(2)
    x, y = torch.randn(8, 3, 5, 6, generator=g), torch.randint(0, 4, (8, 5, 6), generator=g)
    with torch.no_grad():
        logits = net(x)
        target = torch.nn.functional.one_hot(y, 4).permute(0, 3, 1, 2).float() * (1 - smoothing) + smoothing / 4
        expected = float(-(target * torch.log_softmax(logits, 1)).sum(1).mean())
    seen = []

    class Loss(Callback):
        def batch_end(self, state, logger):
            seen.append(float(state.loss))

    trainer = Trainer(model=net, train_dataloader=DataLoader(TensorDataset(x, y), batch_size=8), max_duration="1ba",
                      progress_bar=False, callbacks=[Loss()],
                      algorithms=[LabelSmoothing(smoothing)] if smoothing else None)
    trainer.fit()
    assert seen == [pytest.approx(expected, abs=1e-5)]
    metrics = trainer.eval(DataLoader(TensorDataset(x, y), batch_size=8))
    with torch.no_grad():
        accuracy = float((net(x).argmax(1) == y).float().mean())
    assert metrics["MulticlassAccuracy"] == pytest.approx(accuracy, abs=1e-6)
