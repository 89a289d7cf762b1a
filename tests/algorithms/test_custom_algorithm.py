"""A user's own Composer ``Algorithm`` (``match``/``apply``) in the Trainer: host events on the host, in-step events
traced into the compiled step (``jaxcomposer/core/algorithm_engine.py``).

Each in-step event is checked against a reference run that makes the same change without an algorithm (the data
changed on the host, the loss or the learning rate scaled), so "runs inside the step" means "trains as Composer's
eager edit would"."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from jaxcomposer import Algorithm, Callback, Event, Trainer
from jaxcomposer.core.algorithm_engine import NAME as ENGINE_NAME
from jaxcomposer.data import ArrayLoader
from jaxcomposer.errors import ConfigurationError
from jaxcomposer.loggers import InMemoryLogger
from jaxcomposer.models.tasks import ComposerClassifier
from jaxcomposer.optim import DecoupledSGDW
from tests.trainer.helpers import digits, leaves, mlp_task

# the files' Trainers share compiled steps through the persistent cache; keep them on one worker
pytestmark = pytest.mark.xdist_group("custom_algorithm")

BATCHES = 4


def train(algorithms=(), *, data=None, loss_fn=None, lr=0.1, loggers=(), batch_size=32, **kw):
    data = data if data is not None else digits("train", BATCHES * batch_size)
    task = mlp_task()
    if loss_fn is not None:
        task = ComposerClassifier(task.user_model, num_classes=10, loss_fn=loss_fn)
    trainer = Trainer(model=task, train_dataloader=ArrayLoader(data, batch_size, shuffle=False),
                      max_duration=f"{BATCHES}ba", optimizers=DecoupledSGDW(lr=lr), seed=0, progress_bar=False,
                      algorithms=list(algorithms), loggers=list(loggers), **kw)
    trainer.fit()
    return trainer


def params(trainer):
    return leaves(trainer.state.train_state.params)


class Edit(Algorithm):
    """Applies ``edit(state)`` at one event and counts its calls (Python side effects, once per matched batch)."""

    def __init__(self, event, edit, every=1):
        self.event, self.edit, self.every, self.calls = event, edit, every, 0

    def match(self, event, state):
        return event == self.event and int(state.timestamp.batch) % self.every == 0

    def apply(self, event, state, logger):
        self.calls += 1
        self.edit(state)


def _half_inputs(state):
    state.batch = {**state.batch, "input": state.batch["input"] * 0.5}


def _half_outputs(state):
    state.outputs = state.outputs * 0.5


def _double_loss(state):
    state.loss = state.loss * 2.0


def _half_grads(state):
    state.grads = jax.tree.map(lambda g: g * 0.5, state.grads)


def _ce(logits, target):
    return -jnp.take_along_axis(jax.nn.log_softmax(logits), target[:, None], axis=-1)[:, 0]


HALF_INPUTS = dict(data={k: v * 0.5 if k == "input" else v for k, v in digits("train", BATCHES * 32).items()})
# event -> (edit, what a run without the algorithm changes to train the same, exact or within float rounding)
EVENTS = {
    Event.AFTER_DATALOADER: (_half_inputs, HALF_INPUTS, True),
    Event.BEFORE_FORWARD: (_half_inputs, HALF_INPUTS, True),
    Event.AFTER_FORWARD: (_half_outputs, dict(loss_fn=lambda logits, target: _ce(logits * 0.5, target)), False),
    Event.BEFORE_LOSS: (_half_outputs, dict(loss_fn=lambda logits, target: _ce(logits * 0.5, target)), False),
    Event.AFTER_LOSS: (_double_loss, dict(lr=0.2), False),
    Event.BEFORE_BACKWARD: (_double_loss, dict(lr=0.2), False),
    Event.AFTER_BACKWARD: (_half_grads, dict(lr=0.05), True),
    Event.AFTER_TRAIN_BATCH: (_half_grads, dict(lr=0.05), True),
}


@pytest.mark.parametrize("event", list(EVENTS), ids=lambda e: e.name)
def test_each_in_step_event_trains_as_the_same_change_made_outside(event):
    edit, reference, exact = EVENTS[event]
    alg = Edit(event, edit)
    got = train([alg])
    want = train(**reference)
    assert alg.calls == BATCHES  # apply's Python ran once per batch, not once per compile
    assert len(got.engine.variants) == 1
    for a, b in zip(params(got), params(want)):
        if exact:
            np.testing.assert_array_equal(a, b)
        else:
            np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6)


def test_a_method_matching_every_other_batch_compiles_two_steps_and_runs_on_its_batches():
    alg = Edit(Event.AFTER_TRAIN_BATCH, _half_grads, every=2)
    trainer = train([alg])
    assert alg.calls == BATCHES // 2
    assert trainer.compiled_programs()[1] == 2  # the matched variant and the plain step, each compiled once
    # batches 0 and 2 trained at half the step: as a learning rate halved on those batches (a host scheduler)
    reference = train(schedulers=[lambda state: 0.5 if int(state.timestamp.batch) % 2 == 0 else 1.0])
    for a, b in zip(params(trainer), params(reference)):
        np.testing.assert_array_equal(a, b)


class ColOut(Algorithm):
    """Composer's custom-method tutorial: drop random rows and columns (NCHW), drawn with torch on the host."""

    def __init__(self, p_row=0.15, p_col=0.15):
        self.p_row, self.p_col = p_row, p_col

    def match(self, event, state):
        return event == Event.AFTER_DATALOADER

    def apply(self, event, state, logger):
        import torch
        inputs, labels = state.batch
        row_size, col_size = inputs.shape[2], inputs.shape[3]
        kept_row_idx = sorted(torch.randperm(row_size)[:int((1 - self.p_row) * row_size)].numpy())
        kept_col_idx = sorted(torch.randperm(col_size)[:int((1 - self.p_col) * col_size)].numpy())
        new_inputs = inputs[:, :, kept_row_idx, :]
        new_inputs = new_inputs[:, :, :, kept_col_idx]
        state.batch = (new_inputs, labels)


