"""A user's torch optimizer as an optax transformation with torch's own update rule, and its state both ways.

Composer users write ``optimizers=torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)``. :func:`translate`
reads that optimizer's class and param groups and returns a :class:`TorchOptimizer`, an optax-style
``GradientTransformation`` over the bridged model's flat params dict (``{state_dict name: array}``) that computes,
per param group with the group's own options, what the optimizer's ``step()`` computes: the formulas and their
order of operations are those of torch's single-tensor code (``_single_tensor_sgd``, ``_single_tensor_adam``, ...),
so in float32 the result agrees with torch to float32 rounding. :func:`state_from_torch` seeds the state from the
optimizer's ``state`` (a resumed torch checkpoint, an optimizer that already stepped) and :func:`state_to_torch`
writes the run's state back into the optimizer in torch's own layout, so after training the torch optimizer holds
the run's state and can continue in torch.

The LR schedule. The Trainer applies the schedule as a final ``optax.scale(alpha_t)`` with
``alpha_t = lr_t / base lr``, so the update emitted here is the one at alpha = 1, ``-lr_g * (...)`` with each group's
base lr (its ``initial_lr`` when a torch LR scheduler or Composer set one, else its ``lr``). That is torch's step
with a scheduled lr because every supported rule is linear in the lr given the state (the state's own updates never
read the lr): SGD, Adam and RMSprop multiply their direction by lr; AdamW's ``p *= 1 - lr * wd`` is the update
``-lr * wd * p``; Adagrad's ``clr = lr / (1 + (step - 1) * lr_decay)`` divides the lr by a factor of the step alone,
so torch with ``lr = alpha * base`` steps by ``alpha * clr`` (``lr_decay`` is supported); Composer's decoupled
optimizers decay by ``(lr_t / initial_lr) * wd = alpha_t * wd``, the update ``-wd * p`` at alpha = 1. ``lr=0`` is a
zero update. As in torch, a parameter of the model in no param group, or with ``requires_grad=False`` (torch never
gives it a gradient), is left alone: zero update, no state.

What differs from torch, all of it documented here rather than refused:

- torch skips a parameter whose ``.grad`` is None (the loss did not use it); JAX gives it a zero gradient, so weight
  decay and momentum still move it.
- torch computes Adam's bias corrections and Adagrad's ``clr`` in Python double on the host; inside the jitted step
  they are float32 (``1 - beta**t`` as ``-expm1(t * log(beta))``, which keeps float32's precision near t = 1 where
  a float32 ``1 - 0.999**t`` keeps about four digits). The difference is float32 rounding of the step size.
- at alpha != 1 torch rounds ``1 - alpha * lr * wd`` (AdamW) once; here the alpha = 1 decay is rounded and then
  scaled: again float32 rounding.
- Composer with ``initial_lr == 0`` decays by ``wd`` whatever the schedule (its ``decay_factor`` falls back to 1);
  here the decay follows the schedule's alpha_t as for any other lr.
- in other dtypes than float32 the same formulas run in the parameter's dtype (torch upcasts inside some kernels).

``foreach``, ``fused``, ``capturable`` and ``differentiable`` are accepted and ignored: they pick which of torch's
kernels runs, not the math (their only trace here is where :func:`state_to_torch` puts ``step``, as torch does).
"""
from __future__ import annotations

import inspect
import math
from typing import Any, Callable, Mapping, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
import torch

from jaxcomposer.errors import ConfigurationError

__all__ = ["TorchOptimizer", "SGDState", "AdamState", "RMSpropState", "AdagradState", "SUPPORTED", "translate",
           "state_from_torch", "state_to_torch"]


class TorchOptimizer(NamedTuple):
    """An optax ``GradientTransformation`` (``init``, ``update``) translated from a torch optimizer.

    ``update(grads, state, params)`` takes and returns dicts keyed like the model's flat params; ``params`` is needed
    when a group decays weights. ``lr`` is group 0's base lr, what the Trainer logs as ``lr * alpha``."""

    init: Callable[[Any], Any]
    update: Callable[..., tuple[Any, Any]]
    lr: float
    name: str  # the optimizer's class as messages name it: "torch.optim.AdamW", "DecoupledAdamW"
    group_lrs: tuple[float, ...]  # each param group's base lr (``initial_lr`` if set, else ``lr``)
    group_keys: tuple[tuple[str, ...], ...]  # each group's params keys in the group's order, frozen ones left out


