"""Task wrappers: per-example losses, their evaluation metrics, the pure forward under jit(grad), and a tiny fit for
each model."""
import math

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from flax import nnx

from jaxcomposer.core.model import PureModel
from jaxcomposer.metrics import CrossEntropy
from jaxcomposer.metrics.base import batch_states, compute_all, sum_states
from jaxcomposer.models import GPT, MLP, ComposerCausalLM, ComposerClassifier, ResNetCIFAR

V = 256


def classifier_batch(key, b=8, shape=(8, 8, 1), c=10):
    kx, ky = jax.random.split(key)
    return {"input": jax.random.normal(kx, (b, *shape)), "target": jax.random.randint(ky, (b,), 0, c)}


def lm_task(**kw):
    return ComposerCausalLM(GPT(V, seq_len=16, d_model=32, n_layers=1, n_heads=2, rngs=nnx.Rngs(0)), **kw)


def eval_forward(task, batch):
    """Jitted eval forward: one compile is much cheaper than op-by-op eager dispatch on a busy machine."""
    return jax.jit(lambda p, s, b: task.forward(p, s, b, train=False)[0])(task.params, task.state, batch)


def evaluate(task, outputs, batch) -> dict[str, float]:
    """The task's metrics over one batch, as the Trainer's eval step and host sum compute them."""
    metrics = task.get_metrics()
    preds, target = task.metric_inputs(outputs, batch)
    return compute_all(metrics, sum_states([batch_states(metrics, preds, target, jnp.ones(len(target)))]))


def test_classifier_num_classes():
    mlp = MLP(4, hidden=(8,), num_classes=7, rngs=nnx.Rngs(0))
    assert ComposerClassifier(mlp).num_classes == 7
    assert ComposerClassifier(mlp, num_classes=3).num_classes == 3
    pure = ComposerClassifier(mlp).pure
    assert ComposerClassifier(PureModel(pure.apply, pure.params, pure.state)).num_classes is None


def test_classifier_soft_equals_hard_and_metrics(key):
    task = ComposerClassifier(MLP(64, hidden=(16,), rngs=nnx.Rngs(0)))
    batch = classifier_batch(key)
    logits = eval_forward(task, batch)
    soft = {**batch, "target": jax.nn.one_hot(batch["target"], 10)}
    hard_loss, soft_loss = task.loss(logits, batch), task.loss(logits, soft)
    assert hard_loss.shape == (8,)
    np.testing.assert_allclose(hard_loss, soft_loss, rtol=1e-6, atol=1e-6)
    m_hard, m_soft = evaluate(task, logits, batch), evaluate(task, logits, soft)
    assert list(m_hard) == ["CrossEntropy", "MulticlassAccuracy"]  # Composer's ComposerClassifier defaults
    expected_acc = float((jnp.argmax(logits, -1) == batch["target"]).mean())
    for m in (m_hard, m_soft):
        assert m["MulticlassAccuracy"] == pytest.approx(expected_acc)
        assert m["CrossEntropy"] == pytest.approx(float(hard_loss.mean()), rel=1e-6)
    # Smoothed targets: accuracy still against the argmax class.
    smooth = {**batch, "target": 0.9 * soft["target"] + 0.01}
    assert evaluate(task, logits, smooth)["MulticlassAccuracy"] == pytest.approx(expected_acc)
    custom = ComposerClassifier(task.pure, val_metrics={"ce": CrossEntropy()})
    assert evaluate(custom, logits, batch) == {"ce": pytest.approx(m_hard["CrossEntropy"])}
    with pytest.raises(TypeError, match="not a jaxcomposer metric"):
        ComposerClassifier(task.pure, val_metrics=[lambda x, y: x])


def test_classifier_custom_loss_fn(key):
    task = ComposerClassifier(MLP(64, hidden=(16,), rngs=nnx.Rngs(0)), loss_fn=lambda x, y: jnp.zeros(x.shape[0]))
    batch = classifier_batch(key)
    logits = eval_forward(task, batch)
    np.testing.assert_array_equal(task.loss(logits, batch), 0.0)
    assert evaluate(task, logits, batch)["CrossEntropy"] > 0  # metrics report plain cross-entropy