class ColOutOnNumpy(ColOut):
    """The same, written against host arrays (``np.asarray`` of the batch): it cannot be traced, so it runs on the
    host batch before the step."""

    def apply(self, event, state, logger):
        inputs, labels = state.batch
        state.batch = (np.asarray(inputs), labels)
        super().apply(event, state, logger)


class NCHWConvNet(nnx.Module):
    """A tiny NNX CNN taking NCHW images of any size (global average pool)."""

    def __init__(self, rngs):
        self.conv = nnx.Conv(1, 8, (3, 3), rngs=rngs)
        self.head = nnx.Linear(8, 10, rngs=rngs)

    def __call__(self, x, train=False, key=None):
        x = jax.nn.relu(self.conv(jnp.transpose(x, (0, 2, 3, 1))))
        return self.head(x.mean(axis=(1, 2)))


def _torch_digits_loader():
    import torch
    d = digits("train", 96)
    images = torch.from_numpy(np.asarray(d["input"], np.float32).reshape(-1, 1, 8, 8))
    dataset = torch.utils.data.TensorDataset(images, torch.from_numpy(np.asarray(d["target"], np.int64)))
    return torch.utils.data.DataLoader(dataset, batch_size=32, shuffle=False)


def _colout_run(algorithms, loader):
    model = ComposerClassifier(NCHWConvNet(nnx.Rngs(0)), num_classes=10)
    trainer = Trainer(model=model, train_dataloader=loader, max_duration="3ba", optimizers=DecoupledSGDW(lr=0.1),
                      seed=0, progress_bar=False, algorithms=algorithms)
    trainer.fit()
    return trainer


