import itertools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxcomposer.algorithms import SelectiveBackprop, select_using_loss, should_selective_backprop
from jaxcomposer.algorithms.selective_backprop import _downscale, _selection_indices
from jaxcomposer.core.method import ModelView, compose
from jaxcomposer.loss import soft_cross_entropy
from tests.algorithms.algo_testing import examples, make_batch, make_ctx
from jaxcomposer import algorithms
from tests.algorithms.algo_testing import Example

# one representative configuration: the composition table and the Trainer contract run it
# start=0, end=1, interrupt=0: selects on every step (interrupt=1 would never select)
EXAMPLE = Example(lambda: algorithms.SelectiveBackprop(start=0.0, end=1.0, keep=0.5, interrupt=0))


def _per_example_ce(outputs, target, reduction="none"):
    """soft_cross_entropy in the form select_using_loss calls a loss (Composer's: with ``reduction='none'``)."""
    assert reduction == "none"
    return soft_cross_entropy(outputs, target)


def _host(step, total):
    """The ctx the stage slot sees on the host at ``step`` of ``total``: the clock as a Python int."""
    return make_ctx(0, total_steps=total)._replace(step=step)


def _composer_weights(n, keep):
    percs = np.arange(0.5, n, 1) / n  # Composer's expression, verbatim
    probs = percs ** ((1.0 / keep) - 1.0)
    return probs / probs.sum()


def _draw(losses, keep, n_keys, key):
    keys = jax.random.split(key, n_keys)
    return np.asarray(jax.jit(jax.vmap(lambda k: _selection_indices(losses, k, keep)))(keys))


# (1) functional numerics ----------------------------------------------------------------------------------------

@pytest.mark.parametrize("t, idx, start, end, interrupt, expected", [
    (0.49, 0, 0.5, 0.9, 2, False),  # before start
    (0.5, 0, 0.5, 0.9, 2, True),    # start is inclusive; batch 0: (0 + 1) % 2 != 0
    (0.5, 1, 0.5, 0.9, 2, False),   # every second batch is a plain step
    (0.7, 2, 0.5, 0.9, 2, True),
    (0.9, 0, 0.5, 0.9, 2, False),   # end is exclusive
    (0.6, 1, 0.5, 0.9, 0, True),    # interrupt=0: never interrupted
    (0.6, 0, 0.5, 0.9, 1, False),   # interrupt=1: always interrupted
    (0.6, 1, 0.5, 0.9, 3, True),
    (0.6, 2, 0.5, 0.9, 3, False),
])
def test_should_selective_backprop_matches_composer(t, idx, start, end, interrupt, expected):
    assert should_selective_backprop(t, idx, start, end, interrupt) is expected


def test_single_draw_follows_composer_rank_weights(key):
    # keep=0.25 of 4 keeps one example: the draw is exactly categorical over ranks with Composer's weights.
    losses = jnp.array([3.0, 0.0, 2.0, 1.0])  # ranks (ascending loss): example 1, 3, 2, 0
    picks = _draw(losses, 0.25, 20000, key)
    assert picks.shape == (20000, 1)
    freq = np.bincount(picks[:, 0], minlength=4) / len(picks)
    w = _composer_weights(4, 0.25)  # ((r + 0.5) / 4) ** 3, normalized
    np.testing.assert_allclose(freq[[1, 3, 2, 0]], w, atol=0.012)
    assert freq[0] > 0.6  # the highest loss is picked most often


def test_two_draws_are_successive_sampling_without_replacement(key):
    # keep=0.5 of 4: inclusion probability of each rank under "draw, remove, renormalize, draw".
    w = _composer_weights(4, 0.5)
    incl = np.zeros(4)
    for i, j in itertools.permutations(range(4), 2):
        p = w[i] * w[j] / (1 - w[i])
        incl[i] += p
        incl[j] += p
    losses = jnp.array([0.1, 0.2, 0.3, 0.4])  # rank r is example r
    picks = _draw(losses, 0.5, 20000, key)
    assert picks.shape == (20000, 2)
    assert (picks[:, 0] < picks[:, 1]).all()  # distinct, in batch order
    freq = np.bincount(picks.ravel(), minlength=4) / len(picks)
    np.testing.assert_allclose(freq, incl, atol=0.015)
    np.testing.assert_allclose(incl.sum(), 2.0)


