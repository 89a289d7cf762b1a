"""``device_train_microbatch_size='auto'``: the largest microbatch whose compiled step fits the memory budget."""
import contextlib

import jax
import numpy as np
import pytest
from flax import nnx

from jaxcomposer import parallel
from jaxcomposer.data import ArrayLoader
from jaxcomposer.errors import ConfigurationError
from jaxcomposer.models.tasks import ComposerClassifier
from jaxcomposer.trainer.checkpoint import flat_paths
from jaxcomposer.trainer.trainer import Trainer


class ConvNet(nnx.Module):
    """Activations dominate its memory (and no BatchNorm: microbatches then give exactly the full-batch gradient)."""

    def __init__(self, rngs: nnx.Rngs):
        self.conv1 = nnx.Conv(1, 16, (3, 3), rngs=rngs)
        self.conv2 = nnx.Conv(16, 16, (3, 3), rngs=rngs)
        self.head = nnx.Linear(16, 10, rngs=rngs)

    def __call__(self, x, *, train=False, key=None):
        x = jax.nn.relu(self.conv2(jax.nn.relu(self.conv1(x))))
        return self.head(x.mean(axis=(1, 2)))


# 12x12 images: a step at 28x28 runs several times longer on CPU and the search only needs peaks that differ by size
DATA = np.random.default_rng(0).normal(size=(128, 12, 12, 1)).astype(np.float32)
TARGETS = np.random.default_rng(1).integers(0, 10, 128).astype(np.int32)


def run(**kw):
    loader = ArrayLoader({"input": DATA, "target": TARGETS}, 64, shuffle=True, seed=0, drop_last=True)
    t = Trainer(model=ComposerClassifier(ConvNet(nnx.Rngs(0)), num_classes=10), train_dataloader=loader,
                max_duration="2ba", seed=5, progress_bar=False, **kw)
    t.fit()
    return t, {k: np.asarray(v) for k, v in flat_paths(t.state.train_state.params).items()}


@contextlib.contextmanager
def lowerings_of(fun_name: str):
    """The lowerings to MLIR, inside the block, of jitted functions named ``fun_name`` (``"jit(name)"``), as JAX's
    monitoring events report them."""
    seen = []

    def listen(event, duration, **kw):
        if event == "/jax/core/compile/jaxpr_to_mlir_module_duration" and kw.get("fun_name") == fun_name:
            seen.append(duration)

    jax.monitoring.register_event_duration_secs_listener(listen)
    try:
        yield seen
    finally:
        jax.monitoring.unregister_event_duration_listener(listen)


@pytest.fixture(scope="module")
def full_batch():
    return run()


def test_auto_picks_smaller_microbatches_for_a_smaller_budget_and_trains_to_the_full_batch_update(full_batch):
    _, reference = full_batch
    chosen = {}
    for budget in (1_000_000, 500_000):
        with lowerings_of("jit(train_step)") as lowered:
            t, params = run(device_train_microbatch_size="auto", device_memory_bytes=budget)
        report = t.auto_microbatch_report
        # each candidate tried is traced and compiled once: the run calls the chosen one's compiled step
        assert len(lowered) == len(report["peak_bytes_by_size"])
        chosen[budget] = report["chosen"]
        # the chosen size fits; the next larger candidate tried did not
        assert report["peak_bytes_by_size"][report["chosen"]] <= budget
        assert all(peak > budget for size, peak in report["peak_bytes_by_size"].items() if size > report["chosen"])
        assert t.microbatch_size == report["chosen"]
        for k in reference:
            np.testing.assert_allclose(params[k], reference[k], rtol=1e-5, atol=1e-6, err_msg=k)
    full_peak = parallel.memory_per_device(t.compiled_train_step({"input": DATA[:64], "target": TARGETS[:64]}))
    assert full_peak["peak"] > 1_000_000  # the full batch (64) fits neither budget
    assert chosen[1_000_000] > chosen[500_000] >= 2  # two budgets, two sizes (multiples of the 2 devices)


def test_auto_without_a_known_limit_keeps_the_whole_batch():
    t, _ = run(device_train_microbatch_size="auto")  # CPU devices report no memory limit
    assert t.auto_microbatch_report == {"chosen": 64, "budget_bytes": None, "peak_bytes_by_size": {}}


def test_auto_says_when_nothing_fits():
    with pytest.raises(ConfigurationError, match=r"even microbatches of 2 need [\d,]+ bytes per device, over the "
                                                  r"1,000 available"):
        run(device_train_microbatch_size="auto", device_memory_bytes=1000)
