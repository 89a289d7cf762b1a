"""``DataSpec``: Composer's loader wrapper. Its transforms run inside the compiled steps, its counters on the host.

The reference run trains the digits MLP on images normalized on the host; the same run on uint8 images with the
normalization as ``batch_transforms`` must end with the same weights, bit for bit (``NormalizeImages`` looks the
host's values up), evaluate and predict the same, and count what the DataSpec's counters say.
"""
import warnings

import jax
import numpy as np
import pytest

from jaxcomposer import DataSpec, Trainer
from jaxcomposer.data import DIGITS_MEAN, DIGITS_STD, ArrayLoader, load_digits
from jaxcomposer.errors import ConfigurationError
from jaxcomposer.optim import DecoupledSGDW
from jaxcomposer.data import NormalizeImages
from tests.trainer.helpers import leaves, loaders, mlp_task

NORMALIZE = NormalizeImages(DIGITS_MEAN, DIGITS_STD)


def uint8_loaders(batch_size=32):
    """The digits as ``helpers.loaders`` yields them (same order), before normalization."""
    train = ArrayLoader(dict(load_digits("train")), batch_size, shuffle=True, seed=0, drop_last=True)
    evals = ArrayLoader(dict(load_digits("test")), 100, shuffle=False, drop_last=False)
    return train, evals


def fit(train, evals, **kw):
    trainer = Trainer(model=mlp_task(), train_dataloader=train, eval_dataloader=evals, max_duration="1ep",
                      optimizers=DecoupledSGDW(lr=0.1, momentum=0.9), seed=0, progress_bar=False, **kw)
    trainer.fit()
    return trainer


@pytest.fixture(scope="module")
def host_normalized():
    return fit(*loaders(batch_size=32))


@pytest.fixture(scope="module")
def in_step():
    train, evals = uint8_loaders()
    return fit(DataSpec(train, batch_transforms=NORMALIZE), DataSpec(evals, batch_transforms=NORMALIZE))


def test_the_table_gives_the_host_values_bit_for_bit():
    images = load_digits("test")["input"]
    from jaxcomposer.data import normalize_images
    on_device = jax.jit(NORMALIZE)({"input": images})["input"]
    np.testing.assert_array_equal(np.asarray(on_device), normalize_images(images, DIGITS_MEAN, DIGITS_STD))
    three = np.random.default_rng(0).integers(0, 256, (4, 5, 5, 3), dtype=np.uint8)
    per_channel = NormalizeImages((0.4, 0.5, 0.6), (0.2, 0.25, 0.3))
    np.testing.assert_array_equal(np.asarray(jax.jit(per_channel)({"input": three})["input"]),
                                  normalize_images(three, (0.4, 0.5, 0.6), (0.2, 0.25, 0.3)))


def test_batch_transforms_in_the_step_train_evaluate_and_predict_as_host_normalized_data(host_normalized, in_step):
    assert in_step.state.timestamp.batch == host_normalized.state.timestamp.batch == 42
    for a, b in zip(leaves(in_step.state.train_state.params), leaves(host_normalized.state.train_state.params)):
        np.testing.assert_array_equal(a, b)
    assert in_step.state.eval_metrics["eval"] == host_normalized.state.eval_metrics["eval"]
    assert 0.8 < in_step.state.eval_metrics["eval"]["MulticlassAccuracy"]
    uint8_evals, host_evals = uint8_loaders()[1], loaders()[1]
    # eval() and predict() take a DataSpec too, and run its transform
    assert in_step.eval(DataSpec(uint8_evals, batch_transforms=NORMALIZE)) == host_normalized.eval(host_evals)
    got = in_step.predict(DataSpec(uint8_evals, batch_transforms=NORMALIZE), subset_num_batches=2)
    want = host_normalized.predict(host_evals, subset_num_batches=2)
    for a, b in zip(got, want):
        np.testing.assert_array_equal(a, b)