@pytest.mark.parametrize("algorithm", [ColOut, ColOutOnNumpy], ids=["traced", "on_host"])
def test_composers_colout_tutorial_trains_on_the_rows_and_columns_it_drew(algorithm, monkeypatch):
    """The tutorial's ColOut on an NNX model fed by a torch DataLoader: traced (its draws enter the step as arrays,
    so new draws each batch compile once) or, written against numpy, run on the host batch; either way it trains
    exactly as the same rows and columns dropped from the data beforehand."""
    import torch
    drawn = []
    randperm = torch.randperm

    def recording_randperm(n, *args, **kwargs):
        perm = randperm(n, *args, **kwargs)
        drawn.append(perm.clone())
        return perm

    monkeypatch.setattr(torch, "randperm", recording_randperm)
    trainer = _colout_run([algorithm()], _torch_digits_loader())
    monkeypatch.undo()
    assert len(drawn) == 6  # one row and one column draw per batch
    assert trainer.engine.host_mode == ({0} if algorithm is ColOutOnNumpy else set())
    if algorithm is ColOut:  # the first draw compiled in; once the draws change they are passed in: two compiles
        assert len(trainer.engine.variants) == 2 and trainer.compiled_programs()[1] == 2

    # the reference: the drawn rows and columns dropped on the host, no algorithm
    batches = []
    for i, (x, y) in enumerate(_torch_digits_loader()):
        rows = sorted(drawn[2 * i][:6].numpy())
        cols = sorted(drawn[2 * i + 1][:6].numpy())
        batches.append({"input": x.numpy()[:, :, rows, :][:, :, :, cols], "target": y.numpy()})
    reference = _colout_run([], batches)
    for a, b in zip(params(trainer), params(reference)):
        np.testing.assert_array_equal(a, b)


def test_after_events_run_last_in_first_out_and_logs_carry_each_batchs_value():
    order = []

    class Named(Algorithm):
        def __init__(self, name):
            self.name = name

        def match(self, event, state):
            return event in (Event.BEFORE_LOSS, Event.AFTER_LOSS, Event.AFTER_TRAIN_BATCH, Event.EPOCH_END)

        def apply(self, event, state, logger):
            order.append((event.name, self.name))
            if event == Event.AFTER_TRAIN_BATCH and self.name == "a":
                logger.log_metrics({"custom/loss_twice": state.loss * 2})

    logger = InMemoryLogger()
    train([Named("a"), Named("b")], loggers=[logger])
    per_batch = [("BEFORE_LOSS", "a"), ("BEFORE_LOSS", "b"), ("AFTER_LOSS", "b"), ("AFTER_LOSS", "a"),
                 ("AFTER_TRAIN_BATCH", "b"), ("AFTER_TRAIN_BATCH", "a")]
    assert order == per_batch * BATCHES + [("EPOCH_END", "a"), ("EPOCH_END", "b")]
    losses = [float(v) for _, v in logger.data["loss/train/total"]]
    logged = [float(v) for _, v in logger.data["custom/loss_twice"]]
    np.testing.assert_allclose(logged, [2 * x for x in losses], rtol=1e-6)


def test_host_events_see_the_run_state_and_run_before_callbacks():
    seen = []

    class Host(Algorithm):
        def match(self, event, state):
            return event in (Event.INIT, Event.FIT_START, Event.BATCH_END, Event.FIT_END)

        def apply(self, event, state, logger):
            seen.append(("algorithm", event, int(state.timestamp.batch)))
            if event == Event.BATCH_END and int(state.timestamp.batch) == 2:
                state.stop_training()

    class Recorder(Callback):
        def run_event(self, event, state, logger):
            if event in (Event.INIT, Event.FIT_START, Event.BATCH_END, Event.FIT_END):
                seen.append(("callback", event, int(state.timestamp.batch)))

    trainer = train([Host()], callbacks=[Recorder()])
    assert int(trainer.state.timestamp.batch) == 2  # the algorithm stopped training at batch 2
    assert seen == [("callback", Event.INIT, 0), ("algorithm", Event.INIT, 0),
                    ("algorithm", Event.FIT_START, 0), ("callback", Event.FIT_START, 0),
                    ("algorithm", Event.BATCH_END, 1), ("callback", Event.BATCH_END, 1),
                    ("algorithm", Event.BATCH_END, 2), ("callback", Event.BATCH_END, 2),
                    ("algorithm", Event.FIT_END, 2), ("callback", Event.FIT_END, 2)]
    assert trainer.state.algorithms[0].__class__ is Host


