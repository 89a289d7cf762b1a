"""torch_bridge.optim: a torch optimizer translated to an optax transformation steps as torch's own ``step()`` does.

One settings table drives the parity, LR-multiplier and state round-trip tests: each row is an optimizer with two
param groups of different options; a fifth parameter belongs to no group. Every row's jitted step is compiled once
(the ``compiled`` fixture) and shared by the tests. Parameters must agree with torch within ``TOL`` absolute.
"""
import copy
import math
from typing import Any, NamedTuple

import jax
import numpy as np
import optax
import pytest
import torch

from jaxcomposer.errors import ConfigurationError
from torch_bridge.optim import AdamState, SGDState, state_from_torch, state_to_torch, translate

TOL = 1e-6
STEPS = 5
SHAPES = {"0.weight": (4, 3), "0.bias": (4,), "1.weight": (2, 4), "1.bias": (2,), "2.weight": (3,)}
GROUPS = (("0.weight", "0.bias"), ("1.weight", "1.bias"))  # "2.weight" is in no group: torch never touches it
UNGROUPED = "2.weight"



def _fixed_arrays():
    rng = np.random.default_rng(0)
    draw = lambda: {k: rng.standard_normal(s).astype(np.float32) for k, s in SHAPES.items()}  # noqa: E731
    return draw(), [draw() for _ in range(STEPS)]


INIT, GRADS = _fixed_arrays()  # initial parameters, and the fixed gradient of each step


# ------------------------------------------------------------------------------ Composer's optimizers, for parity
# Composer is not installed; these implement its rule (decay ``p *= 1 - (lr / initial_lr) * wd`` before the step,
# not multiplied by lr) so the translation, which recognises them by class name, has a reference to agree with.

class DecoupledSGDW(torch.optim.SGD):
    def __init__(self, params, lr, momentum=0.0, dampening=0.0, weight_decay=0.0, nesterov=False):
        super().__init__(params, lr=lr, momentum=momentum, dampening=dampening, weight_decay=weight_decay,
                         nesterov=nesterov)
        for group in self.param_groups:
            group["initial_lr"] = group["lr"]

    @torch.no_grad()
    def step(self, closure=None):
        for group in self.param_groups:
            lr, wd, momentum = group["lr"], group["weight_decay"], group["momentum"]
            for p in (p for p in group["params"] if p.grad is not None):
                direction, buf = p.grad, None
                if momentum != 0:
                    buf = self.state[p].get("momentum_buffer")
                    if buf is None:
                        buf = p.grad.detach().clone()
                    else:
                        buf.mul_(momentum).add_(p.grad, alpha=1 - group["dampening"])
                    direction = p.grad.add(buf, alpha=momentum) if group["nesterov"] else buf
                self.state[p]["momentum_buffer"] = buf
                if wd != 0:
                    p.mul_(1 - (lr / group["initial_lr"] if group["initial_lr"] else 1.0) * wd)
                p.add_(direction, alpha=-lr)


class DecoupledAdamW(torch.optim.AdamW):
    def __init__(self, params, lr=1e-3, betas=(0.9, 0.95), eps=1e-8, weight_decay=1e-5, amsgrad=False):
        super().__init__(params, lr=lr, betas=betas, eps=eps, weight_decay=weight_decay, amsgrad=amsgrad)
        for group in self.param_groups:
            group["initial_lr"] = group["lr"]

    @torch.no_grad()
    def step(self, closure=None):
        for group in self.param_groups:
            (b1, b2), lr, wd = group["betas"], group["lr"], group["weight_decay"]
            for p in (p for p in group["params"] if p.grad is not None):
                state = self.state[p]
                if "step" not in state:
                    state["step"] = torch.zeros((), dtype=torch.float32, device=p.device)
                    state["exp_avg"], state["exp_avg_sq"] = torch.zeros_like(p), torch.zeros_like(p)
                    if group["amsgrad"]:
                        state["max_exp_avg_sq"] = torch.zeros_like(p)
                state["step"] += 1
                t = state["step"].item()
                if wd != 0:
                    p.mul_(1 - (lr / group["initial_lr"] if group["initial_lr"] else 1.0) * wd)
                m, v = state["exp_avg"], state["exp_avg_sq"]
                m.mul_(b1).add_(p.grad, alpha=1 - b1)
                v.mul_(b2).addcmul_(p.grad, p.grad, value=1 - b2)
                if group["amsgrad"]:
                    v = torch.maximum(state["max_exp_avg_sq"], v, out=state["max_exp_avg_sq"])
                denom = (v.sqrt() / math.sqrt(1 - b2 ** t)).add_(group["eps"])
                p.addcdiv_(m, denom, value=-lr / (1 - b1 ** t))


