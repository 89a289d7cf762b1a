"""``steps_per_execution``: several batches per compiled call train exactly as one call per batch.

Each run here trains the same digits MLP twice, one call per batch (K=1) and up to 4 per call (K=4), and compares
what a user can see: the weights, every logged loss, the events with their timestamps, the evaluations and the
checkpoints (each at the batch it is due, so calls are cut there), a non-finite batch's error, and the one
documented difference, a stop requested inside a call taking effect at its end.
"""
import numpy as np
import pytest

from jaxcomposer import Callback, Event, Trainer
from jaxcomposer.algorithms import EMA, ProgressiveResizing
from jaxcomposer.callbacks import NonFiniteLossError
from jaxcomposer.loggers import InMemoryLogger
from jaxcomposer.optim import CosineAnnealingScheduler, DecoupledSGDW
from jaxcomposer.trainer.trainer import ConfigurationError
from tests.trainer.helpers import leaves, loaders, mlp_task, resnet_task
from tests.trainer.test_nonfinite import PoisonedLoader

K = 4


class Events(Callback):
    """Every event with the batch count it saw, and the loss each BATCH_END saw."""

    def __init__(self):
        self.seen, self.losses = [], []

    def run_event(self, event, state, logger):
        self.seen.append((event.value, int(state.timestamp.batch)))
        if event == Event.BATCH_END:
            self.losses.append(float(state.batch_metrics["loss"]))


def run(k, tmp_path=None, **kw):
    train, evals = loaders(batch_size=32)  # 42 batches per epoch: not a multiple of K
    events, logger = Events(), InMemoryLogger()
    defaults = dict(model=mlp_task(), train_dataloader=train, eval_dataloader=evals, max_duration="2ep",
                    optimizers=DecoupledSGDW(lr=0.1, momentum=0.9), schedulers=[CosineAnnealingScheduler()],
                    seed=0, progress_bar=False, callbacks=[events], loggers=[logger], steps_per_execution=k,
                    save_folder=None if tmp_path is None else tmp_path / f"k{k}")
    defaults.update(kw)
    trainer = Trainer(**defaults)
    state = trainer.fit()
    trainer.close()
    return trainer, state, events, logger


# (id, Trainer arguments): each run once with K=1 and once with K=4
RUNS = [
    ("epochs_eval_each_epoch", {}),
    ("eval_and_save_every_5_batches", {"eval_interval": "5ba", "save_interval": "5ba", "max_duration": "23ba"}),
]


@pytest.fixture(scope="module", params=RUNS, ids=[r[0] for r in RUNS])
def pair(request, tmp_path_factory):
    tmp = tmp_path_factory.mktemp(request.param[0])
    return {k: run(k, tmp, **request.param[1]) for k in (1, K)}


def test_weights_and_timestamps_match_one_call_per_batch(pair):
    (t1, s1, _, _), (tk, sk, _, _) = pair[1], pair[K]
    assert sk.timestamp.batch == s1.timestamp.batch and sk.timestamp.epoch == s1.timestamp.epoch
    for a, b in zip(leaves(sk.train_state), leaves(s1.train_state)):
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6)  # the same steps, compiled inside a scan


def test_every_event_fires_in_order_with_its_timestamp(pair):
    assert pair[K][2].seen == pair[1][2].seen


def test_each_batch_logs_its_own_loss(pair):
    np.testing.assert_allclose(pair[K][2].losses, pair[1][2].losses, rtol=1e-5)
    assert len(set(pair[K][2].losses)) == len(pair[K][2].losses)  # not one value per call


def test_evaluations_and_checkpoints_come_at_the_same_batches(pair):
    (t1, s1, _, log1), (tk, sk, _, logk) = pair[1], pair[K]
    evals1, evalsk = log1.data["metrics/eval/MulticlassAccuracy"], logk.data["metrics/eval/MulticlassAccuracy"]
    assert [int(ts.batch) for ts, _ in evalsk] == [int(ts.batch) for ts, _ in evals1] and len(evals1) >= 2
    np.testing.assert_allclose([v for _, v in evalsk], [v for _, v in evals1], atol=1e-6)
    assert tk.store.all_steps() == t1.store.all_steps()


def test_one_program_serves_every_call_and_no_single_step_is_compiled(pair):
    trainer = pair[K][0]
    assert trainer.compiled_programs() == {("multi", 1, K): 1}  # calls cut short (epoch ends) included


def test_a_stop_inside_a_call_takes_effect_at_its_end():
    class StopAt(Callback):
        def batch_end(self, state, logger):
            if state.timestamp.batch == 6:
                state.stop_training("test")

    _, s1, _, _ = run(1, callbacks=[StopAt()], eval_dataloader=None)
    _, sk, _, _ = run(K, callbacks=[StopAt()], eval_dataloader=None)
    assert s1.timestamp.batch == 6 and sk.timestamp.batch == 8  # batches 7 and 8 were trained in the same call


def test_a_non_finite_batch_inside_a_call_names_its_batch():
    trainer = Trainer(model=mlp_task(), train_dataloader=PoisonedLoader({3}), max_duration="8ba",
                      optimizers=DecoupledSGDW(lr=0.1), seed=0, progress_bar=False, steps_per_execution=K)
    with pytest.raises(NonFiniteLossError, match="batch 3: the loss is nan"):
        trainer.fit()
    assert all(np.all(np.isfinite(x)) for x in leaves(trainer.state.train_state.params))


def test_function_schedulers_are_refused_before_anything_compiles():
    with pytest.raises(ConfigurationError, match="steps_per_execution: 4 trains several batches per call"):
        Trainer(model=mlp_task(), train_dataloader=loaders()[0], max_duration="1ep",
                optimizers=DecoupledSGDW(lr=0.1), schedulers=[lambda state, ssr=1.0: 1.0], steps_per_execution=K,
                progress_bar=False)


@pytest.mark.parametrize("bad", [0, -2, 1.5])
def test_bad_values_name_the_option(bad):
    with pytest.raises(ValueError, match="steps_per_execution"):
        Trainer(model=mlp_task(), train_dataloader=loaders()[0], max_duration="1ep",
                optimizers=DecoupledSGDW(lr=0.1), steps_per_execution=bad, progress_bar=False)


# (id, methods, stages): methods whose state or stage moves with the clock. Progressive resizing changes the batch's
# stage (its image size) at batch 8, inside the call of batches 5-8, which then runs its batches one by one
METHODS = [
    ("ema", lambda: [EMA(half_life="3ba")], 1),
    ("progressive_resizing", lambda: [ProgressiveResizing(initial_scale=0.5, delay_fraction=0.3,
                                                          finetune_fraction=0.3, size_increment=4)], 2),
]


@pytest.mark.parametrize("methods, stages", [m[1:] for m in METHODS], ids=[m[0] for m in METHODS])
def test_methods_that_follow_the_clock_train_as_with_one_call_per_batch(methods, stages):
    trainers, states = {}, {}
    for k in (1, K):
        trainers[k], states[k], _, _ = run(k, model=resnet_task(), algorithms=methods(), max_duration="14ba",
                                           eval_dataloader=None)
    for a, b in zip(leaves(states[K].train_state), leaves(states[1].train_state)):
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6)
    calls = trainers[K].compiled_programs()
    assert calls["multi", 1, K] == stages  # one program per stage
    assert (1 in calls) == (stages > 1)  # the straddling call's batches ran one by one, through the single step