class ReadsTheLoss(Algorithm):
    def match(self, event, state):
        return event == Event.AFTER_LOSS

    def apply(self, event, state, logger):
        if float(state.loss) > 1.0:  # a value read on the host: not traceable
            state.loss = state.loss * 0.5


def test_an_untraceable_in_step_apply_is_refused_before_any_update_with_its_line():
    trainer = Trainer(model=mlp_task(), train_dataloader=ArrayLoader(digits("train", 64), 32, shuffle=False),
                      max_duration="2ba", optimizers=DecoupledSGDW(lr=0.1), seed=0, progress_bar=False,
                      algorithms=[ReadsTheLoss()])
    before = params(trainer)
    with pytest.raises(ConfigurationError) as raised:
        trainer.fit()
    message = str(raised.value)
    assert "ReadsTheLoss.apply at AFTER_LOSS" in message and "if float(state.loss) > 1.0" in message
    assert "jax.lax.cond" in message
    assert int(trainer.state.timestamp.batch) == 0
    for a, b in zip(params(trainer), before):
        np.testing.assert_array_equal(a, b)


def test_a_program_that_changes_every_batch_is_said_to_recompile():
    class GrowingProgram(Algorithm):
        def match(self, event, state):
            return event == Event.AFTER_LOSS

        def apply(self, event, state, logger):
            for _ in range(1 + int(state.timestamp.batch)):  # as many operations as batches: new structure each
                state.loss = state.loss * 1.0

    with pytest.warns(RuntimeWarning, match=r"jnp.asarray\(x\)"):
        trainer = Trainer(model=mlp_task(), train_dataloader=ArrayLoader(digits("train", 8 * 16), 16, shuffle=False),
                          max_duration="8ba", optimizers=DecoupledSGDW(lr=0.01), seed=0, progress_bar=False,
                          algorithms=[GrowingProgram()])
        trainer.fit()
    assert len(trainer.engine.variants) == 8


def test_a_number_that_changes_every_batch_compiles_twice_and_is_used_per_batch():
    class ArrayScale(Algorithm):
        def match(self, event, state):
            return event == Event.AFTER_TRAIN_BATCH

        def apply(self, event, state, logger):
            scale = 0.5 ** int(state.timestamp.batch)  # a number: passed into the step, not compiled in
            state.grads = jax.tree.map(lambda g: g * scale, state.grads)

    trainer = train([ArrayScale()])  # compiled in at batch 0, passed in from batch 1 on
    assert len(trainer.engine.variants) == 2 and trainer.compiled_programs()[1] == 2
    # batch b trains at lr 0.1 * 0.5**b: as a learning rate scheduled so on the host
    reference = train(schedulers=[lambda state: 0.5 ** int(state.timestamp.batch)])
    for a, b in zip(params(trainer), params(reference)):
        np.testing.assert_array_equal(a, b)


def test_steps_per_execution_with_algorithms_is_refused_up_front():
    with pytest.raises(ConfigurationError, match="steps_per_execution"):
        Trainer(model=mlp_task(), train_dataloader=ArrayLoader(digits("train", 64), 32), max_duration="2ba",
                progress_bar=False, algorithms=[Edit(Event.AFTER_LOSS, _double_loss)], steps_per_execution=4)


def test_imports_as_composers():
    import jaxcomposer
    from jaxcomposer.core import Algorithm as CoreAlgorithm
    assert CoreAlgorithm is Algorithm is jaxcomposer.Algorithm
    assert ENGINE_NAME == "algorithms"
    alg = Edit(Event.AFTER_LOSS, _double_loss)
    assert alg.state_dict() == {"repr": "Edit()"} and not alg.required_on_load() and not alg.find_unused_parameters