# ------------------------------------------------------------------------------ the settings table
class Row(NamedTuple):
    id: str
    cls: type
    kwargs: dict
    groups: tuple[dict, dict]  # each group's own options (over the constructor's)


SGD, Adam, AdamW, RMSprop, Adagrad = (torch.optim.SGD, torch.optim.Adam, torch.optim.AdamW, torch.optim.RMSprop,
                                      torch.optim.Adagrad)
ROWS = [
    Row("sgd", SGD, dict(lr=0.1), ({}, {"lr": 0.05})),
    Row("sgd-momentum-dampening", SGD, dict(lr=0.1, momentum=0.9), ({}, {"momentum": 0.5, "dampening": 0.1})),
    Row("sgd-nesterov-wd", SGD, dict(lr=0.1, momentum=0.9, nesterov=True, weight_decay=0.01),
        ({}, {"nesterov": False, "weight_decay": 0.0, "dampening": 0.2})),
    Row("sgd-maximize-foreach", SGD, dict(lr=0.1, momentum=0.9, maximize=True, foreach=True),
        ({}, {"maximize": False, "weight_decay": 0.05})),
    Row("adam", Adam, dict(lr=0.01), ({}, {"betas": (0.8, 0.99), "eps": 1e-6})),
    Row("adam-wd-amsgrad", Adam, dict(lr=0.01, weight_decay=0.1, amsgrad=True),
        ({}, {"amsgrad": False, "weight_decay": 0.0, "lr": 0.03})),
    Row("adam-maximize-fused", Adam, dict(lr=0.01, maximize=True, fused=True), ({}, {"maximize": False})),
    Row("adam-decoupled_weight_decay", Adam, dict(lr=0.01, weight_decay=0.1, decoupled_weight_decay=True),
        ({}, {"decoupled_weight_decay": False})),
    Row("adamw", AdamW, dict(lr=0.01, weight_decay=0.1), ({}, {"weight_decay": 0.5, "amsgrad": True})),
    Row("adamw-maximize", AdamW, dict(lr=0.01, maximize=True), ({}, {"lr": 0.003, "betas": (0.5, 0.9)})),
    Row("rmsprop", RMSprop, dict(lr=0.01), ({}, {"alpha": 0.9, "eps": 1e-6})),
    Row("rmsprop-momentum-centered", RMSprop, dict(lr=0.01, momentum=0.9, centered=True),
        ({}, {"momentum": 0.0, "weight_decay": 0.1})),
    Row("rmsprop-maximize-wd", RMSprop, dict(lr=0.01, maximize=True, weight_decay=0.1),
        ({}, {"centered": True, "maximize": False, "momentum": 0.5})),
    # torch fills every accumulator with the constructor's initial_accumulator_value: a group's own is not read
    Row("adagrad", Adagrad, dict(lr=0.1, initial_accumulator_value=0.1),
        ({}, {"lr_decay": 0.1, "initial_accumulator_value": 0.5})),
    Row("adagrad-wd-maximize", Adagrad, dict(lr=0.1, weight_decay=0.1, maximize=True, eps=1e-6),
        ({"lr_decay": 0.5}, {"weight_decay": 0.0, "maximize": False})),
    Row("decoupled-sgdw", DecoupledSGDW, dict(lr=0.1, momentum=0.9, weight_decay=0.01),
        ({}, {"nesterov": True, "weight_decay": 0.0})),
    Row("decoupled-sgdw-no-momentum", DecoupledSGDW, dict(lr=0.1, weight_decay=1e-3), ({}, {"lr": 0.05})),
    Row("decoupled-adamw", DecoupledAdamW, dict(lr=0.01, weight_decay=0.01),
        ({}, {"amsgrad": True, "betas": (0.9, 0.999), "weight_decay": 0.0})),
]
BY_ID = {row.id: row for row in ROWS}


