"""DecoupledSGDW / DecoupledAdamW reproduce Composer's documented decoupled updates under a schedule alpha(t)."""
import functools
import warnings

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from jaxcomposer.optim import DecoupledAdamW, DecoupledSGDW, LinearWithWarmupScheduler

STEPS = 5
P0 = np.array([[0.5, -1.0, 2.0], [0.1, 0.0, -0.3]], np.float32)
B0 = np.array([0.7, -0.2], np.float32)


def alpha_np(step):
    """The schedule applied by the trainer; nonzero at step 0 so the first update is visible."""
    return 1.0 - 0.15 * step


def alpha_jnp(step):
    return 1.0 - 0.15 * jnp.asarray(step).astype(jnp.float32)


def grad_at(step, p):
    """Deterministic gradients that depend on the params, so the trajectories must agree to agree here."""
    return np.sin(p * (step + 1.0)).astype(np.float32) + 0.1 * step


@functools.lru_cache(maxsize=None)
def run_case(kind, items):
    """JAX trajectory for one optimizer config, cached: the numpy and torch comparisons share it (compiles are the
    slow part)."""
    make = {"sgdw": DecoupledSGDW, "adamw": DecoupledAdamW}[kind]
    return run_jax(make(**dict(items)))


def run_jax(tx, steps=STEPS, schedule=alpha_jnp):
    tx = optax.chain(tx, optax.scale_by_schedule(schedule))
    params = {"w": jnp.asarray(P0), "b": jnp.asarray(B0)}
    state = tx.init(params)

    @jax.jit
    def step(params, state, grads):
        updates, state = tx.update(grads, state, params)
        return optax.apply_updates(params, updates), state

    for t in range(steps):
        grads = jax.tree.map(lambda p: jnp.asarray(grad_at(t, np.asarray(p))), params)
        params, state = step(params, state, grads)
    return {k: np.asarray(v) for k, v in params.items()}


def sgdw_reference(lr, momentum, dampening, wd, nesterov):
    """Composer's DecoupledSGDW step, written out like torch: decay p *= 1 - (lr_t/lr)*wd, then p -= lr_t * dir."""
    out = {}
    for name, p in (("w", P0.astype(np.float64)), ("b", B0.astype(np.float64))):
        buf = None
        for t in range(STEPS):
            g = grad_at(t, p.astype(np.float32)).astype(np.float64)
            lr_t = lr * alpha_np(t)
            if momentum != 0:
                buf = g.copy() if buf is None else momentum * buf + (1 - dampening) * g
                d = g + momentum * buf if nesterov else buf
            else:
                d = g
            p = p * (1 - (lr_t / lr) * wd)
            p = p - lr_t * d
        out[name] = p
    return out


def adamw_reference(lr, betas, eps, wd, amsgrad):
    b1, b2 = betas
    out = {}
    for name, p in (("w", P0.astype(np.float64)), ("b", B0.astype(np.float64))):
        m = np.zeros_like(p)
        v = np.zeros_like(p)
        v_max = np.zeros_like(p)
        for t in range(STEPS):
            g = grad_at(t, p.astype(np.float32)).astype(np.float64)
            lr_t = lr * alpha_np(t)
            p = p * (1 - (lr_t / lr) * wd)
            k = t + 1
            m = b1 * m + (1 - b1) * g
            v = b2 * v + (1 - b2) * g * g
            v_max = np.maximum(v_max, v)
            second = v_max if amsgrad else v
            denom = np.sqrt(second) / np.sqrt(1 - b2**k) + eps
            p = p - (lr_t / (1 - b1**k)) * m / denom
        out[name] = p
    return out


SGD_CASES = [
    dict(lr=0.1, momentum=0.0, dampening=0.0, weight_decay=0.0, nesterov=False),
    dict(lr=0.1, momentum=0.9, dampening=0.0, weight_decay=5e-4, nesterov=False),
    dict(lr=0.05, momentum=0.9, dampening=0.1, weight_decay=5e-4, nesterov=False),
    dict(lr=0.05, momentum=0.8, dampening=0.0, weight_decay=5e-4, nesterov=True),
    dict(lr=0.2, momentum=0.0, dampening=0.0, weight_decay=1e-4, nesterov=False),
]