# Each state holds, per parameter key, torch's ``state[p]`` entries under torch's names, fields in the order torch
# creates them (so a written-back ``state_dict()`` lists them as torch's does). A buffer dict holds only the keys
# whose group keeps that buffer (amsgrad's maximum only for amsgrad groups): a dict over every key is laid out as
# the parameters are (sharded with them under FSDP), a subset is replicated.

class SGDState(NamedTuple):
    step: dict  # steps taken here; torch's SGD keeps none, only "0 = no momentum buffer yet" is read
    momentum_buffer: dict


class AdamState(NamedTuple):
    step: dict  # float32 scalars, torch's ``step``
    exp_avg: dict
    exp_avg_sq: dict
    max_exp_avg_sq: dict


class RMSpropState(NamedTuple):
    step: dict
    square_avg: dict
    momentum_buffer: dict
    grad_avg: dict


class AdagradState(NamedTuple):
    step: dict
    sum: dict


# ------------------------------------------------------------------------------------------------ the rules
# One function per family: ``(h, g, p, first, t, bufs) -> (update at alpha = 1, new bufs)`` for one parameter, with
# ``h`` the group's options, ``first`` whether this parameter steps for the first time, ``t`` its step count after
# this step. Python floats enter the arrays' dtype as torch casts its scalar arguments into the kernel's; products
# are written in torch's kernels' order (``addcmul``: ``self + (value * t1) * t2``; ``addcdiv``:
# ``self + (value * t1) / t2``) because float32 products do not associate.

def _lerp(start, end, weight: float):
    # torch's lerp: one of two formulas, picked by the weight, each accurate at its own end
    w = np.float32(weight)
    if abs(w) < 0.5:
        return start + float(w) * (end - start)
    return end + float(w - np.float32(1.0)) * (end - start)


def _one_minus_pow(beta: float, t):
    # torch: 1 - beta ** step, in double; -expm1 keeps float32's digits where beta ** t is near 1
    if beta == 0.0:
        return jnp.ones_like(t)
    return -jnp.expm1(t * math.log(beta))


def _decay(p, factor: float):
    # torch multiplies the parameter in place (``p.mul_(factor)``, factor rounded to float32); as an update that is
    # ``round(p * factor) - p``, exact in float32, where ``-(1 - factor) * p`` would round differently
    return p * factor - p


def _signed(h, g):
    return -g if h["maximize"] else g


def _sgd_rule(h, g, p, first, t, bufs):
    d = _signed(h, g)
    wd = h["weight_decay"]
    if wd != 0 and not h["composer"]:
        d = d + wd * p
    new = {}
    if h["momentum"] != 0:
        old = bufs["momentum_buffer"]
        # torch's buffer starts as a copy of the first gradient, not as zeros
        buf = jax.lax.select(first, d.astype(old.dtype),
                             (old * h["momentum"] + (1 - h["dampening"]) * d).astype(old.dtype))
        new["momentum_buffer"] = buf
        d = d + h["momentum"] * buf if h["nesterov"] else buf
    update = -h["lr"] * d
    if wd != 0 and h["composer"]:
        update = update + _decay(p, 1 - wd)
    return update, new


def _adam_rule(h, g, p, first, t, bufs):
    d = _signed(h, g)
    wd, b1, b2 = h["weight_decay"], h["beta1"], h["beta2"]
    decay = None
    if wd != 0:
        if h["composer"]:
            decay = _decay(p, 1 - wd)
        elif h["decoupled_weight_decay"]:
            decay = _decay(p, 1 - h["lr"] * wd)
        else:
            d = d + wd * p
    if h["composer"]:
        m = bufs["exp_avg"] * b1 + (1 - b1) * d
    else:
        m = _lerp(bufs["exp_avg"], d, 1 - b1)
    v = bufs["exp_avg_sq"] * b2 + (1 - b2) * d * d
    new = {"exp_avg": m, "exp_avg_sq": v}
    second = v
    if h["amsgrad"]:
        second = new["max_exp_avg_sq"] = jnp.maximum(bufs["max_exp_avg_sq"], v)
    step_size = h["lr"] / _one_minus_pow(b1, t)
    denom = jnp.sqrt(second) / jnp.sqrt(_one_minus_pow(b2, t)) + h["eps"]
    update = (-step_size * m) / denom
    if decay is not None:
        update = update + decay
    return update, new


