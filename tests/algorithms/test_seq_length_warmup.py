import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from jaxcomposer.algorithms import SeqLengthWarmup, set_batch_sequence_length
from jaxcomposer.core.method import Method
from tests.algorithms.algo_testing import make_batch, make_ctx
from jaxcomposer import algorithms
from tests.algorithms.algo_testing import Example

# one representative configuration: the composition table and the Trainer contract run it
# truncates image rows (the composition check's model pools over space), so its changing shapes meet every
# other method: length 6 over 2 steps (a warmup under one batch starts at max), 4 then 6 over 4 steps. The
# causal-LM trainer tests are below
EXAMPLE = Example(lambda: algorithms.SeqLengthWarmup(duration=0.25, min_seq_length=4,
                                                      max_seq_length=6, step_size=2,
                                                      sequence_keys=("input",)))

V, T = 32, 16  # vocabulary and model context of the LM tests


def _host(step, total):
    """The ctx the stage slot sees on the host at ``step`` of ``total``: the clock as a Python int."""
    return make_ctx(0, total_steps=total)._replace(step=step)


def _reference(batch, length, truncate, preserve):
    """Composer's documented semantics for equal-length batches, written out row by row with numpy."""
    batch = {k: np.asarray(v) for k, v in batch.items()}
    seq = next(v.shape[1] for v in batch.values() if v.ndim > 1)
    if length >= seq:
        return batch
    if not truncate:
        n = (next(iter(batch.values())).size // length) * length
        return {k: v.reshape(-1)[:n].reshape(-1, length) for k, v in batch.items()}
    out = {k: v[:, :length].copy() for k, v in batch.items()}
    if preserve:
        for r in range(batch["attention_mask"].shape[0]):
            end = int(batch["attention_mask"][r].sum()) - 1  # -1 for an all-padding row: Python indexing wraps
            for k in batch:
                out[k][r, min(end, length - 1)] = batch[k][r, end]
    return out


def _padded_batch(key, b=5, t=12):
    """Right-padded token rows of lengths 0 (all padding), 1, ..., t, with aligned mask and labels."""
    k1, k2 = jax.random.split(key)
    ids = np.asarray(jax.random.randint(k1, (b, t), 1, V))
    lengths = np.array([0, 1, t // 2, t - 1, t][:b])
    mask = (np.arange(t)[None, :] < lengths[:, None]).astype(np.int32)
    labels = np.where(mask == 1, np.asarray(jax.random.randint(k2, (b, t), 0, V)), -100)
    return {"input_ids": ids * mask, "attention_mask": mask, "labels": labels}


# (1) functional numerics ----------------------------------------------------------------------------------------

def test_composer_docstring_example():
    ids = jnp.array([[10, 11, 12, 13, 14, 15]])
    np.testing.assert_array_equal(set_batch_sequence_length({"input_ids": ids}, 3)["input_ids"], [[10, 11, 12]])
    kept = set_batch_sequence_length({"input_ids": ids, "attention_mask": jnp.ones_like(ids)}, 3,
                                     preserve_end_of_sequence=True)
    np.testing.assert_array_equal(kept["input_ids"], [[10, 11, 15]])


@pytest.mark.parametrize("truncate,preserve", [(True, False), (True, True), (False, False)])
def test_matches_composer_on_equal_length_batches(key, truncate, preserve):
    batch = _padded_batch(key)
    for length in (1, 5, 11, 12, 20):
        want = _reference(batch, length, truncate, preserve)
        for keys in (None, ("input_ids", "attention_mask", "labels")):
            got = set_batch_sequence_length({k: jnp.asarray(v) for k, v in batch.items()}, length, truncate,
                                            preserve, sequence_keys=keys)
            assert sorted(got) == sorted(want)
            for k in want:
                np.testing.assert_array_equal(got[k], want[k], err_msg=f"{k} at length {length}")


def test_non_truncate_makes_rows_of_the_new_length():
    ids = jnp.arange(12).reshape(2, 6)
    np.testing.assert_array_equal(set_batch_sequence_length({"input_ids": ids}, 4, truncate=False)["input_ids"],
                                  [[0, 1, 2, 3], [4, 5, 6, 7], [8, 9, 10, 11]])  # rows straddle the originals
    out = set_batch_sequence_length({"input_ids": jnp.arange(10).reshape(2, 5)}, 3, truncate=False)
    np.testing.assert_array_equal(out["input_ids"], [[0, 1, 2], [3, 4, 5], [6, 7, 8]])  # 10 mod 3 tokens dropped


def test_keys_keep_their_offset_from_the_longest(key):
    """ComposerCausalLM's layout: input_ids (B, T+1), labels (B, T) aligned with input_ids[:, 1:]."""
    ids = jax.random.randint(key, (3, 13), 0, V)
    labels = ids[:, 1:].at[1, 3].set(-100)
    weight = jnp.ones(3)
    out = set_batch_sequence_length({"input_ids": ids, "labels": labels, "weight": weight}, 6,
                                    sequence_keys=("input_ids", "labels"))
    assert out["input_ids"].shape == (3, 6) and out["labels"].shape == (3, 5)
    np.testing.assert_array_equal(out["labels"], labels[:, :5])
    np.testing.assert_array_equal(jnp.where(out["labels"] == -100, -100, out["input_ids"][:, 1:]), out["labels"])
    assert out["weight"] is weight  # not a sequence key: left alone


def test_preserve_end_with_offsets(key):
    batch = _padded_batch(key, t=13)  # lengths 0, 1, 6, 12, 13 of 13
    batch = {k: jnp.asarray(v) for k, v in batch.items()}
    batch["labels"] = jnp.where(batch["attention_mask"][:, 1:] == 1, batch["input_ids"][:, 1:], -100)
    out = set_batch_sequence_length(batch, 5, preserve_end_of_sequence=True)
    ends = np.asarray(batch["attention_mask"]).sum(1) - 1
    for r, e in enumerate(ends):
        if e >= 1:  # the label slot that predicts the end token holds it, right before where the token lands
            assert out["input_ids"][r, min(e, 4)] == batch["input_ids"][r, e]
            assert out["labels"][r, min(e, 4) - 1] == batch["labels"][r, e - 1]
    np.testing.assert_array_equal(out["labels"][:, :3], batch["labels"][:, :3])  # nothing else moves


def test_no_op_when_long_enough(key):
    batch = {"input_ids": jax.random.randint(key, (2, 9), 0, V)}
    assert set_batch_sequence_length(batch, 9)["input_ids"] is batch["input_ids"]
    assert set_batch_sequence_length(batch, 50, truncate=False)["input_ids"] is batch["input_ids"]


def test_functional_errors(key):
    ids = jnp.zeros((2, 8), jnp.int32)
    with pytest.raises(ValueError, match="none of the sequence keys"):
        set_batch_sequence_length({"input": jnp.zeros((2, 8, 8, 1))}, 4, sequence_keys=("input_ids",))
    with pytest.raises(ValueError, match="at least"):  # Composer: every tensor must be sequence-shaped
        set_batch_sequence_length({"input_ids": ids, "target": jnp.zeros(2)}, 4)
    with pytest.raises(ValueError, match="positive int"):
        set_batch_sequence_length({"input_ids": ids}, 0)
    with pytest.raises(ValueError, match="positive int"):
        set_batch_sequence_length({"input_ids": ids}, 2.5)
    with pytest.raises(ValueError, match="no positions"):
        set_batch_sequence_length({"input_ids": jnp.zeros((2, 9), jnp.int32), "labels": ids}, 1)
    with pytest.raises(ValueError, match="attention_mask"):
        set_batch_sequence_length({"input_ids": ids}, 4, preserve_end_of_sequence=True)
    with pytest.raises(ValueError, match="not in sequence_keys"):
        set_batch_sequence_length({"input_ids": ids, "weight": jnp.ones(2)}, 4, truncate=False,
                                  sequence_keys=("input_ids",))
    with pytest.raises(ValueError, match="one shape"):
        set_batch_sequence_length({"input_ids": jnp.zeros((2, 9), jnp.int32), "labels": ids}, 4, truncate=False)


# the schedule (stage slot) ----------------------------------------------------------------------------------------

def test_schedule_matches_composer_formula():
    m = SeqLengthWarmup()  # 0.3 of 10000 batches; (1024 - 8) // 8 = 127 steps; a step every 3000 // 127 = 23
    assert [m.stage(None, _host(b, 10000)) for b in (0, 22, 23, 46, 2920, 2921, 9999)] == \
        [8, 8, 16, 24, 1016, 1024, 1024]
    lengths = [m.stage(None, _host(b, 10000)) for b in range(3000)]
    assert len(set(lengths)) == 128 and lengths == sorted(lengths)
    # the stage clamps to the batch's own length when it is given the shapes: no compile for no-op lengths
    assert m.stage({"input_ids": (8, 129), "labels": (8, 128)}, _host(2000, 10000)) == 129
    assert m.stage({"input_ids": jnp.zeros((8, 129))}, _host(0, 10000)) == 8


def test_schedule_where_composer_divides_by_zero():
    assert SeqLengthWarmup(duration=0.0).stage(None, _host(0, 100)) == 1024  # no warmup
    assert SeqLengthWarmup(min_seq_length=64, max_seq_length=64).stage(None, _host(0, 100)) == 64  # nothing to warm up
    # no room for one step
    assert SeqLengthWarmup(min_seq_length=60, max_seq_length=64).stage(None, _host(0, 100)) == 64
    m = SeqLengthWarmup()  # 30 warmup batches for 127 steps: several steps a batch, max at the warmup's end
    lengths = [m.stage(None, _host(b, 100)) for b in range(100)]
    assert lengths[0] == 8 and lengths[29] == 8 + 8 * (29 * 127 // 30) and set(lengths[30:]) == {1024}
    assert lengths == sorted(lengths)


def test_factory_validates():
    for kw, match in [({"duration": 1.5}, "duration"), ({"min_seq_length": 0}, "min_seq_length"),
                      ({"max_seq_length": 4}, "max_seq_length"), ({"step_size": 0}, "step_size"),
                      ({"step_size": 2.5}, "step_size"), ({"sequence_keys": "input_ids"}, "sequence_keys"),
                      ({"sequence_keys": ()}, "sequence_keys")]:
        with pytest.raises(ValueError, match=match):
            SeqLengthWarmup(**kw)


def test_batch_slot_needs_a_stage_and_sequences(key):
    m = SeqLengthWarmup()
    with pytest.raises(ValueError, match="ctx.stage is None"):
        m.batch({"input_ids": jnp.zeros((2, 16), jnp.int32)}, make_ctx(0))
    with pytest.raises(ValueError, match="none of the sequence keys"):  # an image batch: Composer raises too
        m.batch(make_batch(key), make_ctx(0)._replace(stage=8))


# (2) jit == eager, one trace per stage ---------------------------------------------------------------------------

@pytest.mark.parametrize("truncate", [True, False])
def test_jit_equals_eager_and_retraces_only_per_stage(key, truncate):
    m = SeqLengthWarmup(duration=0.5, min_seq_length=4, max_seq_length=12, step_size=4, truncate=truncate,
                        sequence_keys=("input_ids",))
    traces = []

    def f(batch, step, stage):
        traces.append(stage)
        return m.batch(batch, make_ctx(step)._replace(stage=stage))

    jf = jax.jit(f, static_argnums=2)
    total, stages = 8, []
    for i in range(total):
        batch = {"input_ids": jax.random.randint(jax.random.fold_in(key, i), (4, 12), 0, V)}
        stage = m.stage(None, _host(i, total))
        stages.append(stage)
        got = jf(batch, i, stage)["input_ids"]
        np.testing.assert_array_equal(got, f(batch, i, stage)["input_ids"])
        assert got.shape == ((4, stage) if truncate else (48 // stage, stage))
    assert stages == [4, 4, 8, 8, 12, 12, 12, 12]
    assert len(traces) == 3 + total  # one trace per distinct stage; the eager calls run the Python body each time


# (3) + (4) in the Trainer with a causal LM -----------------------------------------------------------------------

def _lm_trainer(method, max_duration, **kw):
    from jaxcomposer import Trainer
    from jaxcomposer.data import ArrayLoader, lm_arrays
    from jaxcomposer.models import GPT, ComposerCausalLM
    from jaxcomposer.optim import DecoupledAdamW

    rng = np.random.default_rng(0)
    tokens = np.concatenate([np.arange(V), rng.integers(0, V, 2000)])  # (N, T+1) windows of a tiny vocabulary
    task = ComposerCausalLM(GPT(V, seq_len=T, d_model=32, n_layers=1, n_heads=2, dropout=0.1, rngs=nnx.Rngs(0)))
    return Trainer(model=task, train_dataloader=ArrayLoader(lm_arrays(tokens, T), 8, seed=3),
                   max_duration=max_duration, optimizers=DecoupledAdamW(lr=3e-3), algorithms=method, seed=7,
                   progress_bar=False, devices=jax.devices()[:1], **kw)


def test_lm_trainer_compiles_once_per_stage():
    seen = []  # the shapes the model gets, recorded at trace time by a method listed after SeqLengthWarmup
    spy = Method(name="Spy", batch=lambda b, ctx: (seen.append(b["input_ids"].shape), b)[1])
    method = SeqLengthWarmup(duration=0.5, min_seq_length=5, max_seq_length=T + 1, step_size=4)
    trainer = _lm_trainer([method, spy], "8ba")
    trainer.fit()
    stages = [trainer.composed.stage(None, _host(s, 8)) for s in range(8)]
    assert [dict(s)["SeqLengthWarmup"] for s in stages] == [5, 9, 13, 17, 17, 17, 17, 17]
    assert list(trainer.compiled_programs().values()) == [len(set(stages))] == [4]
    assert seen == [(8, 5), (8, 9), (8, 13), (8, 17)]  # the model reads 4, 8, 12, 16 tokens
    assert np.isfinite(float(trainer.state.batch_metrics["loss"]))


def test_lm_two_steps_and_bitwise_resume(tmp_path):
    from jaxcomposer.loggers import InMemoryLogger
    from tests.trainer.helpers import stop_at

    def method():  # length 9 then 13: the resumed run must pick the second stage from the restored step
        return [SeqLengthWarmup(duration=1.0, min_seq_length=9, max_seq_length=T + 1, step_size=4)]

    logger = InMemoryLogger()
    straight = _lm_trainer(method(), "2ba", loggers=[logger])
    before = [np.asarray(x) for x in jax.tree_util.tree_leaves(straight.state.train_state.params)]
    straight.fit()
    losses = [v for _, v in logger.data["loss/train/total"]]
    assert len(losses) == 2 and np.all(np.isfinite(losses)) and losses[0] != losses[1]
    after = jax.tree_util.tree_leaves(straight.state.train_state.params)
    assert any(not np.array_equal(a, b) for a, b in zip(before, after))

    first = _lm_trainer(method(), "2ba", callbacks=[stop_at(1)])  # interrupted after batch 1 of the 2 planned
    first.fit()
    first.save_checkpoint(tmp_path / "ckpt")
    resumed = _lm_trainer(method(), "2ba", load_path=tmp_path / "ckpt")
    assert resumed.state.timestamp.batch == 1
    resumed.fit()
    a = jax.tree_util.tree_leaves(straight.state.train_state)
    b = jax.tree_util.tree_leaves(resumed.state.train_state)
    assert len(a) == len(b)
    for x, y in zip(a, b):
        np.testing.assert_array_equal(np.asarray(x), np.asarray(y))