@pytest.mark.parametrize("kw", SGD_CASES)
def test_sgdw_matches_reference(kw):
    got = run_case("sgdw", tuple(kw.items()))
    want = sgdw_reference(kw["lr"], kw["momentum"], kw["dampening"], kw["weight_decay"], kw["nesterov"])
    for k in want:
        np.testing.assert_allclose(got[k], want[k], rtol=1e-6, atol=1e-6)


ADAM_CASES = [
    dict(lr=1e-2, betas=(0.9, 0.95), eps=1e-8, weight_decay=1e-5, amsgrad=False),
    dict(lr=3e-2, betas=(0.8, 0.99), eps=1e-6, weight_decay=1e-2, amsgrad=False),
    dict(lr=3e-2, betas=(0.9, 0.999), eps=1e-8, weight_decay=1e-3, amsgrad=True),
]


@pytest.mark.parametrize("kw", ADAM_CASES)
def test_adamw_matches_reference(kw):
    got = run_case("adamw", tuple(kw.items()))
    want = adamw_reference(kw["lr"], kw["betas"], kw["eps"], kw["weight_decay"], kw["amsgrad"])
    for k in want:
        np.testing.assert_allclose(got[k], want[k], rtol=1e-6, atol=1e-6)


def _torch_run(make_opt, lr, wd, decay_before_step):
    """Drive a real torch optimizer with a LambdaLR schedule, adding Composer's decay by hand (torch's own decay
    is coupled to lr, which is exactly what Composer avoids)."""
    torch = pytest.importorskip("torch")
    params = [torch.nn.Parameter(torch.tensor(P0, dtype=torch.float64)),
              torch.nn.Parameter(torch.tensor(B0, dtype=torch.float64))]
    opt = make_opt(params)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, alpha_np)
    for t in range(STEPS):
        for p in params:
            p.grad = torch.tensor(grad_at(t, p.detach().numpy().astype(np.float32)), dtype=torch.float64)
        lr_t = opt.param_groups[0]["lr"]
        if decay_before_step:
            with torch.no_grad():
                for p in params:
                    p.mul_(1 - (lr_t / lr) * wd)
        opt.step()
        sched.step()
    return {"w": params[0].detach().numpy(), "b": params[1].detach().numpy()}