def _rmsprop_rule(h, g, p, first, t, bufs):
    d = _signed(h, g)
    if h["weight_decay"] != 0:
        d = d + h["weight_decay"] * p
    a = h["alpha"]
    sq = bufs["square_avg"] * a + (1 - a) * d * d
    new = {"square_avg": sq}
    if h["centered"]:
        ga = new["grad_avg"] = _lerp(bufs["grad_avg"], d, 1 - a)
        avg = jnp.sqrt(sq - ga * ga)
    else:
        avg = jnp.sqrt(sq)
    avg = avg + h["eps"]
    if h["momentum"] > 0:
        buf = new["momentum_buffer"] = bufs["momentum_buffer"] * h["momentum"] + d / avg
        return -h["lr"] * buf, new
    return (-h["lr"] * d) / avg, new


def _adagrad_rule(h, g, p, first, t, bufs):
    d = _signed(h, g)
    if h["weight_decay"] != 0:
        d = d + h["weight_decay"] * p
    clr = h["lr"] if h["lr_decay"] == 0 else h["lr"] / (1 + (t - 1) * h["lr_decay"])
    s = bufs["sum"] + d * d
    return (-clr * d) / (jnp.sqrt(s) + h["eps"]), {"sum": s}


class _Family(NamedTuple):
    state: type
    rule: Callable
    options: tuple[tuple[str, Any], ...]  # the options the rule reads, with torch's default for a group lacking one
    buffers: Callable[[dict], tuple[str, ...]]  # the state entries torch keeps for a group with these options
    torch_step: bool  # whether torch's state has ``step``


_SGD = _Family(SGDState, _sgd_rule,
               (("momentum", 0.0), ("dampening", 0.0), ("weight_decay", 0.0), ("nesterov", False),
                ("maximize", False)),
               lambda h: ("momentum_buffer",) if h["momentum"] != 0 else (), torch_step=False)
_ADAM = _Family(AdamState, _adam_rule,
                (("betas", (0.9, 0.999)), ("eps", 1e-8), ("weight_decay", 0.0), ("amsgrad", False),
                 ("maximize", False), ("decoupled_weight_decay", False)),
                lambda h: ("exp_avg", "exp_avg_sq") + (("max_exp_avg_sq",) if h["amsgrad"] else ()), torch_step=True)
_RMSPROP = _Family(RMSpropState, _rmsprop_rule,
                   (("alpha", 0.99), ("eps", 1e-8), ("weight_decay", 0.0), ("momentum", 0.0), ("centered", False),
                    ("maximize", False)),
                   lambda h: (("square_avg",) + (("momentum_buffer",) if h["momentum"] > 0 else ())
                              + (("grad_avg",) if h["centered"] else ())),
                   torch_step=True)
_ADAGRAD = _Family(AdagradState, _adagrad_rule,
                   (("lr_decay", 0.0), ("weight_decay", 0.0), ("eps", 1e-10), ("maximize", False)),
                   lambda h: ("sum",), torch_step=True)

_TORCH_FAMILIES = {torch.optim.SGD: _SGD, torch.optim.Adam: _ADAM, torch.optim.AdamW: _ADAM,
                   torch.optim.RMSprop: _RMSPROP, torch.optim.Adagrad: _ADAGRAD}
# Composer is not a dependency: its optimizers are known by class name
_COMPOSER_FAMILIES = {"DecoupledSGDW": _SGD, "DecoupledAdamW": _ADAM}

SUPPORTED = ("torch.optim.SGD (momentum, dampening, nesterov, weight_decay, maximize); "
             "torch.optim.Adam and AdamW (betas, eps, weight_decay, amsgrad, maximize, decoupled_weight_decay); "
             "torch.optim.RMSprop (alpha, eps, weight_decay, momentum, centered, maximize); "
             "torch.optim.Adagrad (lr_decay, weight_decay, initial_accumulator_value, eps, maximize); "
             "Composer's DecoupledSGDW and DecoupledAdamW (their own options, per param group); "
             "foreach, fused, capturable and differentiable are accepted and do not change the math")


# ------------------------------------------------------------------------------------------------ reading torch
class _Group(NamedTuple):
    index: int
    base_lr: float
    keys: tuple[str, ...]
    h: dict  # the options the rule reads, as Python floats and bools
    buffers: tuple[str, ...]
    step_on_param: bool  # torch keeps ``step`` on the parameter's device (capturable, fused, Composer), else the CPU
    step_dtype: torch.dtype