def test_microbatch_transforms_run_on_each_microbatch(host_normalized):
    seen = {"batch": [], "microbatch": []}

    def note(kind):
        def transform(batch):
            seen[kind].append(batch["input"].shape[0])
            return NORMALIZE(batch) if kind == "microbatch" else batch
        return transform

    train, evals = uint8_loaders()
    trainer = fit(DataSpec(train, batch_transforms=note("batch"), microbatch_transforms=note("microbatch")),
                  DataSpec(evals, batch_transforms=NORMALIZE), device_train_microbatch_size=16)
    assert set(seen["batch"]) == {32} and set(seen["microbatch"]) == {16}
    # the normalization is elementwise: per microbatch it is the host-normalized run, to float32 rounding (the
    # accumulated gradient sums two halves)
    for a, b in zip(leaves(trainer.state.train_state.params), leaves(host_normalized.state.train_state.params)):
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-5)


def test_the_counters_feed_the_timestamp():
    train, evals = uint8_loaders()
    spec = DataSpec(train, batch_transforms=NORMALIZE, get_num_samples_in_batch=lambda b: 2 * len(b["target"]),
                    get_num_tokens_in_batch=lambda b: 5, num_samples=1347)
    trainer = Trainer(model=mlp_task(), train_dataloader=spec, max_duration="3ba", seed=0, progress_bar=False)
    trainer.fit()
    ts = trainer.state.timestamp
    assert (ts.batch, ts.sample, ts.token) == (3, 3 * 64, 15)
    assert spec.num_samples == 1347 and "batch_transforms" in repr(spec)


def test_a_dict_of_data_spec_arguments_is_a_data_spec(host_normalized):
    train, evals = uint8_loaders()
    trainer = fit({"dataloader": train, "batch_transforms": NORMALIZE},
                  {"dataloader": evals, "batch_transforms": NORMALIZE})
    for a, b in zip(leaves(trainer.state.train_state.params), leaves(host_normalized.state.train_state.params)):
        np.testing.assert_array_equal(a, b)
    with pytest.raises(ConfigurationError, match="DataSpec's arguments: .*batch_transform"):
        fit({"dataloader": train, "batch_transform": NORMALIZE}, None)


def test_fit_with_another_data_spec_compiles_its_transform():
    train, _ = uint8_loaders()
    doubled = []
    trainer = Trainer(model=mlp_task(), train_dataloader=DataSpec(train, batch_transforms=NORMALIZE),
                      max_duration="2ba", seed=0, progress_bar=False)
    trainer.fit()

    def double(batch):
        doubled.append(True)
        return {**NORMALIZE(batch), "input": 2 * NORMALIZE(batch)["input"]}

    trainer.fit(train_dataloader=DataSpec(train, batch_transforms=double), duration="1ba")
    assert doubled and trainer.state.timestamp.batch == 3


def test_bad_specs_are_refused_before_anything_runs():
    train, _ = uint8_loaders()
    with pytest.raises(ConfigurationError, match="split_batch: not supported"):
        DataSpec(train, split_batch=lambda batch, n: [batch])
    with pytest.raises(ConfigurationError, match="batch_transforms: expected a function"):
        DataSpec(train, batch_transforms="normalize")
    with pytest.raises(ConfigurationError, match="device_transforms and batch_transforms both given"):
        DataSpec(train, batch_transforms=NORMALIZE, device_transforms=NORMALIZE)
    with pytest.raises(ConfigurationError, match="got another DataSpec"):
        DataSpec(DataSpec(train))
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        spec = DataSpec(train, device_transforms=NORMALIZE)
    assert spec.batch_transforms is NORMALIZE and any(w.category is DeprecationWarning for w in caught)


def test_an_eager_torch_style_transform_is_named_and_nothing_trains():
    train, _ = uint8_loaders()
    trainer = Trainer(model=mlp_task(), train_dataloader=DataSpec(train, batch_transforms=lambda b: {
        **b, "input": b["input"].float()}), max_duration="2ba", seed=0, progress_bar=False)
    before = leaves(trainer.state.train_state.params)
    with pytest.raises(ConfigurationError, match=r"DataSpec.batch_transforms: raised AttributeError.*JAX function"):
        trainer.fit()
    assert trainer.state.timestamp.batch == 0
    for a, b in zip(leaves(trainer.state.train_state.params), before):
        np.testing.assert_array_equal(a, b)


