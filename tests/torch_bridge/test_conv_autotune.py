"""conv_impl='auto': each convolution shape runs on whichever of oneDNN's and XLA's measured faster, measured once per
machine (a file shared by processes), pinned by JAXCOMPOSER_CONV_AUTOTUNE, and said by the Trainer after its first
step. The suite pins 'onednn' (tests/conftest.py); these tests choose their own policy and cache."""
from __future__ import annotations

import json
import threading
import time

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx
from jax import lax

from jaxcomposer import Trainer
from jaxcomposer.core import cpu_threads
from jaxcomposer.models import ComposerClassifier, ConvNet
from torch_bridge import kernels
from torch_bridge.kernels import autotune

NHWC = ("NHWC", "HWIO", "NHWC")
TARGET = "jaxcomposer_onednn_conv_"


def _spec(cin=4, cout=8, size=9, batch=2) -> autotune.ConvSpec:
    return autotune.ConvSpec((batch, size, size, cin), (3, 3, cin, cout), "float32",
                             ((1, 1), ((1, 1), (1, 1)), None, (1, 1), NHWC, 1, 1))


def _conv(x, w):
    return autotune.conv_general_dilated(x, w, (1, 1), ((1, 1), (1, 1)), dimension_numbers=NHWC)


def _operands(seed=0, cin=4, cout=8):
    rng = np.random.default_rng(seed)
    return (jnp.asarray(rng.standard_normal((2, 9, 9, cin)), jnp.float32),
            jnp.asarray(rng.standard_normal((3, 3, cin, cout)) / 6, jnp.float32))


MS = {"forward": {"onednn": 1.0, "xla": 2.0}}


class CountingMeasure:
    """A stand-in measurement: all on XLA for convolutions with more than 4 input channels, else all on oneDNN."""

    def __init__(self, delay=0.0):
        self.calls, self.delay = [], delay

    def __call__(self, spec):
        self.calls.append(spec.key)
        time.sleep(self.delay)
        return autotune.Choice(*("xla" if spec.rhs_shape[2] > 4 else "onednn",) * 3, ms=MS)


def test_a_shape_is_measured_once_then_read_from_memory_and_from_the_file(tmp_path):
    path = tmp_path / "tune.json"
    measure = CountingMeasure()
    tuner = autotune.ConvAutotuner(path, measure=measure)
    first = tuner.choose(_spec())
    assert first == autotune.Choice("onednn", "onednn", "onednn", MS, "measured")
    assert tuner.choose(_spec()) is first and tuner.choose(_spec(cin=8)).parts == ("xla",) * 3
    assert len(measure.calls) == 2
    saved = json.loads(path.read_text())
    assert saved["choices"][_spec().key] == {"forward": "onednn", "input_grad": "onednn", "kernel_grad": "onednn",
                                             "ms": MS}
    assert saved["fingerprint"]["versions"]["torch"] and saved["fingerprint"]["cpu"]["model"]
    # another process (a fresh tuner on the same file) reads it and measures nothing
    again = CountingMeasure()
    second = autotune.ConvAutotuner(path, measure=again)
    assert second.choose(_spec()) == autotune.Choice("onednn", "onednn", "onednn", MS, "cached") and again.calls == []
    assert second.summary() == ("oneDNN for 1 forward, 1 input-gradient and 1 kernel-gradient convolutions of 1 "
                                f"shapes, XLA for the rest (1 cached; cache {path})")