class _Plan(NamedTuple):
    name: str
    family: _Family
    composer: bool
    groups: tuple[_Group, ...]
    initial_sum: float  # Adagrad's starting accumulator


def _refuse(name: str, what: str) -> ConfigurationError:
    return ConfigurationError(f"{name}: {what}. Supported: {SUPPORTED}. Otherwise pass an optax transformation "
                              "(jaxcomposer.optim.DecoupledAdamW, optax.adamw, ...) as optimizers=.")


def _identify(optimizer) -> tuple[str, _Family, bool]:
    if not isinstance(optimizer, torch.optim.Optimizer):
        raise ConfigurationError(f"translate: expected a torch.optim.Optimizer, got {type(optimizer).__name__}")
    cls = type(optimizer)
    for base in cls.__mro__:
        composer = base.__name__ in _COMPOSER_FAMILIES
        if composer or base in _TORCH_FAMILIES:
            break
    else:
        raise _refuse(cls.__name__, "no translation for this optimizer class")
    family = _COMPOSER_FAMILIES[base.__name__] if composer else _TORCH_FAMILIES[base]
    base_name = base.__name__ if composer else f"torch.optim.{base.__name__}"
    name = base_name if base is cls else f"{cls.__name__} (a {base_name})"
    if base is not cls:
        # torch wraps ``step`` in hooks on each class; unwrapped, a subclass that did not override it has the base's
        for method in ("step", "_init_group"):
            mine, theirs = getattr(cls, method, None), getattr(base, method, None)
            if (mine is None) != (theirs is None) or (mine is not None and
                                                      inspect.unwrap(mine) is not inspect.unwrap(theirs)):
                raise _refuse(name, f"it overrides {method}(), so its update rule is not {base_name}'s and "
                                    "cannot be translated")
    return name, family, composer


def _number(value) -> float:
    return float(value.item() if isinstance(value, torch.Tensor) else value)


def _scalar_dtype(fused: bool) -> torch.dtype:
    # torch's ``_get_scalar_dtype``: ``step`` follows the default dtype unless a fused kernel pins it to float32
    return torch.float32 if fused or torch.get_default_dtype() != torch.float64 else torch.float64


def _plan(optimizer, named_params: Mapping[str, Any]) -> _Plan:
    name, family, composer = _identify(optimizer)
    key_of: dict[int, str] = {}
    for key, p in named_params.items():
        if id(p) in key_of:
            raise ConfigurationError(f"translate: named_params maps both {key_of[id(p)]!r} and {key!r} to one "
                                     "parameter; name each (tied) parameter once, as the bridged params dict does")
        key_of[id(p)] = key
    defaults = optimizer.defaults
    groups = []
    for i, group in enumerate(optimizer.param_groups):
        def opt(option, default, group=group):
            return group.get(option, defaults.get(option, default))

        if composer and opt("maximize", False):
            raise _refuse(name, f"param group {i}: maximize=True, which Composer's {name} ignores (it minimizes "
                                "all the same), so the option cannot mean what it says; drop it, or negate the loss")
        h = {"lr": _number(opt("lr", 0.0)), "composer": composer}
        for option, default in family.options:
            value = opt(option, default)
            if option == "betas":
                h["beta1"], h["beta2"] = _number(value[0]), _number(value[1])
            elif isinstance(default, bool):
                h[option] = bool(value)
            else:
                h[option] = _number(value)
        if family is _ADAM and not composer:
            # AdamW is Adam with this flag set; a group lacking it (an old pickle) gets its class's value
            h["decoupled_weight_decay"] = bool(opt("decoupled_weight_decay",
                                                   isinstance(optimizer, torch.optim.AdamW)))
        keys = []
        for p in group["params"]:
            key = key_of.get(id(p))
            if key is None:
                raise ConfigurationError(
                    f"{name}: param group {i} holds a parameter of shape {tuple(p.shape)} that is not one of the "
                    "model's parameters: the optimizer was built on other tensors (for example before a "
                    "copy.deepcopy of the model, or on another module). Build it on the model you train, after any "
                    f"copy: {name.split(' ')[0]}(model.parameters(), ...)")
            if p.is_complex():
                raise _refuse(name, f"param group {i}: parameter {key!r} is complex ({p.dtype}); only real "
                                    "parameters are supported")
            if p.layout != torch.strided:
                raise _refuse(name, f"param group {i}: parameter {key!r} is sparse ({p.layout}); only dense "
                                    "parameters are supported")
            if p.requires_grad:
                keys.append(key)
        base_lr = _number(group["initial_lr"]) if "initial_lr" in group else h["lr"]
        h["lr"] = base_lr
        on_param = composer or bool(opt("capturable", False)) or bool(opt("fused", False))
        groups.append(_Group(i, base_lr, tuple(keys), h, family.buffers(h), on_param,
                             torch.float32 if composer else _scalar_dtype(bool(opt("fused", False)))))
    # torch's Adagrad fills every accumulator with the constructor's value (a group's own is not read)
    initial_sum = _number(defaults.get("initial_accumulator_value", 0.0))
    return _Plan(name, family, composer, tuple(groups), initial_sum)