def test_keep_one_keeps_everything_and_count_is_at_least_one(key):
    losses = jax.random.normal(key, (6,))
    np.testing.assert_array_equal(_selection_indices(losses, key, 1.0), np.arange(6))
    assert _selection_indices(losses, key, 0.5).shape == (3,)  # int(0.5 * 6)
    assert _selection_indices(losses, key, 0.3).shape == (1,)  # int(1.8)
    assert _selection_indices(losses[:3], key, 0.2).shape == (1,)  # Composer: int(0.6) = 0, an empty batch


def test_select_using_loss_pairs_inputs_with_targets(key):
    x = jnp.arange(16.0).reshape(16, 1) * jnp.ones((1, 3))
    y = jnp.arange(16) % 5
    model = lambda inp: jnp.concatenate([inp[:, :1], jnp.zeros((inp.shape[0], 4))], axis=1)
    loss_fun = _per_example_ce
    xs, ys = select_using_loss(x, y, model, loss_fun, keep=0.5, key=key)
    assert xs.shape == (8, 3) and ys.shape == (8,)
    rows = np.asarray(xs[:, 0]).astype(int)
    assert len(set(rows.tolist())) == 8 and (np.diff(rows) > 0).all()
    np.testing.assert_array_equal(ys, np.asarray(y)[rows])  # each kept input keeps its own target
    again = select_using_loss(x, y, model, loss_fun, keep=0.5, key=key)
    other = select_using_loss(x, y, model, loss_fun, keep=0.5, key=jax.random.fold_in(key, 1))
    np.testing.assert_array_equal(again[0], xs)
    assert not np.array_equal(other[0], xs)


def test_selection_favours_high_losses(key):
    # Over many draws, the mean loss of the kept half is well above the batch mean.
    losses = jnp.arange(32.0)
    picks = _draw(losses, 0.5, 2000, key)
    assert picks.mean() > 15.5 + 4  # uniform sampling would give 15.5; weights linear in rank give ~21
    strong = _draw(losses, 0.1, 2000, key)  # exponent 9: nearly always the top ranks
    assert strong.mean() > 27


def test_downscale_matches_torch_interpolate(key):
    torch = pytest.importorskip("torch")
    F = torch.nn.functional
    downscale = jax.jit(_downscale, static_argnums=(1, 2))
    # 0.3 and 0.75: sizes are floor(n * s) and source coordinates use s itself, not the size ratio
    cases = [((2, 3, 8, 10), "bilinear", 0.5), ((2, 3, 8, 10), "bilinear", 0.3), ((2, 3, 8, 10), "bilinear", 0.75),
             ((2, 3, 9), "linear", 0.3), ((1, 2, 6, 7, 8), "trilinear", 0.75)]
    for shape, mode, scale in cases:
        x = np.array(jax.random.normal(key, shape))
        ref = F.interpolate(torch.from_numpy(x), scale_factor=scale, mode=mode, align_corners=False,
                            recompute_scale_factor=False).numpy()
        np.testing.assert_allclose(downscale(jnp.asarray(x), scale, "NCHW"), ref, rtol=1e-5, atol=1e-5)
        channels_last = jnp.asarray(np.moveaxis(x, 1, -1))
        np.testing.assert_allclose(np.moveaxis(np.asarray(downscale(channels_last, scale, "NHWC")), -1, 1), ref,
                                   rtol=1e-5, atol=1e-5)


def test_downscale_hand_checked():
    # 1-D, scale 0.5: output i reads source (i + 0.5) * 2 - 0.5 = 2i + 0.5, the mean of pixels 2i and 2i+1.
    x = jnp.array([0.0, 2.0, 4.0, 8.0]).reshape(1, 4, 1)
    np.testing.assert_allclose(_downscale(x, 0.5, "NHWC").ravel(), [1.0, 6.0])
    assert _downscale(jnp.ones((1, 4, 4, 1), jnp.uint8), 0.5, "NHWC").dtype == jnp.float32


def test_scoring_pass_sees_downscaled_inputs(key):
    seen = []

    def model(inp):
        seen.append(inp.shape)
        return jnp.zeros((inp.shape[0], 5))

    x = jax.random.uniform(key, (4, 8, 8, 3))
    xs, _ = jax.jit(lambda x: select_using_loss(x, jnp.arange(4), model, _per_example_ce, keep=0.5, key=key,
                                                scale_factor=0.5))(x)
    assert seen == [(4, 4, 4, 3)] and xs.shape == (2, 8, 8, 3)  # scored small, kept at full size


