import operator

import pytest

from jaxcomposer.callbacks import EarlyStopper, ThresholdStopper
from jaxcomposer.callbacks.stoppers import infer_comp
from jaxcomposer.core.events import Event
from jaxcomposer.core.time import Time
from jaxcomposer.loggers import Logger
from tests.loggers.helpers import fake_fit, make_state


class NotYet:
    """A device value stand-in: not computed until the next batch has been dispatched."""

    def __init__(self, value):
        self.value, self.reads = value, 0

    def is_ready(self):
        return False

    def __float__(self):
        self.reads += 1
        return self.value


def run_evals(stopper, values, name="accuracy", label="eval", eval_every=2):
    """Evaluate every ``eval_every`` batches with successive ``values``; returns (state, number of evals run)."""
    state = make_state(total_steps=eval_every * len(values), steps_per_epoch=eval_every)
    seen = []

    def eval_fn(i):
        seen.append(i)
        return {name: values[i]}

    fake_fit([stopper], state, [1.0] * (eval_every * len(values)), eval_every=eval_every, eval_fn=eval_fn,
             label=label)
    return state, len(seen)


@pytest.mark.parametrize("patience", [0, 1, 2, 3])
def test_int_patience_is_epochs_as_in_composer(patience):
    # One eval per epoch (eval i at epoch i). Best 0.6 at eval 1 (epoch 1); later evals never improve. Composer's
    # rule: stop once epoch - best_epoch > patience, i.e. at eval 2 + patience.
    values = [0.5, 0.6, 0.6, 0.55, 0.59, 0.58, 0.4, 0.3]
    stopper = EarlyStopper("accuracy", patience=patience)
    assert stopper.patience == Time(patience, "ep")
    state, n = run_evals(stopper, values)
    assert state.stop_requested and n == 3 + patience
    assert "eval/accuracy did not improve" in state.stop_reason and "0.6" in state.stop_reason
    assert f"patience {patience}ep" in state.stop_reason
    # the same as the time string
    state_str, n_str = run_evals(EarlyStopper("accuracy", patience=f"{patience}ep"), values)
    assert n_str == n and state_str.stop_reason == state.stop_reason


def test_int_patience_counts_epochs_not_evaluations():
    # Two evals per epoch: patience=1 (one epoch) lets 2-3 bad evals pass, not 1.
    state = make_state(total_steps=16, steps_per_epoch=4)
    values = [0.9, 0.1, 0.1, 0.1, 0.1, 0.1, 0.1, 0.1]
    fake_fit([EarlyStopper("accuracy", patience=1)], state, [1.0] * 16, eval_every=2,
             eval_fn=lambda i: {"accuracy": values[i]})
    # best at batch 2 (epoch 0); epochs are counted in whole epochs: the first eval in epoch 2 stops (batch 10)
    assert state.stop_requested and state.timestamp.batch == 10


def test_early_stopper_not_before_patience_and_resets_on_improvement():
    values = [0.5, 0.4, 0.45, 0.7, 0.69, 0.68, 0.8, 0.79]
    state, n = run_evals(EarlyStopper("accuracy", patience=2), values)
    assert not state.stop_requested and n == len(values)


def test_early_stopper_min_delta_and_loss_direction():
    # Gains of 0.005 are within min_delta, so they are not improvements.
    state, n = run_evals(EarlyStopper("accuracy", min_delta=0.01, patience=1), [0.5, 0.505, 0.509, 0.9])
    assert state.stop_requested and n == 3
    # cross_entropy is minimised: going down is improving, so no stop.
    state, n = run_evals(EarlyStopper("cross_entropy", patience=0), [3.0, 2.0, 1.0, 0.5], name="cross_entropy")
    assert not state.stop_requested
    state, n = run_evals(EarlyStopper("cross_entropy", patience=0), [3.0, 2.0, 2.5], name="cross_entropy")
    assert state.stop_requested and n == 3


def test_early_stopper_batch_patience():
    stopper = EarlyStopper("accuracy", patience="5ba")
    state, n = run_evals(stopper, [0.9, 0.1, 0.1, 0.1, 0.1, 0.1])
    assert state.stop_requested and n == 4  # 6 batches since the best at batch 2
    assert "for 6ba (patience 5ba)" in state.stop_reason


def test_early_stopper_train_label_reads_step_outputs_at_epoch_end():
    # patience in epochs: the loss is read once per epoch (the last batch's), not every batch
    reads = []

    class Loss(float):
        def __float__(self):
            reads.append(self.real)
            return self.real

    state = make_state(total_steps=20, steps_per_epoch=4)
    losses = [Loss(v) for v in [5, 5, 5, 4, 5, 5, 5, 4.5, 5, 5, 5, 4.2, 5, 5, 5, 4.1, 5, 5, 5, 5]]
    fake_fit([EarlyStopper("loss", dataloader_label="train", patience=1)], state, losses, eval_every=None)
    assert reads == [4, 4.5, 4.2]  # epoch ends at batches 4, 8, 12
    # best 4 at the end of epoch 0; epoch 2 ends with 4.2, more than one epoch later
    assert state.stop_requested and state.timestamp.batch == 12


