"""Composer's model protocols on torch modules: a Composer user's script runs with only its imports changed and
its module holds the trained weights; the model's own loss and gradients equal torch's; Hugging Face models train
through ``HuggingFaceModel`` with loss and gradient parity."""
import copy

import jax
import numpy as np
import pytest
import torch

from jaxcomposer import Callback
from jaxcomposer.trainer import step as step_lib
from tests.torch_bridge.parity import LAYER_TOL, MODEL_TOL, assert_close_on_scale
from tests.torch_bridge.test_trainer_bridge import image_loaders

# its exports and compiles are shared through module-level fixtures: keep its tests on one xdist worker
pytestmark = pytest.mark.xdist_group("test_composer_model")


# ----------------------------------------------------------------------------------------------------------------
# A Composer user's script. Only the four marked imports differ from the Composer original.
import torch.nn as nn  # noqa: E402
import torch.nn.functional as F  # noqa: E402

from jaxcomposer import Trainer  # noqa: E402  (from composer import Trainer)
from jaxcomposer.algorithms import EMA, BlurPool, LabelSmoothing  # noqa: E402  (from composer.algorithms import ...)
from jaxcomposer.optim import DecoupledSGDW  # noqa: E402  (from composer.optim import DecoupledSGDW)
from torch_bridge import ComposerModel  # noqa: E402  (from composer.models import ComposerModel)


class Net(ComposerModel):
    def __init__(self, num_classes: int = 3):
        super().__init__()
        self.conv1 = nn.Conv2d(3, 16, 3, padding=1)
        self.pool = nn.MaxPool2d(2)
        self.conv2 = nn.Conv2d(16, 32, 3, stride=2, padding=1)
        self.fc = nn.Linear(32, num_classes)
        # imported here, not at the top: importing torchmetrics is slow, and every xdist worker would pay it
        # while collecting the suite
        from torchmetrics import Accuracy
        self.train_accuracy = Accuracy(task="multiclass", num_classes=num_classes)
        self.val_accuracy = Accuracy(task="multiclass", num_classes=num_classes)

    def forward(self, batch):
        inputs, _ = batch
        x = self.pool(F.relu(self.conv1(inputs)))
        x = F.relu(self.conv2(x))
        return self.fc(x.mean(dim=(2, 3)))

    def loss(self, outputs, batch):
        _, targets = batch
        return F.cross_entropy(outputs, targets)

    def get_metrics(self, is_train=False):
        return {"MulticlassAccuracy": self.train_accuracy if is_train else self.val_accuracy}

    def update_metric(self, batch, outputs, metric):
        metric.update(outputs, batch[1])


def halve_every_epoch(state, ssr=1.0):  # a Composer function scheduler
    return 0.5 ** state.timestamp.epoch.value


def composer_script(train_dataloader, eval_dataloader):
    torch.manual_seed(0)
    model = Net()
    trainer = Trainer(
        model=model,
        train_dataloader=train_dataloader,
        eval_dataloader=eval_dataloader,
        max_duration="3ep",
        optimizers=DecoupledSGDW(model.parameters(), lr=0.1, momentum=0.9),
        schedulers=[halve_every_epoch],
        algorithms=[LabelSmoothing(smoothing=0.1), BlurPool(), EMA(half_life="5ba")],
        progress_bar=False,
        seed=0,
    )
    trainer.fit()
    return model, trainer
# ----------------------------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def scripted():
    train, evals = image_loaders()
    model, trainer = composer_script(train, evals)
    return model, trainer, evals


def test_composer_script_trains_and_its_module_is_the_trained_model(scripted):
    from torch_bridge.surgery import BlurConv2d, BlurMaxPool2d

    model, trainer, evals = scripted
    assert trainer.state.model is model
    assert isinstance(model.pool, BlurMaxPool2d) and isinstance(model.conv2, BlurConv2d)  # surgery, in place
    ts = trainer.state.train_state
    sd = model.state_dict()
    for name, value in ts.params.items():  # the trained (raw) weights, bit for bit
        np.testing.assert_array_equal(sd[name.removeprefix("model.")].numpy(), np.asarray(value), err_msg=name)
    assert trainer.state.learning_rate(int(trainer.state.timestamp.batch) - 1) == pytest.approx(0.1 * 0.25)
    # the metrics are the model's own torchmetrics, over the EMA weights eval uses; torch agrees
    accuracy = trainer.state.eval_metrics["eval"]["MulticlassAccuracy"]
    assert accuracy > 0.6  # chance is 1/3
    params, state = step_lib.eval_weights(trainer.composed, ts, trainer.run_info)
    ema_model = copy.deepcopy(model)
    ema_model.load_state_dict({**sd, **{k.removeprefix("model."): torch.from_numpy(np.array(v))
                                        for k, v in {**params, **state}.items()}})
    ema_model.eval()
    with torch.no_grad():
        predictions = torch.cat([ema_model((x, y)).argmax(-1) for x, y in evals])
    targets = torch.cat([y for _, y in evals])
    assert accuracy == pytest.approx((predictions == targets).float().mean().item(), abs=1e-6)