def torch_params(values=INIT):
    return {k: torch.nn.Parameter(torch.from_numpy(np.array(v, dtype=np.float32))) for k, v in values.items()}


def build(row: Row, named):
    groups = [{"params": [named[k] for k in keys], **opts} for keys, opts in zip(GROUPS, row.groups)]
    return row.cls(groups, **row.kwargs)


def torch_steps(opt, named, grads_list):
    for grads in grads_list:
        for k, p in named.items():
            p.grad = torch.from_numpy(grads[k].copy())
        opt.step()


def jax_params(values=INIT):
    return {k: jax.numpy.asarray(np.asarray(v)) for k, v in values.items()}


def numpy_of(named):
    return {k: p.detach().numpy().copy() for k, p in named.items()}


def compile_step(tx):
    """One jitted step as the Trainer composes it: the translation, then ``optax.scale(alpha)``."""

    @jax.jit
    def step(params, state, grads, alpha):
        updates, (state, _) = optax.chain(tx, optax.scale(alpha)).update(grads, (state, optax.EmptyState()), params)
        return optax.apply_updates(params, updates), state

    return step


def jax_steps(step, params, state, grads_list, alpha=1.0):
    for grads in grads_list:
        params, state = step(params, state, jax_params(grads), alpha)
    return params, state


def max_error(got, want, keys=SHAPES):
    return max(float(np.max(np.abs(np.asarray(got[k]) - np.asarray(want[k])))) for k in keys)


def assert_params(got, want, where):
    err = max_error(got, want)
    assert err <= TOL, f"{where}: max |ours - torch| = {err:.3g} > {TOL:g}"


@pytest.fixture(scope="module")
def compiled():
    """Each row's jitted step, compiled at its first use: the step's math depends on the row's settings, not on
    which optimizer object (or which Parameters) the translation read them from."""
    cache: dict[str, Any] = {}

    def get(row: Row):
        if row.id not in cache:
            named = torch_params()
            cache[row.id] = compile_step(translate(build(row, named), named))
        return cache[row.id]

    return get


# ------------------------------------------------------------------------------ parity
@pytest.mark.parametrize("row", ROWS, ids=[r.id for r in ROWS])
def test_matches_torch_step(row, compiled):
    named = torch_params()
    opt = build(row, named)
    tx = translate(opt, named)
    assert tx.group_keys == GROUPS
    assert tx.lr == tx.group_lrs[0] == row.groups[0].get("lr", row.kwargs["lr"])

    params, _ = jax_steps(compiled(row), jax_params(), tx.init(jax_params()), GRADS)
    torch_steps(opt, named, GRADS)
    assert_params(params, numpy_of(named), row.id)
    np.testing.assert_array_equal(np.asarray(params[UNGROUPED]), INIT[UNGROUPED])
    np.testing.assert_array_equal(named[UNGROUPED].detach().numpy(), INIT[UNGROUPED])


@pytest.mark.parametrize("row", ROWS, ids=[r.id for r in ROWS])
def test_lr_multiplier_is_torch_with_scaled_lr(row, compiled):
    """The Trainer's schedule multiplier alpha on the translation == torch after a scheduler set every group's lr
    to alpha * its base (keeping ``initial_lr``, which the translation reads as the base)."""
    alpha = 0.3
    named = torch_params()
    opt = build(row, named)
    base = [g["lr"] for g in opt.param_groups]
    torch.optim.lr_scheduler.LambdaLR(opt, lambda epoch: alpha)
    assert [g["lr"] for g in opt.param_groups] == pytest.approx([alpha * lr for lr in base])
    tx = translate(opt, named)
    assert tx.group_lrs == tuple(base)

    params, _ = jax_steps(compiled(row), jax_params(), tx.init(jax_params()), GRADS, alpha=alpha)
    torch_steps(opt, named, GRADS)
    assert_params(params, numpy_of(named), f"{row.id} at alpha={alpha}")


