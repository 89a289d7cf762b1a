"""Item 5 of every method's contract: it composes with every other method (docs/design.md, "Tests").

One table drives it: every unordered pair of registered methods, once. Pairs that declare a conflict must raise
before anything is compiled. Pairs whose only shared slot is ``model`` (two surgeries) apply both surgeries, in
both orders, to a small ResNet and a small GPT and trace the surgered forward (``jax.eval_shape``: no compile);
other pairs that share a slot (their wrappers nest) or change shapes (a ``stage`` slot) run four jitted dummy steps
through every slot with finite losses; the rest, whose slots are disjoint, must compose into exactly the union of
their slots.
"""
import functools
import itertools
import warnings

import jax
import jax.numpy as jnp
import pytest
from flax import nnx

from jaxcomposer.errors import NoEffectWarning
from jaxcomposer.core.method import MethodConflictError, StepCtx, compose
from jaxcomposer.models import GPT, ResNetCIFAR
from jaxcomposer.models.tasks import ComposerCausalLM, ComposerClassifier
from tests.algorithms.algo_testing import examples, run_steps

SLOTS = ("model", "batch", "loss", "grad", "tx", "schedule", "post_step", "eval", "data")
NAMES = sorted(examples())
PAIRS = list(itertools.combinations(NAMES, 2))


def _slots(m) -> set[str]:
    return {s for s in SLOTS if getattr(m, s) is not None}


def _declared_conflict(a, b) -> bool:
    return bool(a.exclusive & b.exclusive) or a.name in b.conflicts_with or b.name in a.conflicts_with


def test_table_covers_every_pair():
    assert len(PAIRS) == len(NAMES) * (len(NAMES) - 1) // 2 and len(NAMES) >= 16


@pytest.mark.parametrize("name", NAMES)
def test_listed_twice_is_refused(name):
    with pytest.raises(MethodConflictError, match="more than once"):
        compose([examples()[name].make(), examples()[name].make()])


@pytest.mark.parametrize("first,second", PAIRS, ids=[f"{a}+{b}" for a, b in PAIRS])
def test_pair_composes(first, second, key):
    a, b = examples()[first].make(), examples()[second].make()
    if _declared_conflict(a, b):
        with pytest.raises(MethodConflictError):
            compose([a, b])
        with pytest.raises(MethodConflictError):
            compose([b, a])
        return
    composed = compose([a, b])
    assert set(composed.names) == {first, second}
    if _slots(a) & _slots(b) == {"model"} and a.stage is None and b.stage is None:
        for pair in (composed, compose([b, a])):
            _surgeries_compose(pair)
    elif _slots(a) & _slots(b) or a.stage is not None or b.stage is not None:
        run_steps(composed, key)
    else:  # disjoint slots cannot interact: each slot holds exactly its one owner's piece, in either order
        flipped = compose([b, a])
        for slot in SLOTS:
            owners = {m.name for m in (a, b) if getattr(m, slot) is not None}
            for c in (composed, flipped):
                assert [f for _, f in c._each(slot)] == [getattr(m, slot) for m in (a, b) if m.name in owners]


def test_mixers_conflict_by_declaration_not_by_name():
    from jaxcomposer.core.method import Method

    with pytest.raises(MethodConflictError, match="interpolate"):
        compose([examples()["MixUp"].make(), Method(name="x", exclusive={"interpolates_targets"})])
    with pytest.raises(MethodConflictError, match="cannot be combined"):
        compose([Method(name="a", conflicts_with={"b"}), Method(name="b")])
    outer = Method(name="z", order=-1)
    assert compose([Method(name="a"), outer]).names == ("z", "a")


@functools.cache
def _pristine(name: str) -> nnx.Module:
    # built once per worker and cloned for each use (a clone is far cheaper than an eager build): the surgeries
    # change the modules they are given in place
    if name == "resnet":
        return ResNetCIFAR(depth=8, width=4, num_classes=10, in_channels=1, dropout=0.2, rngs=nnx.Rngs(0))
    return GPT(vocab_size=32, seq_len=16, d_model=16, n_layers=2, n_heads=2, dropout=0.1, rngs=nnx.Rngs(0))


# (task builder, batch): a CNN with BatchNorm and dropout (the Trainer contract's) and a GPT, for the surgeries
_SURGERY_MODELS = {
    "resnet": (lambda: ComposerClassifier(nnx.clone(_pristine("resnet")), num_classes=10),
               {"input": jnp.zeros((16, 12, 12, 1)), "target": jnp.zeros((16,), jnp.int32)}),
    "gpt": (lambda: ComposerCausalLM(nnx.clone(_pristine("gpt"))), {"input_ids": jnp.zeros((4, 17), jnp.int32)}),
}


# surgered models already traced on this worker, by what fixes the trace (below): most pairs change at most one of
# the two models (BlurPool finds no convolution in the GPT, Alibi no attention in the ResNet), so most surgered
# models recur, and each trace is costly
_TRACED: set = set()


def _trace_key(name: str, task) -> tuple:
    """What a surgered task's forward and loss trace from: its class, its settings, the module's structure (NNX
    graphdef: layer types and static attributes) and its arrays' shapes and dtypes."""
    source = task.source
    structure = nnx.graphdef(source) if isinstance(source, nnx.Module) else id(source)
    leaves, treedef = jax.tree.flatten((task.params, task.state))
    settings = tuple(sorted((k, v if isinstance(v, (int, float, str, bool, type(None))) or callable(v) else id(v))
                            for k, v in vars(task).items() if k not in ("source", "_pure") and "metrics" not in k))
    return name, type(task), settings, structure, treedef, tuple((x.shape, x.dtype) for x in leaves)


def _surgeries_compose(composed):
    """Both surgeries apply, in the composed order, to each model, and the result's training forward and loss
    trace to per-example losses ``(B,)`` (a surgery that finds nothing to change may warn)."""
    ctx = StepCtx(step=0, key=jax.random.PRNGKey(0))
    for name, (build, batch) in _SURGERY_MODELS.items():
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", NoEffectWarning)
            task = composed.apply_model(build(), ctx)
        key = _trace_key(name, task)
        if key in _TRACED:
            continue

        def losses(params, state):
            outputs = task.forward(params, state, batch, train=True, key=jax.random.PRNGKey(1))[0]
            return task.loss(outputs, batch)

        batch_size = len(next(iter(batch.values())))
        assert jax.eval_shape(losses, task.params, task.state).shape == (batch_size,), (composed.names, name)
        _TRACED.add(key)
