"""The Trainer on real (tiny) runs: learning, sharding, accumulation, evaluation, events, errors."""
import jax
import numpy as np
import optax
import pytest

from jaxcomposer import Callback, Event, Trainer
from jaxcomposer.algorithms import EMA
from jaxcomposer.callbacks import ThresholdStopper
from jaxcomposer.loggers import InMemoryLogger
from jaxcomposer.optim import CosineAnnealingScheduler, DecoupledSGDW
from jaxcomposer.trainer.trainer import ConfigurationError
from jaxcomposer.core.time import Time
from tests.trainer import helpers
from tests.trainer.helpers import digits, leaves, loaders, mlp_task, resnet_task


def make(task=None, **kw):
    train, evals = loaders(batch_size=kw.pop("batch_size", 32))
    defaults = dict(model=task or mlp_task(), train_dataloader=train, eval_dataloader=evals, max_duration="2ep",
                    optimizers=DecoupledSGDW(lr=0.1, momentum=0.9), seed=0, progress_bar=False)
    defaults.update(kw)
    return Trainer(**defaults)


def test_fit_learns_digits_and_reports_accuracy():
    logger = InMemoryLogger()
    trainer = make(loggers=[logger], max_duration="3ep")
    state = trainer.fit()
    losses = [v for _, v in logger.data["loss/train/total"]]
    assert state.timestamp.epoch == 3 and state.timestamp.batch == 3 * len(trainer.train_dataloader)
    assert np.mean(losses[-10:]) < 0.5 * np.mean(losses[:10])
    assert state.eval_metrics["eval"]["MulticlassAccuracy"] > 0.9
    # evaluation reduces exactly: the eval set has 450 examples in batches of 100 (last one padded)
    manual = trainer.eval()
    assert manual["MulticlassAccuracy"] == pytest.approx(state.eval_metrics["eval"]["MulticlassAccuracy"])


def test_eval_padding_counts_each_example_once():
    trainer = make(max_duration="1ba")
    test = digits("test")
    task, st = trainer.task, trainer.state.train_state
    outputs, _ = task.forward(st.params, st.model_state, test, train=False)
    expected = float((np.argmax(np.asarray(outputs), -1) == test["target"]).mean())
    from jaxcomposer.data import ArrayLoader
    for bs in (100, 128, 449):
        got = trainer.eval(ArrayLoader(test, bs, shuffle=False, drop_last=False))["MulticlassAccuracy"]
        assert got == pytest.approx(expected, abs=1e-6)


def test_language_metrics_count_tokens_over_padded_batches_and_two_devices():
    """ComposerCausalLM's metrics through Trainer.eval: every non-ignored token counts once (not a mean of sequence
    means), the padded last batch adds nothing, and one device or two give the same values."""
    from flax import nnx

    from jaxcomposer import ComposerCausalLM
    from jaxcomposer.data import ArrayLoader
    from jaxcomposer.models import GPT

    rng = np.random.default_rng(0)
    ids = rng.integers(0, 64, (10, 9)).astype(np.int32)
    labels = ids[:, 1:].copy()
    labels[np.arange(8)[None, :] < rng.integers(0, 7, (10, 1))] = -100  # each sequence's first 0..6 ignored
    data = {"input_ids": ids, "labels": labels}
    task = ComposerCausalLM(GPT(64, seq_len=8, d_model=16, n_layers=1, n_heads=2, rngs=nnx.Rngs(0)))
    logits = np.asarray(task.forward(task.params, task.state, data, train=False)[0], np.float64)
    logp = logits - np.log(np.exp(logits).sum(-1, keepdims=True))
    keep = labels != -100
    ce = -np.take_along_axis(logp, np.where(keep, labels, 0)[..., None], -1)[..., 0]
    expected = {"LanguageCrossEntropy": ce[keep].mean(), "LanguagePerplexity": np.exp(ce[keep].mean()),
                "MaskedAccuracy": (logits.argmax(-1) == labels)[keep].mean()}
    assert expected["LanguageCrossEntropy"] != pytest.approx(np.mean([c[k].mean() for c, k in zip(ce, keep)]))
    for devices in (jax.devices()[:1], jax.devices()[:2]):
        trainer = Trainer(model=task, train_dataloader=ArrayLoader(data, 4, seed=0), max_duration="1ba",
                          progress_bar=False, devices=devices)
        got = trainer.eval(ArrayLoader(data, 4, shuffle=False, drop_last=False))  # 4 + 4 + 2 (padded to 4)
        assert got == {k: pytest.approx(v, rel=1e-5) for k, v in expected.items()}