def test_errors(key):
    x, y = jnp.zeros((4, 6)), jnp.arange(4)
    model, loss_fun = (lambda inp: inp[:, :5]), _per_example_ce
    with pytest.raises(ValueError, match="3D, 4D, or 5D"):
        select_using_loss(x, y, model, loss_fun, scale_factor=0.5, key=key)
    with pytest.raises(ValueError, match="scale_factor"):
        select_using_loss(x, y, model, loss_fun, scale_factor=1.5, key=key)
    with pytest.raises(ValueError, match="keep"):
        select_using_loss(x, y, model, loss_fun, keep=0.0, key=key)
    with pytest.raises(ValueError, match="one value per example"):
        select_using_loss(x, y, model, lambda o, t, reduction="none": o, key=key)
    with pytest.raises(ValueError, match="shrinks"):
        _downscale(jnp.zeros((1, 2, 2, 1)), 0.4, "NHWC")
    for kwargs, match in (({"keep": 1.5}, "keep"), ({"keep": 0}, "keep"), ({"start": 0.6, "end": 0.5}, "start"),
                          ({"end": 1.5}, "end"), ({"interrupt": -1}, "interrupt"), ({"interrupt": 1.5}, "interrupt"),
                          ({"scale_factor": 0.0}, "scale_factor"), ({"data_format": "HWC"}, "data_format")):
        with pytest.raises(ValueError, match=match):
            SelectiveBackprop(**kwargs)


def test_select_using_loss_checks_as_composer_whatever_keep(key):
    """Composer's own tests: a 2-D input with scale_factor 0.5 raises ValueError and a loss without ``reduction``
    raises TypeError, both with keep=1 (which used to return the batch before checking anything)."""
    torch = pytest.importorskip("torch")
    torch.manual_seed(42)
    x, y = torch.randn(16, 8), torch.randint(2, (16,))
    model = torch.nn.Linear(8, 1)
    ones = lambda output, target, reduction="none": torch.ones_like(target)  # Composer's fake loss_fun
    with pytest.raises(ValueError, match="3D, 4D, or 5D"):
        select_using_loss(x, y, model, ones, 1, 0.5)
    for keep in (1, 0.5):
        with pytest.raises(TypeError, match="must take a keyword argument `reduction`."):
            select_using_loss(x, y, model, lambda output, target: 0, keep, 1, key=key)
        with pytest.raises(TypeError, match="must take a keyword argument `reduction`."):
            select_using_loss(jnp.asarray(x.numpy()), jnp.asarray(y.numpy()), lambda v: v[:, :2], soft_cross_entropy,
                              keep, key=key)
    with pytest.raises(TypeError, match="must be callable"):
        select_using_loss(x, y, model, None, 1)
    for keep in (1, 0.5, 0.75):  # Composer's test_selective_output_shape
        xs, ys = select_using_loss(x, y, model, ones, keep, 1, key=key)
        assert tuple(xs.shape) == (int(16 * keep), 8) and tuple(ys.shape) == (int(16 * keep),)
    images = torch.randn(16, 3, 32, 32)
    conv = torch.nn.Sequential(torch.nn.Conv2d(3, 8, 3), torch.nn.AdaptiveAvgPool2d(1), torch.nn.Flatten())
    for keep, scale in itertools.product((0.5, 0.75, 1), (0.5, 0.75)):  # test_selective_output_shape_scaled
        xs, ys = select_using_loss(images, y, conv, ones, keep, scale, key=key)
        assert tuple(xs.shape) == (int(16 * keep), 3, 32, 32) and tuple(ys.shape) == (int(16 * keep),)


# The grad slot -------------------------------------------------------------------------------------------------

def _recording_grad_fn(record):
    """An inner grad_fn that records what it was called with and returns recognizable values."""
    def grad_fn(params, model_state, batch, key):
        record.append({"state": model_state, "batch": batch, "key": key})
        return (batch["input"].mean(), {"count": model_state["count"] + 10}), jax.tree_util.tree_map(jnp.ones_like,
                                                                                                     params)
    return grad_fn


def _per_example_loss(record):
    def per_example_loss(params, model_state, batch, key, *, train=True):
        record.append({"input_shape": batch["input"].shape, "key": key, "train": train})
        logits = batch["input"].reshape(batch["input"].shape[0], -1)[:, :5] * params["w"]
        return soft_cross_entropy(logits, batch["target"]), {"count": model_state["count"] + 1}
    return per_example_loss