@pytest.mark.parametrize("kw", SGD_CASES[1:4])
def test_sgdw_matches_torch_sgd(kw):
    torch = pytest.importorskip("torch")
    # torch applies momentum to the already-decayed param's gradient only; decay here never enters the gradient.
    want = _torch_run(
        lambda ps: torch.optim.SGD(ps, lr=kw["lr"], momentum=kw["momentum"], dampening=kw["dampening"],
                                   nesterov=kw["nesterov"], weight_decay=0.0),
        kw["lr"], kw["weight_decay"], decay_before_step=True,
    )
    got = run_case("sgdw", tuple(kw.items()))
    for k in want:
        np.testing.assert_allclose(got[k], want[k], rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize("kw", ADAM_CASES)
def test_adamw_matches_torch_adam(kw):
    torch = pytest.importorskip("torch")
    want = _torch_run(
        lambda ps: torch.optim.Adam(ps, lr=kw["lr"], betas=kw["betas"], eps=kw["eps"], weight_decay=0.0,
                                    amsgrad=kw["amsgrad"]),
        kw["lr"], kw["weight_decay"], decay_before_step=True,
    )
    got = run_case("adamw", tuple(kw.items()))
    for k in want:
        np.testing.assert_allclose(got[k], want[k], rtol=1e-6, atol=1e-6)


def test_decay_follows_schedule_not_lr():
    """With zero gradients only the decay acts: p_T = p_0 * prod(1 - alpha_t * wd), independent of lr."""
    wd = 1e-2
    for lr in (1e-1, 1e-4):
        tx = optax.chain(DecoupledAdamW(lr, weight_decay=wd), optax.scale_by_schedule(alpha_jnp))

        @jax.jit
        def three_steps(p):
            state = tx.init(p)
            for _ in range(3):
                u, state = tx.update(jnp.zeros_like(p), state, p)
                p = optax.apply_updates(p, u)
            return p

        p = three_steps(jnp.asarray(P0))
        want = P0 * np.prod([1 - alpha_np(t) * wd for t in range(3)])
        np.testing.assert_allclose(np.asarray(p), want, rtol=1e-6)


def test_with_repo_scheduler_under_jit():
    sched = LinearWithWarmupScheduler("2ba").schedule(max_batches=STEPS, steps_per_epoch=None)
    got = run_jax(DecoupledSGDW(0.1, momentum=0.9, weight_decay=1e-4), schedule=sched)
    assert all(np.isfinite(v).all() for v in got.values())
    # step 0 has alpha 0 under warmup: the first update must be a no-op, so one step leaves params unchanged.
    one = run_jax(DecoupledSGDW(0.1, momentum=0.9, weight_decay=1e-4), steps=1, schedule=sched)
    np.testing.assert_array_equal(one["w"], P0)


def test_is_named_tuple_with_lr_and_keeps_dtype():
    tx = DecoupledAdamW(lr=2e-3)
    assert isinstance(tx, tuple) and tx._fields == ("init", "update", "lr") and tx.lr == 2e-3
    assert DecoupledSGDW(0.5).lr == 0.5
    p = {"x": jnp.ones(3, jnp.bfloat16)}
    u, _ = tx.update(p, tx.init(p), p)
    assert u["x"].dtype == jnp.bfloat16
    with pytest.raises(ValueError, match="params"):
        tx.update(p, tx.init(p))


def test_sgdw_warns_when_weight_decay_is_large():
    with pytest.warns(UserWarning, match="NOT multiplied by lr"):
        DecoupledSGDW(0.1, weight_decay=1e-3)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        DecoupledSGDW(0.1, weight_decay=1e-5)


@pytest.mark.parametrize(
    "make, name",
    [
        (lambda: DecoupledSGDW(0.0), "lr"),
        (lambda: DecoupledSGDW(0.1, momentum=-0.1), "momentum"),
        (lambda: DecoupledSGDW(0.1, weight_decay=-1.0), "weight_decay"),
        (lambda: DecoupledSGDW(0.1, nesterov=True), "nesterov"),
        (lambda: DecoupledAdamW(lr=-1.0), "lr"),
        (lambda: DecoupledAdamW(betas=(1.0, 0.9)), "betas"),
        (lambda: DecoupledAdamW(betas=(0.9, -0.1)), "betas"),
        (lambda: DecoupledAdamW(eps=-1e-8), "eps"),
        (lambda: DecoupledAdamW(weight_decay=-1e-5), "weight_decay"),
    ],
)
def test_invalid_arguments(make, name):
    with pytest.raises(ValueError, match=name):
        make()


def test_composer_call_with_torch_params():
    """Composer's ``DecoupledSGDW(model.parameters(), lr=...)`` works unchanged: the Trainer owns the parameters."""
    torch = pytest.importorskip("torch")
    model = torch.nn.Linear(3, 2)
    assert DecoupledSGDW(model.parameters(), lr=0.2, momentum=0.9).lr == 0.2
    assert DecoupledAdamW(model.parameters()).lr == 1e-3
    assert DecoupledSGDW([{"params": list(model.parameters())}], lr=0.3).lr == 0.3
    with pytest.raises(ValueError, match="param group 0 sets \\['lr'\\]"):
        DecoupledSGDW([{"params": list(model.parameters()), "lr": 0.1}], lr=0.3)
    with pytest.raises(TypeError, match="lr is required"):
        DecoupledSGDW(model.parameters())
    with pytest.raises(TypeError, match="learning rate twice"):
        DecoupledSGDW(0.1, lr=0.2)