def test_one_device_and_two_devices_agree():
    assert len(jax.devices()) >= 2
    results = []
    for devices in (jax.devices()[:1], jax.devices()[:2]):
        trainer = make(task=resnet_task(), max_duration="5ba", devices=devices, eval_dataloader=None)
        trainer.fit()
        results.append(leaves(trainer.state.train_state.params))
    for a, b in zip(*results):
        np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-5)


def test_microbatching_equals_full_batch_update():
    params = []
    for mb in (None, 8):
        trainer = make(max_duration="3ba", device_train_microbatch_size=mb, eval_dataloader=None,
                       optimizers=optax.sgd(0.5))
        trainer.fit()
        params.append(leaves(trainer.state.train_state.params))
    for a, b in zip(*params):
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6)


def test_one_compile_across_steps():
    trainer = make(max_duration="1ep", eval_dataloader=None)
    trainer.fit()
    assert list(trainer.compiled_programs().values()) == [1]


def test_bf16_amp_trains_with_fp32_master_weights():
    trainer = make(max_duration="1ep", precision="amp_bf16")
    state = trainer.fit()
    assert all(x.dtype == np.float32 for x in leaves(state.train_state.params))
    assert state.eval_metrics["eval"]["MulticlassAccuracy"] > 0.6


def test_ema_weights_are_evaluated():
    trainer = make(max_duration="1ep", algorithms=[EMA(half_life="5ba")])
    trainer.fit()
    st = trainer.state.train_state
    ema = st.extras["EMA"]
    raw = leaves(st.params)
    assert any(not np.allclose(a, b) for a, b in zip(raw, leaves(ema["params"])))
    test = digits("test")
    out, _ = trainer.task.forward(ema["params"], ema["state"], test, train=False)
    expected = float((np.argmax(np.asarray(out), -1) == test["target"]).mean())
    assert trainer.eval()["MulticlassAccuracy"] == pytest.approx(expected, abs=1e-6)


def test_schedule_and_scale_schedule_ratio():
    trainer = make(max_duration="4ep", schedulers=[CosineAnnealingScheduler()], scale_schedule_ratio=0.5,
                   eval_dataloader=None)
    spe = len(trainer.train_dataloader)
    assert trainer.max_duration.value == 2 and trainer.total_steps == 2 * spe
    assert trainer.state.learning_rate(0) == pytest.approx(0.1)
    assert trainer.state.learning_rate(spe) == pytest.approx(0.05, rel=1e-5)   # halfway through the cosine
    with pytest.raises(ConfigurationError, match="scale_schedule_ratio"):
        make(scale_schedule_ratio=0.5)