def test_grad_slot_scores_then_backprops_the_selected_examples(key):
    m = SelectiveBackprop(start=0.0, end=1.0, keep=0.5, interrupt=0)
    batch = {**make_batch(key, batch_size=8), "id": jnp.arange(8)}
    params, state = {"w": jnp.ones(())}, {"count": jnp.zeros((), jnp.int32)}
    scored, called = [], []
    ctx = make_ctx(3, jax.random.fold_in(key, 7))._replace(
        stage=m.stage(None, _host(3, 10)), model=ModelView(per_example_loss=_per_example_loss(scored)))
    (loss, new_state), grads = m.grad(_recording_grad_fn(called), ctx)(params, state, batch, key)

    assert len(scored) == 1 and len(called) == 1
    sub = called[0]["batch"]
    ids = np.asarray(sub["id"])
    assert ids.shape == (4,) and (np.diff(ids) > 0).all()
    for k in ("input", "target"):  # every batch entry is gathered with the same indices
        np.testing.assert_array_equal(sub[k], np.asarray(batch[k])[ids])
    # Model state threads through the scoring pass (train mode, as Composer's) into the backprop pass.
    assert scored[0]["train"] and int(called[0]["state"]["count"]) == 1 and int(new_state["count"]) == 11
    assert called[0]["key"] is key  # the inner pass keeps the step's forward key
    # The choice is the functional's draw on the same losses with the method's selection key.
    k_score, k_select = jax.random.split(ctx.key)
    np.testing.assert_array_equal(scored[0]["key"], k_score)
    losses, _ = _per_example_loss([])(params, state, batch, k_score)
    np.testing.assert_array_equal(ids, _selection_indices(losses, k_select, 0.5))
    np.testing.assert_allclose(loss, sub["input"].mean())


def test_grad_slot_scales_only_the_scoring_pass(key):
    m = SelectiveBackprop(start=0.0, end=1.0, keep=0.25, scale_factor=0.5, interrupt=0)
    batch = make_batch(key, batch_size=8)
    scored, called = [], []
    ctx = make_ctx(0, key)._replace(stage=True, model=ModelView(per_example_loss=_per_example_loss(scored)))
    m.grad(_recording_grad_fn(called), ctx)({"w": jnp.ones(())}, {"count": jnp.zeros((), jnp.int32)}, batch, key)
    assert scored[0]["input_shape"] == (8, 4, 4, 3)
    assert called[0]["batch"]["input"].shape == (2, 8, 8, 3)


def test_stage_follows_composer_schedule():
    m = SelectiveBackprop()  # start=0.5, end=0.9, interrupt=2
    on = [s for s in range(20) if m.stage(None, _host(s, 20))]
    assert on == [10, 12, 14, 16]  # t = s / 20 in [0.5, 0.9), and (s + 1) % 2 != 0
    off = SelectiveBackprop(keep=1.0, start=0.0, end=1.0, interrupt=0)
    assert not any(off.stage(None, _host(s, 10)) for s in range(10))
    assert all(SelectiveBackprop(start=0.0, end=1.0, interrupt=0).stage(None, _host(s, 10)) for s in range(10))


def test_plain_steps_and_missing_context(key):
    m = SelectiveBackprop()
    inner = _recording_grad_fn([])
    assert m.grad(inner, make_ctx(0, key)._replace(stage=False)) is inner
    with pytest.raises(ValueError, match="stage"):
        m.grad(inner, make_ctx(0, key))
    with pytest.raises(ValueError, match="per_example_loss"):
        m.grad(inner, make_ctx(0, key)._replace(stage=True))
    ctx = make_ctx(0, key)._replace(stage=True, model=ModelView(per_example_loss=_per_example_loss([])))
    with pytest.raises(ValueError, match="per-example"):
        m.grad(inner, ctx)({"w": jnp.ones(())}, {"count": jnp.zeros((), jnp.int32)},
                           {**make_batch(key), "scale": jnp.ones(())}, key)


# (2) jit == eager, one compile per stage ------------------------------------------------------------------------