def test_early_stopper_train_label_batch_patience_does_not_wait_for_the_step():
    stopper, state, logger = EarlyStopper("loss", dataloader_label="train", patience="2ba"), make_state(), Logger()
    values = [NotYet(v) for v in [3.0, 2.0, 2.5, 2.5, 2.5, 2.5]]
    for v in values:
        state.timestamp = state.timestamp.to_next_batch(samples=8)
        state.batch_metrics = {"loss": v}
        stopper.run_event(Event.BATCH_END, state, logger)
        if state.stop_requested:
            break
    # each batch's value is read one batch later at the latest (never the one just dispatched)
    assert [v.reads for v in values] == [1, 1, 1, 1, 1, 0]
    # best 2.0 at batch 2; the reading of batch 5 (3 batches later) stops, seen at BATCH_END of batch 6
    assert state.stop_requested and state.timestamp.batch == 6 and "(step 2)" in state.stop_reason


def test_early_stopper_ignores_other_evaluators():
    stopper, state, logger = EarlyStopper("accuracy", dataloader_label="val", patience=2), make_state(), Logger()
    state.eval_metrics["val"] = {"accuracy": 0.5}
    stopper.run_event(Event.EVAL_END, state, logger)
    for _ in range(3):  # EVAL_END of another evaluator: same 'val' dict, must not count again
        state.eval_metrics["other"] = {"accuracy": 0.1}
        stopper.run_event(Event.EVAL_END, state, logger)
    assert stopper.bad_readings == 0 and not state.stop_requested
    state.eval_metrics["val"] = {"loss": 1.0}
    with pytest.raises(ValueError, match="'accuracy' is not among the metrics of evaluator 'val'"):
        stopper.run_event(Event.EVAL_END, state, logger)


def test_threshold_stopper_first_eval_reaching_threshold():
    state, n = run_evals(ThresholdStopper("accuracy", "eval", 0.75), [0.5, 0.7, 0.75, 0.9])
    assert state.stop_requested and n == 3 and state.timestamp.batch == 6
    assert state.stop_reason == "ThresholdStopper: eval/accuracy=0.75 reached the threshold 0.75 at step 6."
    state, n = run_evals(ThresholdStopper("accuracy", threshold=0.95), [0.5, 0.7, 0.75, 0.9])
    assert not state.stop_requested and n == 4
    state, n = run_evals(ThresholdStopper("cross_entropy", threshold=1.0), [3.0, 1.5, 0.9, 0.5], name="cross_entropy")
    assert state.stop_requested and n == 3


def test_threshold_stopper_train():
    state = make_state()
    fake_fit([ThresholdStopper("loss", "train", 1.0, stop_on_batch=True)], state, [3.0, 2.0, 0.9, 0.5] + [0.1] * 16,
             eval_every=None)
    assert state.stop_requested and state.timestamp.batch == 3
    state = make_state(steps_per_epoch=5)
    fake_fit([ThresholdStopper("loss", "train", 1.0)], state, [3.0, 2.0, 0.9, 0.5, 0.4] + [0.1] * 15,
             eval_every=None)
    assert state.stop_requested and state.timestamp.batch == 5  # checked at EPOCH_END


def test_comp_inference_and_explicit():
    assert infer_comp("accuracy", None) == "greater"
    assert infer_comp("MulticlassAccuracy", None) == "greater"
    for name in ("loss", "cross_entropy", "perplexity", "error_rate", "val_nll"):
        assert infer_comp(name, None) == "less"
    assert infer_comp("loss", "gt") == "greater" and infer_comp("accuracy", "LESS") == "less"
    assert infer_comp("x", operator.ge) is operator.ge
    state, n = run_evals(EarlyStopper("loss", comp="greater", patience=0), [1.0, 2.0, 1.5], name="loss")
    assert state.stop_requested and n == 3


@pytest.mark.parametrize("kwargs, match", [
    (dict(monitor=""), "monitor"),
    (dict(monitor="acc", dataloader_label=""), "dataloader_label"),
    (dict(monitor="acc", comp="bigger"), "comp"),
    (dict(monitor="acc", patience=-1), "patience"),
    (dict(monitor="acc", patience=True), "patience"),
    (dict(monitor="acc", patience="0.5dur"), "'ep' or 'ba'"),
    (dict(monitor="acc", patience=1.5), "patience"),
    (dict(monitor="acc", min_delta=float("nan")), "min_delta"),
])
def test_early_stopper_validation(kwargs, match):
    with pytest.raises(ValueError, match=match):
        EarlyStopper(**kwargs)


def test_threshold_stopper_validation():
    with pytest.raises(ValueError, match="threshold is required"):
        ThresholdStopper("accuracy")
    with pytest.raises(ValueError, match="comp"):
        ThresholdStopper("accuracy", threshold=0.5, comp=3)


def test_a_torch_comparison_gets_tensors_as_in_composer():
    import torch

    seen = []

    def less(a, b):  # a torch function by its module, as torch.less is
        seen.append((type(a), type(b)))
        return torch.less(a, b)

    less.__module__ = "torch"
    for comp in (torch.less, less):
        state, n = run_evals(ThresholdStopper("cross_entropy", threshold=1.0, comp=comp), [3.0, 1.5, 0.9, 0.5],
                             name="cross_entropy")
        assert state.stop_requested and n == 3
    assert set(seen) == {(torch.Tensor, torch.Tensor)}
