"""A user's torch optimizer and LR scheduler in the Trainer, and model surgery that keeps the optimizer on the
model's parameters (Composer's ``update_params_in_optimizer``). The update rules themselves are
:mod:`torch_bridge.optim`'s."""
from __future__ import annotations

from typing import Any, Sequence

import jax
import torch

from jaxcomposer.errors import ConfigurationError

from .optim import (AdagradState, AdamState, RMSpropState, SGDState, TorchOptimizer, set_number, state_from_torch,
                    state_to_torch, translate)

__all__ = ["TrainerOptimizer", "TrainerScheduler", "SurgeryFollower", "update_params_in_optimizer"]

_STATES = (SGDState, AdamState, RMSpropState, AdagradState)


def _map_states(fn, opt_state):
    """``opt_state`` (the Trainer's whole chain, method wrappers included) with ``fn`` applied to the translated
    optimizer's own state, wherever in the chain it sits."""
    return jax.tree.map(lambda s: fn(s) if isinstance(s, _STATES) else s, opt_state,
                        is_leaf=lambda s: isinstance(s, _STATES))


class TrainerOptimizer:
    """A user's torch optimizer as the Trainer runs it (``Trainer(optimizers=torch.optim.SGD(model.parameters(),
    ...))``): checked against the user's module before anything is exported, bound to the bridged model's param
    names once it is, seeded from the optimizer's own state at the start and written back into it whenever the
    Trainer writes the weights into the module (the end of ``fit``, ``eval``, ``save_checkpoint``), so the torch
    optimizer holds the run's state and ``param_groups[i]['lr']`` the current LR."""

    def __init__(self, optimizer: torch.optim.Optimizer, model: Any):
        self.optimizer = optimizer
        named = dict(model.named_parameters()) if isinstance(model, torch.nn.Module) else {}
        # refuses an option without translation, or parameters that are not the model's, before any export
        self.tx = translate(optimizer, named)
        self.named: dict[str, torch.nn.Parameter] | None = None
        # the methods' model surgery (BlurPool) replaces layers: the optimizer follows, as Composer's surgery
        # updates state.optimizers
        self.surgery = SurgeryFollower(optimizer)

    @property
    def lr(self) -> float:
        return self.tx.lr

    def bind(self, bridged) -> TorchOptimizer:
        """The transformation over ``bridged``'s flat params (after surgery and export)."""
        self.named = dict(bridged.module.named_parameters())
        self.tx = translate(self.optimizer, self.named)
        return self.tx

    def set_lr(self, lr_multiplier: float) -> None:
        """Each group's ``lr`` as the schedule has it now, as a torch LR scheduler keeps it between steps (what
        Composer's ``LRMonitor`` and a user's callback read)."""
        for group, base in zip(self.optimizer.param_groups, self.tx.group_lrs):
            group.setdefault("initial_lr", base)  # first, as a torch scheduler does: the base lr stays readable
            set_number(group, "lr", base * lr_multiplier)

    def load(self, opt_state):
        return _map_states(lambda s: state_from_torch(self.optimizer, self.named, s), opt_state)

    def save(self, opt_state, lr_multiplier: float) -> None:
        _map_states(lambda s: state_to_torch(self.optimizer, self.named, s, lr_multiplier), opt_state)