def test_jit_equals_eager_and_one_trace_per_stage(key):
    m = SelectiveBackprop(start=0.0, end=1.0, keep=0.5, interrupt=2)
    traces = []

    def step(params, batch, step_idx, stage):
        traces.append(stage)
        ctx = make_ctx(step_idx, jax.random.fold_in(key, step_idx))._replace(
            stage=stage, model=ModelView(per_example_loss=_per_example_loss([])))

        def grad_fn(p, s, b, k):
            def f(p):
                losses, ns = _per_example_loss([])(p, s, b, k)
                return losses.mean(), ns
            return jax.value_and_grad(f, has_aux=True)(p)

        return m.grad(grad_fn, ctx)(params, {"count": jnp.zeros((), jnp.int32)}, batch, key)

    jstep = jax.jit(step, static_argnums=3)
    params = {"w": jnp.array(2.0)}
    for i in range(6):
        batch = make_batch(jax.random.fold_in(key, i), batch_size=8)
        stage = m.stage(None, _host(i, 6))
        (jl, js), jg = jstep(params, batch, i, stage)
        (el, es), eg = step(params, batch, i, stage)
        np.testing.assert_allclose(jl, el, rtol=1e-6)
        np.testing.assert_allclose(jg["w"], eg["w"], rtol=1e-5, atol=1e-7)
        assert int(js["count"]) == int(es["count"]) == (2 if stage else 1)
    assert traces.count(True) == 3 + 1 and traces.count(False) == 3 + 1  # eager calls + one trace per stage


def test_in_trainer_a_selecting_step_backprops_half_the_batch():
    from flax import nnx

    from jaxcomposer import Trainer
    from jaxcomposer.data import ArrayLoader
    from jaxcomposer.models import MLP
    from jaxcomposer.models.tasks import ComposerClassifier
    from jaxcomposer.optim import DecoupledSGDW
    from tests.trainer.helpers import digits

    seen = []

    class Recording(ComposerClassifier):
        def loss(self, outputs, batch):
            seen.append(outputs.shape[0])  # at trace time: the batch sizes the loss is computed on
            return super().loss(outputs, batch)

    task = Recording(MLP(64, hidden=(16,), num_classes=10, rngs=nnx.Rngs(0)), num_classes=10)
    trainer = Trainer(model=task, train_dataloader=ArrayLoader(digits("train", n=64), 16, seed=0), max_duration="4ba",
                      optimizers=DecoupledSGDW(lr=0.1), algorithms=[SelectiveBackprop(start=0.5, end=1.0, keep=0.25,
                                                                                     interrupt=0)],
                      seed=0, progress_bar=False, devices=jax.devices()[:1])
    trainer.fit()
    # steps 0-1 plain (one trace, 16 examples), steps 2-3 select (scores 16, backprops int(0.25 * 16) = 4)
    assert sorted(seen) == [4, 16, 16]
    programs = trainer.compiled_programs()
    assert programs and all(n == 2 for n in programs.values())


# (5) composition ------------------------------------------------------------------------------------------------

def test_sorts_first_by_declaration():
    # order=-1 (Composer's sort_selective_backprop_first): outermost grad wrapper wherever it is listed
    m = SelectiveBackprop()
    assert m.order == -1
    others = [examples()[n].make() for n in ("MixUp", "SAM", "EMA")]
    assert compose([*others, m]).names[0] == "SelectiveBackprop"
    assert compose([others[1], m]).names == ("SelectiveBackprop", "SAM")


def test_mixup_entries_travel_with_the_kept_examples(key):
    from jaxcomposer.algorithms.mixup import MIXING_KEY, TARGET_PERM_KEY

    composed = compose([SelectiveBackprop(start=0.0, end=1.0, interrupt=0), examples()["MixUp"].make()])
    ctx = make_ctx(0, key)._replace(stage=composed.stage(None, _host(0, 4)),
                                    model=ModelView(per_example_loss=_per_example_loss([])))
    batch = composed.apply_batch({**make_batch(key, batch_size=8), "id": jnp.arange(8)}, ctx)
    called = []
    composed.wrap_grad(_recording_grad_fn(called), ctx)({"w": jnp.ones(())},
                                                        {"count": jnp.zeros((), jnp.int32)}, batch, key)
    sub = called[0]["batch"]
    ids = np.asarray(sub["id"])
    for k in (TARGET_PERM_KEY, MIXING_KEY, "input", "target"):
        np.testing.assert_array_equal(sub[k], np.asarray(batch[k])[ids])