def _task_for(module, batch):
    from torch_bridge import TorchComposerTask

    task = TorchComposerTask(module)
    task.note_raw_batch(batch)
    return task.bind(batch)


def _grads_and_loss(task, batch):
    def mean_loss(params):
        outputs, _ = task.forward(params, task.state, batch, train=True)
        return task.loss(outputs, batch).mean()

    return jax.jit(jax.value_and_grad(mean_loss))(task.params)


def test_composer_model_loss_and_gradients_equal_torch():
    torch.manual_seed(1)
    model = Net()
    (x, y), = [next(iter(image_loaders(batch_size=16)[0]))]
    task = _task_for(copy.deepcopy(model), {"input": x.numpy(), "target": y.numpy()})
    loss, grads = _grads_and_loss(task, {"input": x.numpy(), "target": y.numpy()})
    model.train()
    expected = model.loss(model((x, y)), (x, y))
    expected.backward()
    assert_close_on_scale(loss, expected.detach(), LAYER_TOL)
    torch_params = dict(model.named_parameters())
    assert {k.removeprefix("model.") for k in grads} == set(torch_params)
    for name, g in grads.items():
        assert_close_on_scale(g, torch_params[name.removeprefix("model.")].grad, MODEL_TOL)


# ---------------------------------------------------------------------------------------------- Hugging Face
def _hf_batch(kind: str, n: int = 4, t: int = 12, vocab: int = 96):
    g = np.random.default_rng(3)
    ids = g.integers(1, vocab, (n, t))
    mask = np.ones((n, t), np.int64)
    mask[1, t - 4:] = 0  # one padded example
    if kind == "causal":
        labels = np.where(mask == 1, ids, -100)
    elif kind == "mlm":
        labels = np.full((n, t), -100)
        labels[:, 2::3] = ids[:, 2::3]
    else:
        labels = g.integers(0, 3, (n,))
    return {"input_ids": ids, "attention_mask": mask, "labels": labels}


def _hf_model(kind: str):
    import transformers  # not at the top, as torchmetrics above

    torch.manual_seed(0)
    if kind == "causal":
        cfg = transformers.GPT2Config(vocab_size=96, n_positions=16, n_embd=32, n_layer=2, n_head=2,
                                      resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0)
        return transformers.GPT2LMHeadModel(cfg)
    cfg = transformers.BertConfig(vocab_size=96, hidden_size=32, num_hidden_layers=2, num_attention_heads=2,
                                  intermediate_size=64, max_position_embeddings=16, num_labels=3,
                                  hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0)
    return (transformers.BertForMaskedLM if kind == "mlm" else transformers.BertForSequenceClassification)(cfg)


@pytest.mark.parametrize("kind", ["causal", "mlm", "classification"])
def test_hugging_face_model_loss_and_gradients_equal_torch(kind):
    from torch_bridge import HuggingFaceModel

    hf = HuggingFaceModel(_hf_model(kind))
    batch = _hf_batch(kind)
    task = _task_for(copy.deepcopy(hf), batch)
    loss, grads = _grads_and_loss(task, batch)
    hf.train()
    torch_batch = {k: torch.from_numpy(v) for k, v in batch.items()}
    expected = hf.loss(hf(torch_batch), torch_batch)
    expected.backward()
    assert_close_on_scale(loss, expected.detach(), LAYER_TOL)
    torch_params = {k: p for k, p in hf.named_parameters()}
    for name, g in grads.items():
        ref = torch_params[name.removeprefix("model.")].grad
        if ref is None:  # unused by this head (e.g. the pooler under masked LM): zero here
            np.testing.assert_array_equal(np.asarray(g), 0)
        else:
            assert_close_on_scale(g, ref, MODEL_TOL)