class TrainerScheduler:
    """A torch LR scheduler built on the run's torch optimizer (``CosineAnnealingLR(optimizer, T_max=...)``) as the
    Trainer's host schedule, as Composer runs one: stepped at each epoch's end, or after every batch with
    ``step_schedulers_every_batch=True``; the LR it sets, relative to each group's ``initial_lr``, multiplies the
    step's LR. Its own arithmetic (chainable forms included) runs unchanged on the optimizer's ``param_groups``."""

    def __init__(self, scheduler: torch.optim.lr_scheduler.LRScheduler, optimizer: Any, where: str):
        if isinstance(scheduler, torch.optim.lr_scheduler.ReduceLROnPlateau):
            raise ConfigurationError(f"{where}: ReduceLROnPlateau steps on a metric value, which the Trainer does not "
                                     "hand to schedulers (nor does Composer's); step it yourself in a callback")
        if scheduler.optimizer is not optimizer:
            raise ConfigurationError(f"{where}: {type(scheduler).__name__} is built on another optimizer than the "
                                     "Trainer's optimizers=; build it on the optimizer you pass the Trainer")
        self.scheduler, self.where = scheduler, where

    def multiplier(self) -> float:
        groups = self.scheduler.optimizer.param_groups
        ratios = [float(g["lr"]) / float(g["initial_lr"]) for g in groups if float(g.get("initial_lr", 0.0)) != 0.0]
        if not ratios:
            return 1.0
        if max(ratios) - min(ratios) > 1e-9 * max(1.0, abs(max(ratios))):
            raise ConfigurationError(f"{self.where}: {type(self.scheduler).__name__} scales the param groups "
                                     f"differently ({ratios}); the Trainer's schedule multiplies every group's LR by "
                                     "one factor. Use one schedule for all groups")
        return ratios[0]

    def step(self) -> None:
        # the optimizer's own step() never runs (the update is compiled): tell torch it has, so the scheduler does
        # not warn that it is stepped first
        self.scheduler.optimizer._opt_called = True
        self.scheduler.step()


def update_params_in_optimizer(old_params: Sequence[torch.nn.Parameter], new_params: Sequence[torch.nn.Parameter],
                               optimizers: Any) -> None:
    """Composer's ``update_params_in_optimizer``: after model surgery replaced ``old_params`` by ``new_params``,
    the optimizers hold the new ones. Parameters surgery removed leave their groups (and their optimizer state);
    parameters it added join group 0, in the model's order. As in Composer, added parameters with several param
    groups are refused (which group they belong to is not known), as is more than one optimizer."""
    optimizers = [] if optimizers is None else list(optimizers) if isinstance(optimizers, (list, tuple)) \
        else [optimizers]
    if not optimizers:
        return
    if len(optimizers) > 1:
        raise ConfigurationError("optimizers: model surgery keeps one optimizer's parameters up to date (as in "
                                 f"Composer), got {len(optimizers)}")
    optimizer = optimizers[0]
    old_ids, new_ids = {id(p) for p in old_params}, {id(p) for p in new_params}
    removed = [p for p in old_params if id(p) not in new_ids]
    added = [p for p in new_params if id(p) not in old_ids]
    removed_ids = {id(p) for p in removed}
    in_optimizer = {id(p) for group in optimizer.param_groups for p in group["params"]}
    if not any(id(p) in in_optimizer for p in removed):
        return  # surgery changed nothing this optimizer holds (or it holds none of the model's parameters)
    if added and len(optimizer.param_groups) > 1:
        raise ConfigurationError(
            f"optimizers: model surgery replaced parameters of {type(optimizer).__name__}, which has "
            f"{len(optimizer.param_groups)} param groups; the new parameters could join any of them (Composer "
            "refuses this too). Build the optimizer after the surgery, or with one param group")
    for group in optimizer.param_groups:
        group["params"] = [p for p in group["params"] if id(p) not in removed_ids]
    for p in removed:
        optimizer.state.pop(p, None)
    if added:
        optimizer.param_groups[0]["params"].extend(added)


class SurgeryFollower:
    """Keeps a torch optimizer on the model's parameters across model surgery: ``before(model)`` notes them, and
    ``after(model)`` moves the optimizer to what surgery left (:func:`update_params_in_optimizer`)."""

    def __init__(self, optimizers: Any):
        self.optimizers = optimizers
        self._before: list[torch.nn.Parameter] = []

    def before(self, model: Any) -> None:
        self._before = list(model.parameters()) if isinstance(model, torch.nn.Module) else []

    def after(self, model: Any) -> None:
        after = list(model.parameters()) if isinstance(model, torch.nn.Module) else []
        update_params_in_optimizer(self._before, after, self.optimizers)