def test_events_fire_in_composer_order():
    seen = []

    class Recorder(Callback):
        def run_event(self, event, state, logger):
            seen.append(event)

    make(max_duration="2ba", eval_interval="2ba", callbacks=[Recorder()]).fit()
    per_eval_batch = (Event.EVAL_BATCH_START, Event.EVAL_BEFORE_FORWARD, Event.EVAL_AFTER_FORWARD,
                      Event.EVAL_BATCH_END)
    order = [e for e in seen if e not in per_eval_batch]
    batch = [Event.BEFORE_DATALOADER, Event.AFTER_DATALOADER, Event.BATCH_START, Event.BEFORE_TRAIN_BATCH,
             Event.BEFORE_FORWARD, Event.AFTER_FORWARD, Event.BEFORE_LOSS, Event.AFTER_LOSS, Event.BEFORE_BACKWARD,
             Event.AFTER_BACKWARD, Event.AFTER_TRAIN_BATCH, Event.BATCH_END]
    evaluation = [Event.EVAL_BEFORE_ALL, Event.EVAL_START, Event.EVAL_END, Event.EVAL_AFTER_ALL]
    assert order == [Event.INIT, Event.FIT_START, Event.EPOCH_START, *batch, Event.BATCH_CHECKPOINT,
                     *batch, *evaluation, Event.BATCH_CHECKPOINT, Event.FIT_END]
    eval_batches = seen[seen.index(Event.EVAL_START) + 1:seen.index(Event.EVAL_END)]
    assert eval_batches == list(per_eval_batch) * (len(eval_batches) // 4) and eval_batches


def test_threshold_stopper_stops_early():
    trainer = make(max_duration="20ep", callbacks=[ThresholdStopper("MulticlassAccuracy", "eval", threshold=0.8)])
    state = trainer.fit()
    assert state.timestamp.epoch < 20 and state.eval_metrics["eval"]["MulticlassAccuracy"] >= 0.8


def test_predict_returns_logits():
    trainer = make(max_duration="1ba")
    _, evals = loaders(eval_batch_size=200)
    out = trainer.predict(evals)
    assert [o.shape for o in out] == [(200, 10), (200, 10), (50, 10)]


@pytest.mark.parametrize("kwargs, match", [
    (dict(model="not a model"), "model: expected a jaxcomposer task"),
    (dict(precision="fp16"), "precision"),
    (dict(max_duration="10epochs"), "max_duration"),
    (dict(max_duration="0.5dur"), "max_duration"),
    (dict(eval_interval="1.5ep"), "eval_interval"),
    (dict(device_train_microbatch_size=0), "device_train_microbatch_size"),
])
def test_bad_arguments_fail_before_compiling(kwargs, match):
    with pytest.raises((ConfigurationError, TypeError, ValueError), match=match):
        make(**kwargs)


def test_microbatch_size_must_divide_batch():
    trainer = make(device_train_microbatch_size=5, eval_dataloader=None)
    with pytest.raises(ConfigurationError, match="must divide the batch size 32"):
        trainer.fit()


@pytest.mark.parametrize("stop_at", [3, 8])  # mid-epoch, and exactly on an epoch's last batch (8 per epoch)
def test_save_and_resume_continue_bit_for_bit(tmp_path, stop_at):
    from jaxcomposer.data import ArrayLoader

    def trainer(**kw):
        return Trainer(model=mlp_task(dropout=0.2), train_dataloader=ArrayLoader(digits("train", 256), 32, seed=1),
                       max_duration="10ba", optimizers=DecoupledSGDW(lr=0.1, momentum=0.9), seed=0,
                       progress_bar=False, **kw)

    straight = trainer()
    straight.fit()
    first = trainer(callbacks=[helpers.stop_at(stop_at)])
    first.fit()
    assert first.state.timestamp.epoch == stop_at // 8
    first.save_checkpoint(tmp_path / "ck")
    with pytest.raises(ValueError, match="already exists"):
        first.save_checkpoint(tmp_path / "ck")
    resumed = trainer(load_path=tmp_path / "ck")
    resumed.fit()
    assert resumed.state.timestamp.batch == 10 and resumed.state.timestamp.epoch == 1
    for a, b in zip(leaves(straight.state.train_state), leaves(resumed.state.train_state)):
        np.testing.assert_array_equal(a, b)


def test_load_path_that_is_not_a_checkpoint(tmp_path):
    with pytest.raises(ValueError, match="load_path: .*nope' does not exist"):
        make(load_path=tmp_path / "nope")
    (tmp_path / "empty").mkdir()
    with pytest.raises(ValueError, match="neither a jaxcomposer checkpoint"):
        make(load_path=tmp_path / "empty")
    (tmp_path / "model.pt").write_bytes(b"torch")  # a Composer checkpoint file, say
    with pytest.raises(ValueError, match="model.pt is a file; a jaxcomposer checkpoint is a directory"):
        make(load_path=tmp_path / "model.pt")


def test_fit_duration_continues_as_composer_does():
    """Composer's ``fit(duration=...)``: train that much more; ``max_duration`` becomes timestamp + duration, so
    the plan (total steps, schedules) follows, with a fresh compile."""
    from jaxcomposer.data import ArrayLoader

    trainer = Trainer(model=mlp_task(), train_dataloader=ArrayLoader(digits("train", 256), 32, seed=1),
                      optimizers=DecoupledSGDW(lr=0.1), seed=0, progress_bar=False)
    with pytest.raises(ConfigurationError, match="max_duration: required to fit"):
        trainer.fit()
    trainer.fit(duration="2ba")
    assert trainer.state.timestamp.batch == 2 and trainer.total_steps == 2 and trainer.state.max_duration == Time(2, "ba")
    trainer.fit(duration=1)  # an int is epochs; timestamp (epoch 0) + 1ep: to the end of this epoch of 8 batches
    assert trainer.state.timestamp.batch == 8 and trainer.state.timestamp.epoch == 1
    assert trainer.max_duration == Time(1, "ep") and trainer.total_steps == 8 and trainer.state.total_steps == 8
    trainer.fit(duration="3ba")
    assert trainer.state.timestamp.batch == 11 and trainer.max_duration == Time(11, "ba")
    trainer.fit()  # the plan is done: nothing more to train
    assert trainer.state.timestamp.batch == 11
    with pytest.raises(ConfigurationError, match="duration: got '0ba'"):
        trainer.fit(duration="0ba")
    with pytest.raises(AttributeError):
        trainer.max_duration = "1ep"  # the plan is changed through fit(duration=...), never by hand


def test_fit_with_another_train_dataloader():
    from jaxcomposer.data import ArrayLoader

    trainer = Trainer(model=mlp_task(), train_dataloader=ArrayLoader(digits("train", 256), 32, seed=1),
                      max_duration="1ep", optimizers=DecoupledSGDW(lr=0.1), seed=0, progress_bar=False)
    trainer.fit()
    assert trainer.steps_per_epoch == 8 and trainer.state.timestamp.batch == 8
    trainer.fit(train_dataloader=ArrayLoader(digits("train", 128), 32, seed=1), duration="1ep")
    assert trainer.steps_per_epoch == 4 and trainer.state.timestamp.batch == 12 and trainer.total_steps == 8


def test_nnx_module_passed_holds_the_trained_weights():
    """As Composer: the module given to the Trainer is the trained model, usable during and after fit. One device,
    where the state's buffers would otherwise be the module's own and be donated to the first step."""
    from flax import nnx

    task = mlp_task()
    module = task.source
    seen_during_fit = []

    class CallsTheModule(Callback):
        def batch_end(self, state, logger):
            seen_during_fit.append(np.asarray(module(np.zeros((1, 8, 8, 1), np.float32), train=False)))

    trainer = make(task, max_duration="3ba", devices=jax.devices()[:1], callbacks=[CallsTheModule()])
    trainer.fit()
    assert trainer.state.model is module and len(seen_during_fit) == 3
    for ours, trained in zip(leaves(nnx.state(module, nnx.Param)), leaves(trainer.state.train_state.params)):
        np.testing.assert_array_equal(ours, trained)
    x = digits("test", 16)["input"]
    (expected,) = trainer.predict([{"input": x, "target": np.zeros(16, np.int32)}])
    np.testing.assert_allclose(np.asarray(module(x, train=False)), expected, rtol=1e-5, atol=1e-5)
    before = leaves(nnx.state(module, nnx.Param))
    trainer.fit(duration="2ba")  # training on updates the same object
    assert any(not np.array_equal(a, b) for a, b in zip(before, leaves(nnx.state(module, nnx.Param))))
    for ours, trained in zip(leaves(nnx.state(module, nnx.Param)), leaves(trainer.state.train_state.params)):
        np.testing.assert_array_equal(ours, trained)


def test_function_scheduler_runs_on_the_host_as_composer():
    """Composer's function schedulers, ``(state, ssr=1.0) -> float`` of the run state, are asked before each batch
    (as Composer's LambdaLR): the run equals one with the compiled scheduler of the same schedule, and a function
    with the wrong signature is named."""
    from jaxcomposer.optim import StepScheduler

    seen = []

    def halve_each_epoch(state, ssr=1.0):
        seen.append((int(state.timestamp.batch), ssr))
        return 0.5 ** int(state.timestamp.epoch)

    by_function = make(schedulers=[halve_each_epoch], max_duration="3ep")
    by_function.fit()
    compiled = make(schedulers=[StepScheduler(step_size="1ep", gamma=0.5)], max_duration="3ep")
    compiled.fit()
    steps = 3 * len(by_function.train_dataloader)
    assert [b for b, _ in seen] == list(range(steps)) and {s for _, s in seen} == {1.0}
    for a, b in zip(leaves(by_function.state.train_state.params), leaves(compiled.state.train_state.params)):
        np.testing.assert_array_equal(a, b)
    assert by_function.state.learning_rate(steps - 1) == pytest.approx(0.1 * 0.25)
    def takes_nothing():
        return 1.0

    with pytest.raises(ConfigurationError, match="schedulers\\[0\\]: calling 'takes_nothing'"):
        make(schedulers=[takes_nothing], max_duration="1ba").fit()
    with pytest.raises(ConfigurationError, match="schedulers\\[0\\]: got int"):
        make(schedulers=[3])


def test_samples_and_tokens_reach_the_run_length_and_the_schedulers():
    """``max_duration`` and scheduler times in ``sp``/``tok`` are converted with the loader's batch size and the
    task's tokens per batch, as Composer's state does."""
    from flax import nnx

    from jaxcomposer import ComposerCausalLM
    from jaxcomposer.data import ArrayLoader
    from jaxcomposer.models import GPT
    from jaxcomposer.optim import LinearWithWarmupScheduler

    ids = np.random.default_rng(0).integers(0, 64, (64, 17)).astype(np.int32)  # (B, T+1): 16 tokens per example
    lm = lambda: ComposerCausalLM(GPT(vocab_size=64, seq_len=16, d_model=16, n_layers=1, n_heads=2, rngs=nnx.Rngs(0)))
    loader = lambda: ArrayLoader({"input_ids": ids}, 8, seed=0)  # 8 batches of 8 x 16 = 128 tokens
    by_tokens = Trainer(model=lm(), train_dataloader=loader(), max_duration="1024tok", progress_bar=False, seed=0,
                        schedulers=[LinearWithWarmupScheduler(t_warmup="256tok", alpha_f=0.0)])
    assert by_tokens.total_steps == 8
    assert [by_tokens.lr_multiplier(s) for s in (0, 1, 2)] == pytest.approx([0.0, 0.5, 1.0])  # warmup: 2 batches
    by_samples = Trainer(model=lm(), train_dataloader=loader(), max_duration="40sp", progress_bar=False, seed=0)
    assert by_samples.total_steps == 5  # 40 samples in batches of 8
    by_samples.fit()
    assert by_samples.state.timestamp.sample == 40 and by_samples.state.timestamp.token == 40 * 16


def test_compiled_steps_run_with_the_cyclic_collector_paused_and_restored():
    import gc

    import jax
    import jax.numpy as jnp

    from jaxcomposer.core.collector import collector_paused

    seen = []

    def record(x):
        seen.append(gc.isenabled())
        return x * 2

    jitted = collector_paused(jax.jit(record))
    assert gc.isenabled()
    assert float(jitted(jnp.float32(1.5))) == 3.0 and seen == [False] and gc.isenabled()  # traced with it paused
    assert jitted.lower(jnp.float32(1.0)).compile() is not None  # the jitted function's own attributes stay
    plain = collector_paused(record)
    gc.disable()
    try:
        plain(1.0)
        assert not gc.isenabled()  # off before: left off
    finally:
        gc.enable()

    def fails():
        raise ValueError("boom")

    with pytest.raises(ValueError, match="boom"):
        collector_paused(fails)()
    assert gc.isenabled() and seen == [False, False]


def test_after_fit_the_loader_stands_where_training_stopped_not_where_the_prefetcher_read():
    from jaxcomposer import Trainer
    train, _ = loaders(batch_size=32)  # 42 batches per epoch
    trainer = Trainer(model=mlp_task(), train_dataloader=train, max_duration="10ba", seed=0, progress_bar=False)
    trainer.fit()
    assert train.get_state()["epoch"] == 0 and train.get_state()["batch_index"] == 10
    trainer.fit(duration="32ba")  # to the epoch's end
    assert train.get_state()["epoch"] == 1 and train.get_state()["batch_index"] == 0


def test_one_argument_function_scheduler_as_composer():
    seen = []

    def half(state):
        seen.append(int(state.timestamp.batch))
        return 0.5

    one = make(schedulers=[half], max_duration="2ba", eval_dataloader=None)
    one.fit()
    two = make(schedulers=[lambda state, ssr=1.0: 0.5], max_duration="2ba", eval_dataloader=None)
    two.fit()
    assert seen == [0, 1] and one.state.learning_rate(1) == pytest.approx(0.05)
    for a, b in zip(leaves(one.state.train_state.params), leaves(two.state.train_state.params)):
        np.testing.assert_array_equal(a, b)
    with pytest.raises(ConfigurationError, match="does not support `scale_schedule_ratio`"):
        make(schedulers=[half], max_duration="2ba", scale_schedule_ratio=0.5, eval_dataloader=None).fit()