def test_colout_and_a_loss_scaling_algorithm_train_a_torch_module_as_composer_would(monkeypatch):
    """A Composer script's torch module, torch DataLoader and torch optimizer, with the tutorial's ColOut and a
    loss-scaling algorithm: it trains as the same rows and columns dropped beforehand with twice the learning rate
    (plain SGD: doubling the loss doubles the step)."""
    import torch

    class LossScaling(Algorithm):
        def match(self, event, state):
            return event == Event.AFTER_LOSS

        def apply(self, event, state, logger):
            state.loss = state.loss * 2

    def module():
        torch.manual_seed(0)
        return torch.nn.Sequential(torch.nn.Conv2d(1, 8, 3, padding=1), torch.nn.ReLU(),
                                   torch.nn.AdaptiveAvgPool2d(1), torch.nn.Flatten(), torch.nn.Linear(8, 10))

    drawn = []
    randperm = torch.randperm
    monkeypatch.setattr(torch, "randperm", lambda n, *a, **k: drawn.append(randperm(n, *a, **k)) or drawn[-1])
    model = module()
    trainer = Trainer(model=model, train_dataloader=_torch_digits_loader(), max_duration="3ba",
                      optimizers=torch.optim.SGD(model.parameters(), lr=0.1), seed=0, progress_bar=False,
                      algorithms=[ColOut(), LossScaling()])
    trainer.fit()
    monkeypatch.undo()
    assert len(drawn) == 6 and not trainer.engine.host_mode

    batches = []
    for i, (x, y) in enumerate(_torch_digits_loader()):
        rows, cols = sorted(drawn[2 * i][:6].numpy()), sorted(drawn[2 * i + 1][:6].numpy())
        batches.append((x[:, :, rows, :][:, :, :, cols], y))
    reference = module()
    optimizer = torch.optim.SGD(reference.parameters(), lr=0.2)
    for x, y in batches:  # eager torch: Composer's loop without the algorithms
        optimizer.zero_grad()
        torch.nn.functional.cross_entropy(reference(x), y).backward()
        optimizer.step()
    for (name, got), want in zip(model.state_dict().items(), reference.state_dict().values()):
        np.testing.assert_allclose(got.numpy(), want.numpy(), rtol=1e-5, atol=1e-6, err_msg=name)


class Counter(Algorithm):
    def __init__(self, payload=None):
        self.seen, self.payload = 0, payload

    def match(self, event, state):
        return event == Event.BATCH_END

    def apply(self, event, state, logger):
        self.seen += 1

    def state_dict(self):
        return {"seen": self.seen, **({} if self.payload is None else {"payload": self.payload})}

    def load_state_dict(self, state):
        self.seen = state["seen"]


def test_an_algorithms_state_dict_is_checkpointed_and_restored_by_class(tmp_path):
    trainer = train([Counter(), Edit(Event.AFTER_LOSS, _double_loss)])
    path = trainer.save_checkpoint(tmp_path / "ckpt")
    fresh = Counter()
    Trainer(model=mlp_task(), train_dataloader=ArrayLoader(digits("train", 64), 32), max_duration="2ba",
            progress_bar=False, load_path=str(path), algorithms=[Edit(Event.AFTER_LOSS, _double_loss), fresh])
    assert fresh.seen == BATCHES
    unsaveable = train([Counter(payload=object())])
    with pytest.raises(ConfigurationError, match=r"Counter.state_dict\(\) returned .* cannot hold"):
        unsaveable.save_checkpoint(tmp_path / "never")
    assert not (tmp_path / "never").exists()


def test_algorithm_passes_reorder_as_composers_engine():
    order = []

    class Named(Algorithm):
        def __init__(self, name):
            self.name = name

        def match(self, event, state):
            return event in (Event.BEFORE_LOSS, Event.EPOCH_END)

        def apply(self, event, state, logger):
            order.append((event.name, self.name))

    reverse = lambda algorithms, event: list(reversed(algorithms))  # noqa: E731 (a Composer pass)
    train([Named("a"), Named("b")], algorithm_passes=[reverse])
    assert order == [("BEFORE_LOSS", "b"), ("BEFORE_LOSS", "a")] * BATCHES + [("EPOCH_END", "b"), ("EPOCH_END", "a")]
    with pytest.raises(ConfigurationError, match="algorithm_passes"):
        train([], algorithm_passes=[reverse])