# -- Composer's NormalizationFn --------------------------------------------------------------------------------------
def composer_formula(x, mean, std, axis):
    shape = [1] * x.ndim
    shape[axis] = -1
    return (x.astype(np.float32) - np.asarray(mean, np.float32).reshape(shape)) / \
        np.asarray(std, np.float32).reshape(shape)


def test_normalization_fn_gives_composers_values_bit_for_bit():
    from jaxcomposer.data import NormalizationFn
    mean, std = (123.675, 116.28, 103.53), (58.395, 57.12, 57.375)  # Composer's IMAGENET_CHANNEL_MEAN/STD
    rng = np.random.default_rng(0)
    nchw = rng.integers(0, 256, (4, 3, 6, 6), dtype=np.uint8)
    target = np.arange(4, dtype=np.int32)
    xs, ys = jax.jit(NormalizationFn(mean, std, ignore_background=True))((nchw, target))  # a pair, as Composer's
    np.testing.assert_array_equal(np.asarray(xs), composer_formula(nchw, mean, std, 1))
    np.testing.assert_array_equal(np.asarray(ys), target - 1)
    nhwc = nchw.transpose(0, 2, 3, 1)
    out = jax.jit(NormalizationFn(mean, std, channels_axis=-1))({"input": nhwc, "target": target, "id": target})
    np.testing.assert_array_equal(np.asarray(out["input"]), composer_formula(nhwc, mean, std, -1))
    assert set(out) == {"input", "target", "id"} and np.array_equal(np.asarray(out["target"]), target)
    floats = nhwc.astype(np.float32) + 0.5  # not pixels: the same formula in arithmetic
    np.testing.assert_allclose(np.asarray(jax.jit(NormalizationFn(mean, std, channels_axis=-1))(
        {"input": floats, "target": target})["input"]), composer_formula(floats, mean, std, -1), rtol=1e-6)


def test_a_composer_script_with_device_transforms_trains_as_the_formula_on_the_host():
    from jaxcomposer.data import NormalizationFn
    mean, std = 255 * DIGITS_MEAN, 255 * DIGITS_STD
    train, evals = uint8_loaders()
    d = dict(load_digits("train"))
    host_train = ArrayLoader({**d, "input": composer_formula(d["input"], mean, std, -1)}, 32, shuffle=True, seed=0,
                             drop_last=True)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)  # Composer's former name, still taken
        spec = DataSpec(train, device_transforms=NormalizationFn([mean], [std], channels_axis=-1))
    on_device, on_host = fit(spec, None), fit(host_train, None)
    for a, b in zip(leaves(on_device.state.train_state.params), leaves(on_host.state.train_state.params)):
        np.testing.assert_array_equal(a, b)


def test_the_trainers_own_loaders_passed_back_keep_their_transforms(host_normalized, in_step):
    # fit() hands the Trainer uint8 loaders in DataSpecs: trainer.eval_dataloader passed back must stay normalized
    assert in_step.eval(in_step.eval_dataloader) == host_normalized.eval(host_normalized.eval_dataloader)
    got = in_step.predict(in_step.eval_dataloader, subset_num_batches=1)
    want = host_normalized.predict(host_normalized.eval_dataloader, subset_num_batches=1)
    np.testing.assert_array_equal(got[0], want[0])
    got = in_step.predict(in_step.train_dataloader, subset_num_batches=1)
    want = host_normalized.predict(host_normalized.train_dataloader, subset_num_batches=1)
    np.testing.assert_array_equal(got[0], want[0])


def test_a_new_data_spec_around_the_same_functions_reuses_the_compiled_steps(in_step):
    _, evals = uint8_loaders()
    in_step.eval(DataSpec(evals, batch_transforms=NORMALIZE))
    compiled = in_step.compiled_programs("eval")
    in_step.eval(DataSpec(evals, batch_transforms=NORMALIZE), subset_num_batches=1)
    assert in_step.compiled_programs("eval") == compiled  # no new step, and no new program, for an equal DataSpec