def assert_same_torch_state(got, want, where):
    """``got.state_dict()`` laid out as ``want``'s: the same entries in the same order, tensors of the same dtype,
    device and shape; ``initial_lr`` aside (state_to_torch records the base lr), the same param groups."""
    gs, ws = got.state_dict(), want.state_dict()
    assert gs["state"].keys() == ws["state"].keys(), where
    for i, w in ws["state"].items():
        g = gs["state"][i]
        assert list(g) == list(w), f"{where}: param {i} state entries {list(g)} != torch's {list(w)}"
        for name, wt in w.items():
            if wt is None:
                assert g[name] is None, f"{where}: {name}"
                continue
            gt = g[name]
            assert (gt.dtype, gt.device, gt.shape) == (wt.dtype, wt.device, wt.shape), f"{where}: {name}"
            assert gt.stride() == wt.stride(), f"{where}: {name} layout"
            err = float((gt.double() - wt.double()).abs().max())
            assert err <= (0.0 if name == "step" else TOL), f"{where}: param {i} {name} differs by {err:.3g}"
    drop = lambda group: {k: v for k, v in group.items() if k != "initial_lr"}  # noqa: E731
    assert [drop(g) for g in gs["param_groups"]] == [drop(g) for g in ws["param_groups"]], where


@pytest.mark.parametrize("row", ROWS, ids=[r.id for r in ROWS])
def test_state_round_trip(row, compiled):
    """3 steps, then each side continues the other's state for 2: ours -> state_to_torch -> torch's step, and
    torch's step -> state_from_torch -> ours, each equal to the run that did not change sides."""
    step = compiled(row)
    head, tail = GRADS[:3], GRADS[3:]
    ref_named = torch_params()
    ref = build(row, ref_named)
    torch_steps(ref, ref_named, head)

    tx = translate(ref, ref_named)
    params3, state3 = jax_steps(step, jax_params(), tx.init(jax_params()), head)
    params5, _ = jax_steps(step, params3, state3, tail)

    # ours -> torch: the written state is torch's own after the same steps, and torch continues our run
    named = torch_params({k: np.asarray(v) for k, v in params3.items()})
    opt = build(row, named)
    state_to_torch(opt, named, state3, lr_multiplier=1.0)
    assert_same_torch_state(opt, ref, f"{row.id} state_to_torch")
    torch_steps(opt, named, tail)
    assert_params(numpy_of(named), params5, f"{row.id} ours x3 -> torch x2")

    # torch -> ours: our run continues torch's
    ref_params3 = {k: jax.numpy.asarray(v) for k, v in numpy_of(ref_named).items()}
    state = state_from_torch(ref, ref_named, tx.init(ref_params3))
    got, _ = jax_steps(step, ref_params3, state, tail)
    torch_steps(ref, ref_named, tail)
    assert_params(got, numpy_of(ref_named), f"{row.id} torch x3 -> ours x2")


def test_state_from_torch_without_torch_state_is_unchanged():
    named = torch_params()
    opt = torch.optim.Adam(named.values(), lr=0.01, amsgrad=True)
    tx = translate(opt, named)
    fresh = tx.init(jax_params())
    assert isinstance(fresh, AdamState)
    assert jax.tree.all(jax.tree.map(lambda a, b: bool((a == b).all()), state_from_torch(opt, named, fresh), fresh))


def test_state_to_torch_sets_lr_and_initial_lr():
    """The group's lr becomes base * multiplier and ``initial_lr`` the base, so translating the optimizer again
    reads the base lr, not the scheduled one."""
    named = torch_params()
    opt = torch.optim.SGD([{"params": [named[k] for k in GROUPS[0]]},
                           {"params": [named[k] for k in GROUPS[1]], "lr": 0.05}], lr=0.1, momentum=0.9)
    tx = translate(opt, named)
    state_to_torch(opt, named, tx.init(jax_params()), lr_multiplier=0.25)
    assert [g["lr"] for g in opt.param_groups] == pytest.approx([0.025, 0.0125])
    assert [g["initial_lr"] for g in opt.param_groups] == [0.1, 0.05]
    assert not opt.state  # nothing stepped: torch would hold no state yet
    assert translate(opt, named).group_lrs == (0.1, 0.05)