def test_an_edit_of_a_field_a_built_in_method_also_edits_is_reported_before_compiling():
    from jaxcomposer.algorithms import GradientClipping
    with pytest.warns(RuntimeWarning, match=r"Edit.apply at AFTER_TRAIN_BATCH changes state.grads, which "
                                            r"\['GradientClipping'\] also change there"):
        train([GradientClipping("norm", 1.0), Edit(Event.AFTER_TRAIN_BATCH, _half_grads)])
    import warnings
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # reading the gradients only, or another field: nothing to report
        train([GradientClipping("norm", 1.0), Edit(Event.AFTER_LOSS, _double_loss)])


def test_loss_events_run_per_microbatch_with_gradient_accumulation():
    alg = Edit(Event.AFTER_LOSS, _double_loss)
    got = train([alg], device_train_microbatch_size=16)
    want = train(lr=0.2, device_train_microbatch_size=16)
    assert alg.calls == BATCHES  # replayed once per batch: the program runs on each microbatch inside the step
    for a, b in zip(params(got), params(want)):
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6)


def _torch_linear():
    import torch
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Flatten(), torch.nn.Linear(64, 10))


def test_torch_code_in_an_in_step_apply_is_captured_with_torch_export():
    """Composer-style torch code at in-step events of a torch model: ``torch.mul`` on the loss and Composer's idiom
    ``p.grad.mul_`` over ``state.model.parameters()`` do not trace as JAX; they are exported with torch, lowered
    into the step, and train as eager torch would (loss x4, gradients x0.5: twice the step)."""
    import torch

    class TorchLossScale(Algorithm):
        def __init__(self):
            self.calls = 0

        def match(self, event, state):
            return event == Event.AFTER_LOSS

        def apply(self, event, state, logger):
            self.calls += 1
            state.loss = torch.mul(state.loss, 4.0)

    class HalfGrads(Algorithm):
        def match(self, event, state):
            return event == Event.AFTER_TRAIN_BATCH

        def apply(self, event, state, logger):
            for p in state.model.parameters():
                if p.grad is not None:
                    p.grad.mul_(0.5)

    module, scale = _torch_linear(), TorchLossScale()
    trainer = Trainer(model=module, train_dataloader=_torch_digits_loader(), max_duration="3ba",
                      optimizers=torch.optim.SGD(module.parameters(), lr=0.1), progress_bar=False, seed=0,
                      algorithms=[scale, HalfGrads()])
    trainer.fit()
    assert scale.calls == 3  # its Python ran once per batch (the export's own run undone)
    assert len(trainer.engine._captured) == 2 and len(trainer.engine.variants) == 1
    reference = _torch_linear()
    optimizer = torch.optim.SGD(reference.parameters(), lr=0.2)
    for x, y in _torch_digits_loader():
        optimizer.zero_grad()
        torch.nn.functional.cross_entropy(reference(x), y).backward()
        optimizer.step()
    for (name, got), want in zip(module.state_dict().items(), reference.state_dict().values()):
        np.testing.assert_allclose(got.numpy(), want.numpy(), rtol=1e-5, atol=1e-6, err_msg=name)


def test_an_apply_neither_jax_nor_torch_export_can_capture_is_refused_with_both_reasons():
    class BranchOnTheLoss(Algorithm):
        def match(self, event, state):
            return event == Event.AFTER_LOSS

        def apply(self, event, state, logger):
            if state.loss.item() > 1.0:  # a value on the host: neither traces
                state.loss = state.loss * 0.5

    module = _torch_linear()
    trainer = Trainer(model=module, train_dataloader=_torch_digits_loader(), max_duration="1ba",
                      progress_bar=False, algorithms=[BranchOnTheLoss()])
    with pytest.raises(ConfigurationError, match=r"(?s)BranchOnTheLoss.apply at AFTER_LOSS .*state.loss.item\(\).*"
                                                 r"torch.export instead, it failed too"):
        trainer.fit()