def test_lm_forward_loss_and_ignore_index(key):
    task = lm_task()
    ids = jax.random.randint(key, (2, 9), 0, V)
    batch = {"input_ids": ids}
    logits = eval_forward(task, batch)
    assert logits.shape == (2, 8, V) and task.num_tokens(batch) == 16 and task.num_samples(batch) == 2
    logp = jax.nn.log_softmax(logits)
    ce = -jnp.take_along_axis(logp, ids[:, 1:, None], axis=-1)[..., 0]  # (2, 8)
    np.testing.assert_allclose(task.loss(logits, batch), ce.mean(-1), rtol=1e-5)
    # Labels override the shifted ids; ignored positions drop out of the per-sequence mean.
    labels = ids[:, 1:].at[0, :3].set(-100).at[1, :].set(-100)
    loss = task.loss(logits, {**batch, "labels": labels})
    np.testing.assert_allclose(loss, [ce[0, 3:].mean(), 0.0], rtol=1e-5)
    garbage = logits.at[0, :3].set(1e3)
    np.testing.assert_allclose(task.loss(garbage, {**batch, "labels": labels}), loss, rtol=1e-5)
    # Metrics are per token: 5 tokens of sequence 0 and 2 of sequence 1 each count once.
    labels2 = ids[:, 1:].at[0, :3].set(-100).at[1, :6].set(-100)
    m = evaluate(task, logits, {**batch, "labels": labels2})
    assert list(m) == ["LanguageCrossEntropy", "LanguagePerplexity", "MaskedAccuracy"]
    per_token = float(jnp.concatenate([ce[0, 3:], ce[1, 6:]]).mean())
    assert m["LanguageCrossEntropy"] == pytest.approx(per_token, rel=1e-5)
    assert per_token != pytest.approx(float(task.loss(logits, {**batch, "labels": labels2}).mean()), rel=1e-3)
    assert m["LanguagePerplexity"] == pytest.approx(math.exp(per_token), rel=1e-5)
    hits = jnp.argmax(logits, -1) == ids[:, 1:]
    assert m["MaskedAccuracy"] == pytest.approx(float(jnp.concatenate([hits[0, 3:], hits[1, 6:]]).mean()))
    custom = ComposerCausalLM(task.pure, ignore_index=0)
    zero_labels = jnp.where(labels == -100, 0, labels)
    np.testing.assert_allclose(custom.loss(logits, {**batch, "labels": zero_labels}), loss, rtol=1e-5)
    with pytest.raises(ValueError, match="do not match logits"):
        task.loss(logits, {**batch, "labels": ids})


def _grad_fn(task):
    def loss(params, state, batch, key):
        outputs, new_state = task.forward(params, state, batch, train=True, key=key)
        return task.loss(outputs, batch).mean(), new_state
    return jax.jit(jax.grad(loss, has_aux=True))


def test_pure_forward_is_jittable_and_differentiable(key):
    """The ResNet (BatchNorm state) path is exercised by the fit test below, which jits the same grad."""
    task = ComposerClassifier(MLP(64, hidden=(16,), dropout=0.5, rngs=nnx.Rngs(0)))
    grad_fn, batch = _grad_fn(task), classifier_batch(key)
    grads, new_state = grad_fn(task.params, task.state, batch, key)
    assert jax.tree_util.tree_structure(grads) == jax.tree_util.tree_structure(task.params)
    assert all(bool(jnp.isfinite(g).all()) for g in jax.tree_util.tree_leaves(grads))
    assert float(jnp.abs(grads["head"]["kernel"][...]).sum()) > 0
    other = grad_fn(task.params, task.state, batch, jax.random.key(7))[0]
    assert not np.allclose(grads["head"]["kernel"][...], other["head"]["kernel"][...])  # dropout follows the key
    lm = ComposerCausalLM(GPT(V, seq_len=16, d_model=32, n_layers=1, n_heads=2, dropout=0.1, rngs=nnx.Rngs(0)))
    grads, _ = _grad_fn(lm)(lm.params, lm.state, {"input_ids": jax.random.randint(key, (2, 9), 0, V)}, key)
    assert float(jnp.abs(grads["wte"]["embedding"][...]).sum()) > 0


def _fit(task, batch, key, steps=30, lr=3e-3):
    """30 Adam steps on one fixed batch; returns (initial loss, final loss) in eval mode and the final state."""
    opt = optax.adam(lr)
    grad_fn = _grad_fn(task)

    @jax.jit
    def step(params, state, opt_state, k):
        grads, state = grad_fn(params, state, batch, k)
        updates, opt_state = opt.update(grads, opt_state, params)
        return optax.apply_updates(params, updates), state, opt_state

    eval_loss = jax.jit(lambda p, s: task.loss(task.forward(p, s, batch, train=False)[0], batch).mean())
    params, state = task.params, task.state
    opt_state, start = opt.init(params), float(eval_loss(params, state))
    for k in jax.random.split(key, steps):
        params, state, opt_state = step(params, state, opt_state, k)
    return start, float(eval_loss(params, state)), state


@pytest.mark.parametrize("name", ["mlp", "resnet"])
def test_classifier_fits_a_fixed_batch(key, name):
    module = (MLP(64, hidden=(32,), dropout=0.1, rngs=nnx.Rngs(0)) if name == "mlp"
              else ResNetCIFAR(8, 8, in_channels=1, rngs=nnx.Rngs(0)))
    task = ComposerClassifier(module)
    start, end, state = _fit(task, classifier_batch(key, b=16), key)
    assert end < 0.5 * start, (start, end)
    assert jax.tree_util.tree_structure(state) == jax.tree_util.tree_structure(task.state)
    if name == "resnet":  # BatchNorm statistics moved away from their (0, 1) init
        assert float(jnp.abs(state["stem_bn"]["mean"][...]).max()) > 1e-3


def test_lm_fits_a_fixed_batch(key):
    start, end, _ = _fit(lm_task(), {"input_ids": jax.random.randint(key, (4, 17), 0, V)}, key)
    assert end < start - 1.0, (start, end)