def test_hugging_face_gpt2_trains_in_the_trainer_and_holds_the_weights():
    from torch.utils.data import DataLoader

    from torch_bridge import HuggingFaceModel

    rows = _hf_batch("causal", n=32)
    dataset = [{k: torch.from_numpy(v[i]) for k, v in rows.items()} for i in range(32)]
    loader = DataLoader(dataset, batch_size=8, shuffle=False)
    model = HuggingFaceModel(_hf_model("causal"))
    losses = []

    class Record(Callback):
        def batch_end(self, state, logger):
            losses.append(float(state.batch_metrics["loss"]))

    trainer = Trainer(model=model, train_dataloader=loader, max_duration="3ep", progress_bar=False, seed=0,
                      optimizers=DecoupledSGDW(model.parameters(), lr=0.5), callbacks=[Record()])
    trainer.fit()
    assert len(losses) == 12 and losses[-1] < losses[0] - 0.05, losses
    sd = model.state_dict()
    for name, value in trainer.state.train_state.params.items():
        np.testing.assert_array_equal(sd[name.removeprefix("model.")].numpy(), np.asarray(value), err_msg=name)


def test_amp_bf16_trains_a_composer_model():
    """amp_bf16 casts the batch's floats to bfloat16 before the forward; the exported graph takes them (a bf16 input
    is a float for the signature check, not a method's edit of the batch) and the loss is the fp32 one to bf16's
    precision."""
    losses = {}
    for precision in ("fp32", "amp_bf16"):
        seen = []

        class FirstLoss(Callback):
            def batch_end(self, state, logger):
                seen.append(float(state.loss))

        torch.manual_seed(0)
        train, _ = image_loaders()
        Trainer(model=Net(), train_dataloader=train, max_duration="2ba", precision=precision, progress_bar=False,
                optimizers=DecoupledSGDW(lr=0.1), callbacks=[FirstLoss()], seed=0).fit()
        losses[precision] = seen
    assert len(losses["amp_bf16"]) == 2 and np.all(np.isfinite(losses["amp_bf16"]))
    np.testing.assert_allclose(losses["amp_bf16"][0], losses["fp32"][0], rtol=2e-2)


def test_jaxcomposer_metrics_work_in_a_torch_models_update_metric():
    """Composer's docs build get_metrics from composer.metrics (torchmetrics); jaxcomposer.metrics' pure metrics
    are handed to update_metric as stateful objects with torchmetrics' update/compute."""
    from jaxcomposer.metrics import CrossEntropy
    from torch_bridge.composer_model import TorchStyleMetric, _HostMetrics

    class WithCE(Net):
        def get_metrics(self, is_train=False):
            return {"CrossEntropy": CrossEntropy()}

    model = WithCE()
    host = _HostMetrics(model, None)
    assert isinstance(host.metrics["CrossEntropy"], TorchStyleMetric)
    g = torch.Generator().manual_seed(0)
    batches = [(torch.randn(n, 3, 8, 8, generator=g), torch.randint(0, 3, (n,), generator=g)) for n in (8, 4)]
    for x, y in batches:
        with torch.no_grad():
            host.update({"input": x.numpy(), "target": y.numpy()}, model((x, y)).numpy())
    with torch.no_grad():
        expected = torch.cat([F.cross_entropy(model(b), b[1], reduction="none") for b in batches]).mean()
    assert host.compute()["CrossEntropy"] == pytest.approx(float(expected), abs=1e-6)  # a mean over examples


def test_huggingface_model_shifts_causal_lm_labels_for_its_metrics():
    from torch_bridge import HuggingFaceModel

    class TinyForCausalLM(torch.nn.Module):
        def forward(self, input_ids, labels=None):
            return {"logits": torch.zeros(*input_ids.shape, 5)}

    class Seen:
        def update(self, preds, target):
            self.target = target

    labels = torch.tensor([[1, 2, 3, 4]])
    for shift, expected in ((None, [[2, 3, 4, -100]]), (False, [[1, 2, 3, 4]])):
        seen = Seen()
        HuggingFaceModel(TinyForCausalLM(), shift_labels=shift).update_metric({"labels": labels}, None, seen)
        assert seen.target.tolist() == expected