# ------------------------------------------------------------------------------------------------ translate
def translate(optimizer: torch.optim.Optimizer, named_params: Mapping[str, torch.nn.Parameter]) -> TorchOptimizer:
    """The optax transformation computing ``optimizer.step()``'s update for the flat params dict ``named_params``
    names (``{params key: the torch Parameter}``; parameters are matched by identity).

    Raises :class:`~jaxcomposer.errors.ConfigurationError`, before anything is traced, for an optimizer class or
    option with no faithful translation (naming the class, the param group and the option) and for an optimizer
    built on parameters that are not ``named_params``'."""
    plan = _plan(optimizer, named_params)
    family, State = plan.family, plan.family.state
    managed = {key: group for group in plan.groups for key in group.keys}
    needs_params = any(g.h["weight_decay"] != 0 for g in plan.groups)
    buffer_names = State._fields[1:]

    def init(params):
        step, bufs = {}, {b: {} for b in buffer_names}
        for key, group in managed.items():
            if key not in params:
                raise KeyError(f"{plan.name}: init got no parameter {key!r}; pass the model's flat params dict")
            p = params[key]
            step[key] = jnp.zeros((), jnp.float32)
            for b in group.buffers:
                bufs[b][key] = jnp.full_like(p, plan.initial_sum) if b == "sum" else jnp.zeros_like(p)
        return State(step, **bufs)

    def update(grads, state, params=None):
        if params is None and needs_params:
            raise ValueError(f"{plan.name}.update needs params for weight decay; call update(grads, state, params).")
        step = dict(state.step)
        bufs = {b: dict(getattr(state, b)) for b in buffer_names}
        updates = {}
        for key, g in grads.items():
            group = managed.get(key)
            if group is None:  # torch never touches it
                updates[key] = jnp.zeros_like(g)
                continue
            prev = state.step[key]
            t = prev + 1
            u, new = family.rule(group.h, g, None if params is None else params[key], prev == 0, t,
                                 {b: bufs[b][key] for b in group.buffers})
            updates[key] = u.astype(g.dtype)
            step[key] = t
            for b, value in new.items():
                bufs[b][key] = value.astype(bufs[b][key].dtype)
        return updates, State(step, **bufs)

    group_lrs = tuple(g.base_lr for g in plan.groups)
    return TorchOptimizer(init, update, group_lrs[0], plan.name, group_lrs, tuple(g.keys for g in plan.groups))


# ------------------------------------------------------------------------------------------------ state both ways
def _check_state(plan: _Plan, opt_state, fn: str) -> None:
    if not isinstance(opt_state, plan.family.state):
        raise TypeError(f"{fn}: expected the {plan.family.state.__name__} that translate(...).init made for "
                        f"{plan.name}, got {type(opt_state).__name__}")


def _to_jax(tensor: torch.Tensor, like, where: str):
    if tuple(tensor.shape) != tuple(like.shape):
        raise ConfigurationError(f"state_from_torch: {where} has shape {tuple(tensor.shape)} in the torch "
                                 f"optimizer, the parameter has {tuple(like.shape)}")
    t = tensor.detach().cpu()
    if t.dtype == torch.bfloat16:  # numpy has no bfloat16; float32 holds it exactly
        t = t.float()
    value = jnp.asarray(t.numpy(), dtype=like.dtype)
    sharding = getattr(like, "sharding", None)
    return jax.device_put(value, sharding) if sharding is not None else value