# ------------------------------------------------------------------------------ zero lr, frozen parameters
@pytest.mark.parametrize("make", [
    lambda ps: torch.optim.SGD(ps, lr=0.0, momentum=0.9, weight_decay=0.1),
    lambda ps: torch.optim.AdamW(ps, lr=0.0, weight_decay=0.1, amsgrad=True),
    lambda ps: torch.optim.RMSprop(ps, lr=0.0, momentum=0.9, centered=True, weight_decay=0.1),
    lambda ps: torch.optim.Adagrad(ps, lr=0.0, lr_decay=0.1, weight_decay=0.1),
], ids=["sgd", "adamw", "rmsprop", "adagrad"])
def test_zero_lr_leaves_params_unchanged(make):
    named = torch_params()
    tx = translate(make([named[k] for keys in GROUPS for k in keys]), named)
    params, state = jax_steps(jax.jit(lambda p, s, g, a: step_once(tx, p, s, g)), jax_params(), tx.init(jax_params()),
                              GRADS[:2])
    for k in SHAPES:
        np.testing.assert_array_equal(np.asarray(params[k]), INIT[k], err_msg=k)
    assert all(float(t) == 2.0 for t in state.step.values())  # the state still steps, as torch's does


def step_once(tx, params, state, grads):
    updates, state = tx.update(grads, state, params)
    return optax.apply_updates(params, updates), state


def test_frozen_parameter_in_a_group_is_left_alone():
    """torch never gives a ``requires_grad=False`` parameter a gradient, so its optimizer skips it."""
    named = torch_params()
    named["0.bias"].requires_grad_(False)
    opt = torch.optim.SGD([named[k] for keys in GROUPS for k in keys], lr=0.1, momentum=0.9, weight_decay=0.1)
    tx = translate(opt, named)
    assert tx.group_keys == (("0.weight", "1.weight", "1.bias"),)
    state = tx.init(jax_params())
    assert isinstance(state, SGDState) and "0.bias" not in state.momentum_buffer
    params, state = jax_steps(jax.jit(lambda p, s, g, a: step_once(tx, p, s, g)), jax_params(), state, GRADS[:2])
    np.testing.assert_array_equal(np.asarray(params["0.bias"]), INIT["0.bias"])
    state_to_torch(opt, named, state)
    assert named["0.bias"] not in opt.state and len(opt.state) == 3


# ------------------------------------------------------------------------------ refusals
class StepOverridden(torch.optim.SGD):
    def step(self, closure=None):
        return super().step(closure)


class Inherited(torch.optim.Adam):
    """A subclass that keeps Adam's step: translated as Adam."""


def test_subclass_keeping_step_is_translated():
    named = torch_params()
    tx = translate(Inherited(named.values(), lr=0.01), named)
    assert tx.name == "Inherited (a torch.optim.Adam)"


@pytest.mark.parametrize("make, expected", [
    (lambda ps: torch.optim.Adamax(ps.values()), ["Adamax", "no translation", "Supported"]),
    (lambda ps: StepOverridden(ps.values(), lr=0.1), ["StepOverridden (a torch.optim.SGD)", "step()"]),
    (lambda ps: DecoupledAdamW([{"params": [ps["0.weight"]]}, {"params": [ps["0.bias"]], "maximize": True}]),
     ["DecoupledAdamW", "param group 1", "maximize"]),
    (lambda ps: torch.optim.Adam([ps["0.weight"], ps["c"]]), ["torch.optim.Adam", "param group 0", "'c'", "complex"]),
    (lambda ps: torch.optim.SGD([{"params": [ps["0.weight"]]}, {"params": [ps["s"]]}], lr=0.1),
     ["torch.optim.SGD", "param group 1", "'s'", "sparse"]),
], ids=["class", "overridden-step", "composer-maximize", "complex", "sparse"])
def test_refusals_name_class_group_and_option(make, expected):
    named = torch_params()
    named["c"] = torch.nn.Parameter(torch.zeros(2, dtype=torch.complex64))
    named["s"] = torch.nn.Parameter(torch.zeros(2, 2).to_sparse())
    with pytest.raises(ConfigurationError) as info:
        translate(make(named), named)
    for text in expected:
        assert text in str(info.value)


def test_optimizer_on_foreign_parameters_is_refused():
    model = torch.nn.Linear(3, 2)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    copied = copy.deepcopy(model)  # the Trainer's model, built after the optimizer
    with pytest.raises(ConfigurationError, match="not one of the model's parameters") as info:
        translate(opt, dict(copied.named_parameters()))
    assert "deepcopy" in str(info.value) and "param group 0" in str(info.value)