def test_processes_sharing_the_file_measure_each_shape_once_and_agree(tmp_path):
    measures = [CountingMeasure(delay=0.05) for _ in range(4)]
    tuners = [autotune.ConvAutotuner(tmp_path / "tune.json", measure=m) for m in measures]
    results = [None] * 4
    threads = [threading.Thread(target=lambda i=i: results.__setitem__(i, tuners[i].choose(_spec())))
               for i in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert sum(len(m.calls) for m in measures) == 1
    assert {r.parts for r in results} == {("onednn",) * 3}
    assert sorted(r.source for r in results) == ["cached"] * 3 + ["measured"]


@pytest.mark.parametrize("content", ["{not json", json.dumps({"choices": {_spec().key: {"impl": "onednn"}}})])
def test_an_unreadable_cache_or_entry_is_measured_again_and_rewritten(tmp_path, content):
    path = tmp_path / "tune.json"
    path.write_text(content)
    measure = CountingMeasure()
    assert autotune.ConvAutotuner(path, measure=measure).choose(_spec()).source == "measured"
    assert json.loads(path.read_text())["choices"][_spec().key]["forward"] == "onednn"


def test_a_pinned_policy_measures_nothing_and_a_wrong_one_is_refused(tmp_path):
    measure = CountingMeasure()
    tuner = autotune.ConvAutotuner(tmp_path / "t.json", measure=measure, policy="xla")
    assert tuner.choose(_spec()) == autotune.Choice("xla", "xla", "xla", None, "pinned") and measure.calls == []
    assert not (tmp_path / "t.json").exists()
    assert tuner.summary().endswith("(1 pinned by JAXCOMPOSER_CONV_AUTOTUNE)")
    with pytest.raises(ValueError, match=r"JAXCOMPOSER_CONV_AUTOTUNE='fast': expected one of \('measure'"):
        autotune.ConvAutotuner(None, policy="fast")


def test_the_measurement_times_each_part_on_both_and_keeps_the_faster():
    choice = autotune.measure(_spec(cin=8, cout=16, size=12, batch=4))
    assert choice.source == "measured" and set(choice.ms) == set(autotune.PARTS)
    for part, impl in zip(autotune.PARTS, choice.parts):
        times = choice.ms[part]
        assert times["onednn"] > 0 and times["xla"] > 0
        assert impl == ("onednn" if times["onednn"] <= times["xla"] else "xla")


@pytest.mark.parametrize("policy", ["onednn", "xla"])
def test_the_chosen_implementation_is_what_compiles_and_both_agree_with_lax(policy, monkeypatch, tmp_path):
    monkeypatch.setenv(autotune.POLICY_ENV, policy)
    monkeypatch.setenv(autotune.CACHE_ENV, str(tmp_path))
    x, w = _operands(seed=1 if policy == "xla" else 2)  # a trace of its own per policy

    def loss(f):
        return lambda x, w: jnp.sum(f(x, w) ** 2)
    grads = jax.jit(jax.grad(loss(_conv), argnums=(0, 1)))
    hlo = grads.lower(x, w).compile().as_text()
    assert (TARGET in hlo) == (policy == "onednn")
    ref = jax.grad(loss(lambda x, w: lax.conv_general_dilated(x, w, (1, 1), ((1, 1), (1, 1)),
                                                              dimension_numbers=NHWC)), argnums=(0, 1))(x, w)
    for got, want in zip(grads(x, w), ref):
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("parts", [("onednn", "xla", "onednn"), ("xla", "onednn", "xla")])
def test_mixed_parts_compute_the_same_gradients_and_drop_an_unused_input_gradient(parts, monkeypatch):
    """Each part runs where it was chosen (a custom VJP joins them); the values and both gradients equal lax's, and
    a convolution whose input needs no gradient (a stem's) computes none, on either implementation."""
    tuner = autotune.ConvAutotuner(None, measure=lambda spec: autotune.Choice(*parts))
    monkeypatch.setattr(autotune, "default_tuner", lambda: tuner)
    x, w = _operands(seed=3 if parts[0] == "onednn" else 4)
    loss = lambda conv: (lambda x, w: jnp.sum(jnp.sin(conv(x, w))))
    both = jax.jit(jax.value_and_grad(loss(_conv), argnums=(0, 1)))
    hlo = both.lower(x, w).compile().as_text()
    for part, impl in zip(("forward", "input_grad", "kernel_grad"), parts):
        assert (f"{TARGET}{part}" in hlo) == (impl == "onednn"), part
    assert hlo.count(" convolution(") == parts.count("xla")  # each XLA part one XLA convolution, no forward again
    ref = jax.value_and_grad(loss(lambda x, w: lax.conv_general_dilated(x, w, (1, 1), ((1, 1), (1, 1)),
                                                                        dimension_numbers=NHWC)), argnums=(0, 1))(x, w)
    for got, want in zip(jax.tree.leaves(both(x, w)), jax.tree.leaves(ref)):
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)
    kernel_only = jax.jit(jax.grad(loss(_conv), argnums=1)).lower(x, w).compile().as_text()
    assert f"{TARGET}input_grad" not in kernel_only
    assert (f"{TARGET}kernel_grad" in kernel_only) == (parts[2] == "onednn")
    assert kernel_only.count(" convolution(") == (parts[0] == "xla") + (parts[2] == "xla")