def state_from_torch(optimizer: torch.optim.Optimizer, named_params: Mapping[str, torch.nn.Parameter],
                     opt_state):
    """``opt_state`` (fresh from ``init``) with every entry the torch optimizer already holds: ``step`` and the
    buffers of ``optimizer.state[p]``. A parameter without torch state keeps its fresh state, so an optimizer that
    never stepped gives ``opt_state`` back unchanged."""
    plan = _plan(optimizer, named_params)
    _check_state(plan, opt_state, "state_from_torch")
    step = dict(opt_state.step)
    bufs = {b: dict(getattr(opt_state, b)) for b in plan.family.state._fields[1:]}
    for group in plan.groups:
        for key in group.keys:
            st = optimizer.state.get(named_params[key])
            if not st:
                continue
            if plan.family.torch_step and "step" in st:
                value = jnp.asarray(_number(st["step"]), jnp.float32)
            elif not plan.family.torch_step and st.get("momentum_buffer") is not None:
                value = jnp.ones((), jnp.float32)  # SGD: a buffer means the first step is behind it
            else:
                value = None
            if value is not None:
                sharding = getattr(step[key], "sharding", None)
                step[key] = jax.device_put(value, sharding) if sharding is not None else value
            for b in group.buffers:
                # absent: the group's options changed since torch stepped (torch would fail); keep the fresh buffer
                if st.get(b) is not None:
                    bufs[b][key] = _to_jax(st[b], bufs[b][key], f"state[{key!r}][{b!r}]")
    return plan.family.state(step, **bufs)


def _to_torch(value, p: torch.Tensor) -> torch.Tensor:
    array = np.asarray(value)
    if array.dtype.kind not in "fiub":  # bfloat16 (ml_dtypes): torch reads float32
        array = array.astype(np.float32)
    out = torch.empty_like(p, memory_format=torch.preserve_format, requires_grad=False)
    with torch.no_grad():
        out.copy_(torch.from_numpy(np.array(array)))  # a writable copy: jax's host arrays are read-only
    return out


def set_number(group: dict, option: str, value: float) -> None:
    if isinstance(group.get(option), torch.Tensor):  # a tensor lr stays the same tensor, as schedulers keep it
        group[option].fill_(value)
    else:
        group[option] = value


def state_to_torch(optimizer: torch.optim.Optimizer, named_params: Mapping[str, torch.nn.Parameter], opt_state,
                   lr_multiplier: float = 1.0) -> None:
    """Write ``opt_state`` into ``optimizer`` in place, as torch's own steps would have left it.

    ``optimizer.state[p]`` gets torch's entries under torch's names: ``step`` as the 0-dim tensor torch keeps (float32,
    on the CPU unless the group is capturable/fused or Composer's, as torch places it), buffers as tensors like the
    parameter (device, dtype, memory format). A parameter that has not stepped gets no entry, as torch creates state
    at a parameter's first step (Adagrad, which creates it in its constructor, always gets one; Composer's
    DecoupledSGDW without momentum records ``momentum_buffer = None`` as it does).

    Each group's ``lr`` becomes ``base lr * lr_multiplier`` (the schedule's multiplier at the end of the run) and its
    ``initial_lr`` the base lr, as a torch LR scheduler leaves a group: so a later :func:`translate` of this optimizer
    (a second Trainer, a resumed run) reads the same base lr and not the scheduled one, and a torch LR scheduler built
    on the optimizer afterwards keeps it (schedulers only set ``initial_lr`` where it is missing)."""
    plan = _plan(optimizer, named_params)
    _check_state(plan, opt_state, "state_to_torch")
    host = jax.device_get(opt_state)
    for group in plan.groups:
        for key in group.keys:
            p = named_params[key]
            step = float(host.step[key])
            if step == 0 and plan.family is not _ADAGRAD:
                continue
            entries = {}
            if plan.family.torch_step:
                device = p.device if group.step_on_param else "cpu"
                entries["step"] = torch.tensor(step, dtype=group.step_dtype, device=device)
            for b in group.buffers:
                entries[b] = _to_torch(getattr(host, b)[key], p)
            if plan.composer and plan.family is _SGD and not group.buffers:
                entries["momentum_buffer"] = None
            if entries:  # torch's SGD without momentum keeps no state at all
                # an existing entry keeps its key order, a new one gets torch's
                optimizer.state[p].update(entries)
        torch_group = optimizer.param_groups[group.index]
        set_number(torch_group, "lr", group.base_lr * float(lr_multiplier))
        set_number(torch_group, "initial_lr", group.base_lr)