def test_something_neither_a_method_nor_an_algorithm_is_still_refused_beside_algorithms():
    with pytest.raises(TypeError, match="expected jaxcomposer Method objects, got str"):
        train([Edit(Event.AFTER_LOSS, _double_loss), "label_smoothing"])


class TorchMixUp(Algorithm):
    """Composer's MixUp the way its own class is written, for a torch model: draws on the host at AFTER_DATALOADER
    (from a generator it holds), keeps the permuted targets and the mixing on self, and mixes the loss with torch
    at AFTER_LOSS."""

    def __init__(self, mixing_as_tensor: bool):
        import torch
        self.generator, self.mixing_as_tensor = torch.Generator().manual_seed(0), mixing_as_tensor

    def match(self, event, state):
        return event in (Event.AFTER_DATALOADER, Event.AFTER_LOSS)

    def apply(self, event, state, logger):
        import torch
        if event == Event.AFTER_DATALOADER:
            inputs, targets = state.batch
            mixing = 0.5 * torch.rand((), generator=self.generator)
            self.mixing = mixing if self.mixing_as_tensor else float(mixing)
            permutation = torch.randperm(inputs.shape[0], generator=self.generator)
            self.permuted_target = targets[permutation]
            state.batch = ((1 - self.mixing) * inputs + self.mixing * inputs[permutation], targets)
        else:
            new_loss = torch.nn.functional.cross_entropy(state.outputs, self.permuted_target)
            state.loss = (1 - self.mixing) * state.loss + self.mixing * new_loss


@pytest.mark.parametrize("mixing_as_tensor", [False, True], ids=["float", "tensor"])
def test_composers_mixup_written_for_torch_carries_its_draws_across_events(mixing_as_tensor):
    """State kept on self between events (the permuted targets, the mixing) reaches the captured AFTER_LOSS
    program with each batch's values: a tensor is passed in, a Python number makes a new export (so the float
    version exports once per batch, the tensor version once); both train as eager torch does."""
    import torch
    module, mixup = _torch_linear(), TorchMixUp(mixing_as_tensor)
    trainer = Trainer(model=module, train_dataloader=_torch_digits_loader(), max_duration="3ba",
                      optimizers=torch.optim.SGD(module.parameters(), lr=0.1), progress_bar=False, seed=0,
                      algorithms=[mixup])
    trainer.fit()
    assert trainer.engine.host_mode == {0}  # torch indexing of the batch: AFTER_DATALOADER runs on the host
    assert trainer.engine._recaptures == (0 if mixing_as_tensor else 2)

    reference, eager = _torch_linear(), TorchMixUp(mixing_as_tensor)
    optimizer = torch.optim.SGD(reference.parameters(), lr=0.1)
    for x, y in _torch_digits_loader():  # Composer's loop: the same apply, eagerly, around the same steps
        state = type("State", (), {})()
        state.batch = (x, y)
        eager.apply(Event.AFTER_DATALOADER, state, None)
        optimizer.zero_grad()
        state.outputs = reference(state.batch[0])
        state.loss = torch.nn.functional.cross_entropy(state.outputs, y)
        eager.apply(Event.AFTER_LOSS, state, None)
        state.loss.backward()
        optimizer.step()
    for (name, got), want in zip(module.state_dict().items(), reference.state_dict().values()):
        np.testing.assert_allclose(got.numpy(), want.numpy(), rtol=1e-5, atol=1e-6, err_msg=name)


def test_an_algorithm_matching_events_by_their_string_runs_as_in_composers_docs():
    class ByName(Algorithm):
        calls = 0

        def match(self, event, state):
            return event == "after_loss"  # Composer's Event is a string enum; its docs match this way

        def apply(self, event, state, logger):
            self.calls += 1
            state.loss = state.loss * 2.0

    alg = ByName()
    got, want = train([alg]), train(lr=0.2)
    assert Event.AFTER_LOSS == "after_loss" and alg.calls == BATCHES
    for a, b in zip(params(got), params(want)):
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6)
