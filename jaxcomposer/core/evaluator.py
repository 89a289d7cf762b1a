"""``Evaluator``: a labelled evaluation set with its own metrics, batches and interval, as Composer's.

``Trainer(eval_dataloader=[Evaluator(label='val', dataloader=loader, metric_names=['MulticlassAccuracy']), ...])``
evaluates each set under its label and logs ``metrics/<label>/<name>``; a bare loader is one Evaluator labelled
``'eval'``. What an Evaluator leaves unset (``subset_num_batches``, ``eval_interval``) is the Trainer's.
"""
from __future__ import annotations

import dataclasses
from typing import Any, Callable, NamedTuple, Sequence

from jaxcomposer.core.time import Time
from jaxcomposer.data import data_spec
from jaxcomposer.errors import ConfigurationError


@dataclasses.dataclass
class Evaluator:
    """Composer's ``Evaluator(label, dataloader, metric_names=None, subset_num_batches=None, eval_interval=None,
    device_eval_microbatch_size=None)``.

    ``metric_names`` picks, by name, among the model's ``get_metrics(is_train=False)`` (all of them when None);
    a name the model does not have is refused when the Trainer is built. ``eval_interval`` (an int of epochs,
    ``'Nep'``, ``'Nba'`` or Composer's ``(state, event) -> bool``) overrides the Trainer's for this set.
    ``device_eval_microbatch_size`` is accepted for Composer's signature; evaluation here runs whole batches
    (it keeps no activations for a backward pass, so microbatching would only add steps).
    """

    label: str
    dataloader: Any
    metric_names: Sequence[str] | None = None
    subset_num_batches: int | None = None
    eval_interval: int | str | Time | Callable | None = None
    device_eval_microbatch_size: int | str | None = None

    def __post_init__(self):
        if not isinstance(self.label, str) or not self.label or "/" in self.label:
            raise ConfigurationError(f"Evaluator(label={self.label!r}): expected a non-empty name without '/', "
                                     "such as 'eval' or 'val'; it becomes the key metrics/<label>/<metric>")
        if self.dataloader is None:
            raise ConfigurationError(f"Evaluator(label={self.label!r}): dataloader is None; pass the loader of "
                                     "the evaluation set")
        if isinstance(self.metric_names, str):
            self.metric_names = [self.metric_names]
        if self.metric_names is not None:
            self.metric_names = list(self.metric_names)
        if self.subset_num_batches is not None and (not isinstance(self.subset_num_batches, int)
                                                    or self.subset_num_batches < -1):
            raise ConfigurationError(f"Evaluator(label={self.label!r}): subset_num_batches="
                                     f"{self.subset_num_batches!r}, expected a number of batches (-1: all)")


def as_evaluators(eval_dataloader: Any) -> list[Evaluator]:
    """The Trainer's ``eval_dataloader`` as a list of Evaluators: an Evaluator or a list of them as given, one
    loader (or DataSpec; a list of batches too) as ``Evaluator('eval', loader)``. A list of bare loaders is
    refused, since it is ambiguous (one set per loader needs a label each)."""
    if eval_dataloader is None:
        return []
    if isinstance(eval_dataloader, Evaluator):
        return [eval_dataloader]
    if isinstance(eval_dataloader, (list, tuple)) and eval_dataloader and \
            all(isinstance(e, (dict, tuple, list)) for e in eval_dataloader):
        return [Evaluator(label="eval", dataloader=eval_dataloader)]  # a list of batches is a loader
    if isinstance(eval_dataloader, (list, tuple)):
        not_evaluators = [i for i, e in enumerate(eval_dataloader) if not isinstance(e, Evaluator)]
        if not_evaluators:
            raise ConfigurationError(
                f"eval_dataloader: a list must hold Evaluators (as in Composer), but item(s) {not_evaluators} are "
                f"{sorted({type(eval_dataloader[i]).__name__ for i in not_evaluators})}; wrap each loader as "
                "Evaluator(label='val', dataloader=loader), or pass one loader alone")
        labels = [e.label for e in eval_dataloader]
        if len(set(labels)) != len(labels):
            raise ConfigurationError(f"eval_dataloader: Evaluator labels must be unique, got {labels}")
        return list(eval_dataloader)
    return [Evaluator(label="eval", dataloader=eval_dataloader)]


def check_metric_names(evaluator: Evaluator, available: Sequence[str]) -> None:
    """Refuse, before anything compiles, a metric name the model does not compute."""
    if evaluator.metric_names is None:
        return
    missing = [n for n in evaluator.metric_names if n not in available]
    if missing:
        raise ConfigurationError(f"Evaluator(label={evaluator.label!r}): metric_names {missing} are not among the "
                                 f"model's metrics {sorted(available)} (get_metrics(is_train=False))")


class EvalSet(NamedTuple):
    """An :class:`Evaluator` as the Trainer runs it: its loader converted, its DataSpec apart, its interval parsed
    (the Trainer's when it set none; None: only when asked)."""

    label: str
    loader: Any
    spec: Any
    metric_names: tuple[str, ...] | None
    subset: int
    interval: Any


def resolve_evaluator(ev: Evaluator, default_interval: Any, as_loader: Callable[[Any, str], Any]) -> EvalSet:
    """``ev`` with its loader converted by ``as_loader(loader, argument name)`` (a torch DataLoader wrapped), its
    DataSpec unwrapped and its interval parsed (``default_interval``, the Trainer's, when it sets none)."""
    from jaxcomposer import options  # (options imports core modules: imported here, not at the top)

    loader, spec = data_spec.unwrap(ev.dataloader)
    if callable(ev.eval_interval):
        interval = ev.eval_interval
    elif ev.eval_interval is None:
        interval = default_interval
    else:
        interval = options.parse_interval(ev.eval_interval, f"Evaluator({ev.label!r}).eval_interval")
    return EvalSet(ev.label, as_loader(loader, f"Evaluator({ev.label!r}).dataloader"), spec,
                   None if ev.metric_names is None else tuple(ev.metric_names),
                   -1 if ev.subset_num_batches is None else ev.subset_num_batches, interval)