def test_a_convolution_onednn_cannot_run_is_xlas_without_measuring(monkeypatch, tmp_path):
    monkeypatch.setenv(autotune.POLICY_ENV, "measure")
    monkeypatch.setenv(autotune.CACHE_ENV, str(tmp_path))
    before = len(autotune.default_tuner().choices)
    x, w = _operands()
    assert autotune.choice(x, w, (1, 1), ((1, 1), (1, 1)), lhs_dilation=(2, 2), dimension_numbers=NHWC) is None
    assert autotune.choice(x[0], w[0], (1,), ((1, 1),)) is None  # 1-D
    assert len(autotune.default_tuner().choices) == before and not list(tmp_path.iterdir())


def _batches(n=2, size=16):
    rng = np.random.default_rng(0)
    return [{"input": rng.standard_normal((size, 12, 12, 3)).astype(np.float32),
             "target": rng.integers(0, 4, size).astype(np.int32)} for _ in range(n)]


def test_models_default_to_auto_and_the_trainer_says_what_it_measured(monkeypatch, tmp_path, capsys):
    """A model built in Python gets the measured choice by default; the first step's convolutions are measured
    once, written to the cache, logged as the ``conv_impl`` hyperparameter and said on the console."""
    monkeypatch.setenv(autotune.POLICY_ENV, "measure")
    monkeypatch.setenv(autotune.CACHE_ENV, str(tmp_path))
    model = ConvNet((8, 16), (2, 2), in_channels=3, num_classes=4, image_size=12, rngs=nnx.Rngs(0))
    trainer = Trainer(model=ComposerClassifier(model, num_classes=4), train_dataloader=_batches(),
                      max_duration="2ba", progress_bar=False, log_to_console=True, loggers=[])
    logged = {}
    monkeypatch.setattr(trainer.logger, "log_hyperparameters", lambda h: logged.update(h))
    trainer.fit()
    said = logged["conv_impl"]
    assert said.endswith(f"convolutions of 2 shapes, XLA for the rest (2 measured; cache {autotune.cache_path()})")
    assert f"conv_impl='auto' chose {said}" in capsys.readouterr().err
    cache = json.loads(autotune.cache_path().read_text())["choices"]
    assert len(cache) == 2 and all(set(c) == {*autotune.PARTS, "ms"} for c in cache.values())
    counts = [sum(c[part] == "onednn" for c in cache.values()) for part in autotune.PARTS]
    assert said.startswith(f"oneDNN for {counts[0]} forward, {counts[1]} input-gradient and {counts[2]} "
                           "kernel-gradient")
    trainer.fit(duration="1ba")  # said once per Trainer
    assert capsys.readouterr().err.count("conv_impl='auto'") == 0


def test_auto_counts_as_oneDNN_for_the_XLA_thread_decision():
    assert cpu_threads.uses_onednn_convolutions({"name": "convnet"})  # the default is auto; torch is installed
    assert cpu_threads.uses_onednn_convolutions({"name": "resnet_cifar", "conv_impl": "auto"})
    assert not cpu_threads.uses_onednn_convolutions({"name": "convnet", "conv_impl": "xla"})
    assert not cpu_threads.uses_onednn_convolutions({"name": "gpt"})
    assert kernels.available()
