"""The config loader behind ``jaxcomposer.fit(config)`` and ``jaxcomposer fit CONFIG``; the schema, ``Config``, is
built from the option table in :mod:`jaxcomposer.options`.

A config is a YAML path, a mapping, or a :class:`Config`. Validation reports *every* bad key and value at once, each
with its dotted path and, for misspelt names, a "did you mean"; it runs before any compile and before any file is
written. Components (optimizer, schedulers, algorithms, callbacks) are validated by building them, which is cheap and
checks exactly what the real run would check (time strings, ranges, argument names).
"""
from __future__ import annotations

import difflib
import inspect
import re
import typing
from pathlib import Path
from typing import Any, Callable, Mapping

import optax
import pydantic
import yaml

from jaxcomposer import algorithms as algorithms_lib
from jaxcomposer import callbacks as callbacks_lib
from jaxcomposer import data as data_lib
from jaxcomposer import loggers as loggers_lib
from jaxcomposer import models as models_lib
from jaxcomposer import optim
from jaxcomposer.errors import ConfigError
from jaxcomposer.utils.object_store import is_uri
from jaxcomposer.models.tasks import CLASSIFICATION_LOSSES
from jaxcomposer.options import DATA_OPTIONS, Config, DataConfig, describe_errors  # noqa: F401 (re-exported)


def snake(name: str) -> str:
    return re.sub(r"(?<=[a-z0-9])(?=[A-Z])", "_", name).lower()


def _optax_optimizer(fn: Callable) -> Callable:
    def build(learning_rate: float, **kwargs):
        if learning_rate <= 0:
            raise ValueError(f"learning_rate must be > 0, got {learning_rate}")
        return fn(learning_rate, **kwargs)
    build.__signature__ = inspect.signature(fn)
    return build


OPTIMIZERS: dict[str, Callable] = {
    "decoupled_sgdw": optim.DecoupledSGDW, "decoupled_adamw": optim.DecoupledAdamW,
    "sgd": _optax_optimizer(optax.sgd), "adam": _optax_optimizer(optax.adam),
    "adamw": _optax_optimizer(optax.adamw), "lamb": _optax_optimizer(optax.lamb),
}
SCHEDULERS: dict[str, Callable] = {snake(n).removesuffix("_scheduler"): getattr(optim, n)
                                   for n in dir(optim) if n.endswith("Scheduler") and n != "ComposerScheduler"}
# Composer's registry spellings (``mixup``, ``cutout``, ``label_smoothing``); lookups ignore case and underscores,
# so the class names (``MixUp``, ``LabelSmoothing``) work too.
ALGORITHMS: dict[str, Callable] = {n: getattr(algorithms_lib, c) for n, c in algorithms_lib.REGISTRY.items()}
CALLBACKS: dict[str, Callable] = {
    "speed_monitor": callbacks_lib.SpeedMonitor, "lr_monitor": callbacks_lib.LRMonitor,
    "nan_monitor": callbacks_lib.NaNMonitor, "early_stopper": callbacks_lib.EarlyStopper,
    "threshold_stopper": callbacks_lib.ThresholdStopper, "memory_monitor": callbacks_lib.MemoryMonitor,
    "runtime_estimator": callbacks_lib.RuntimeEstimator, "optimizer_monitor": callbacks_lib.OptimizerMonitor,
    "system_metrics_monitor": callbacks_lib.SystemMetricsMonitor, "checkpoint_saver": callbacks_lib.CheckpointSaver,
    "activation_monitor": callbacks_lib.ActivationMonitor,
}
# the destinations a config may add (the run directory's JSONL, TensorBoard and plot are always there)
LOGGERS: dict[str, Callable] = {"mlflow": loggers_lib.MLFlowLogger, "wandb": loggers_lib.WandBLogger,
                                "file": loggers_lib.FileLogger}


def lookup(registry: Mapping[str, Callable], name: Any) -> str | None:
    """The registry's canonical name for ``name`` (case and underscores ignored), or None."""
    want = str(name).lower().replace("_", "")
    return next((k for k in registry if k.replace("_", "") == want), None)


MODELS = tuple(models_lib.BUILDERS)


def load_config(config: Any, overrides: list[str] | None = None) -> Config:
    """Normalize a path / mapping / Config, apply ``a.b=c`` overrides (values parsed as YAML), validate all of it."""
    if isinstance(config, Config):
        raw = config.model_dump()
    elif isinstance(config, (str, Path)):
        path = Path(config)
        if not path.is_file():
            raise ConfigError([("config", f"file {str(path)!r} does not exist")])
        try:
            raw = read_yaml(path.read_text()) or {}
        except yaml.YAMLError as e:
            raise ConfigError([("config", f"{path} is not valid YAML: {' '.join(str(e).split())}")]) from None
    elif isinstance(config, Mapping):
        raw = dict(config)
    else:
        raise ConfigError([("config", f"expected a YAML path, a mapping or a jaxcomposer.Config, got "
                                      f"{type(config).__name__}")])
    raw = _deep_copy(raw)
    problems: list[tuple[str, str]] = []
    for item in overrides or []:
        key, sep, value = item.partition("=")
        if not sep or not key:
            problems.append(("--set", f"{item!r} is not of the form key.path=value"))
            continue
        try:
            _set_dotted(raw, key.strip(), read_yaml(value))
        except yaml.YAMLError as e:
            problems.append((key.strip(), f"--set value {value!r} is not valid YAML: {' '.join(str(e).split())}"))
        except (KeyError, IndexError, TypeError) as e:
            problems.append((key.strip(), f"--set {item!r}: {e.args[0] if e.args else e}"))
    cfg = None
    try:
        cfg = Config.model_validate(raw)
    except pydantic.ValidationError as e:
        problems += [_with_suggestion(loc, msg) for loc, msg in describe_errors(e)]
    if isinstance(raw, Mapping):
        problems += _check_components(raw)
    load_path = raw.get("load_path") if isinstance(raw, Mapping) else None
    if isinstance(load_path, str) and not is_uri(load_path) and not Path(load_path).expanduser().exists():
        problems.append(("load_path", f"{load_path!r} does not exist (resolved to "
                                      f"{Path(load_path).expanduser().absolute()}); give a checkpoint directory or a "
                                      "save_folder"))
    if raw.get("max_duration") is None and not any(loc == "max_duration" for loc, _ in problems):
        problems.append(("max_duration", "required: how long to train, e.g. '10ep' or '500ba'"))
    if problems:
        raise ConfigError(problems)
    return cfg


def _with_suggestion(loc: str, msg: str) -> tuple[str, str]:
    """An unknown key gets a "did you mean" from the keys allowed where it sits."""
    if msg != "Extra inputs are not permitted":
        return loc, msg
    *parent, name = loc.split(".")
    return loc, f"unknown key{_did_you_mean(name, _fields_at(tuple(parent)))}"


def _fields_at(loc: tuple) -> list[str]:
    model = Config
    for part in loc:
        field = model.model_fields.get(str(part))
        ann = getattr(field, "annotation", None)
        if not (isinstance(ann, type) and issubclass(ann, pydantic.BaseModel)):
            return []
        model = ann
    return list(model.model_fields)


def _did_you_mean(name: str, options) -> str:
    close = difflib.get_close_matches(name, list(options), n=1, cutoff=0.6)
    return f"; did you mean {close[0]!r}?" if close else ""


def _check_components(raw: Mapping) -> list[tuple[str, str]]:
    problems: list[tuple[str, str]] = []
    opt = raw.get("optimizer")
    if isinstance(opt, Mapping):
        problems += _check_one("optimizer", opt, OPTIMIZERS)
    for i, s in enumerate(raw.get("schedulers") or []):
        if isinstance(s, Mapping):
            problems += _check_one(f"schedulers.{i}", s, SCHEDULERS)
    for group, registry in (("algorithms", ALGORITHMS), ("callbacks", CALLBACKS), ("loggers", LOGGERS)):
        entries = raw.get(group) or {}
        if isinstance(entries, Mapping):
            for name, kwargs in entries.items():
                problems += _check_one(f"{group}.{name}", {"name": name, **(kwargs or {})}, registry, named=True)
    model = raw.get("model")
    if isinstance(model, Mapping):
        name = model.get("name")
        if name not in MODELS:
            problems.append(("model.name", f"got {name!r}, expected one of {list(MODELS)}{_did_you_mean(str(name), MODELS)}"))
        else:
            # the builder's signature is the schema; model.loss chooses the classifier's loss, not a builder argument
            problems += _check_kwargs("model", models_lib.BUILDERS[name],
                                      {k: v for k, v in model.items() if k not in ("name", "loss")}, build=False)
            kind = models_lib.MODEL_KINDS[name]
            if "loss" in model and (kind != "image" or model["loss"] not in CLASSIFICATION_LOSSES):
                problems.append(("model.loss", f"got {model['loss']!r}, expected one of {list(CLASSIFICATION_LOSSES)} "
                                               "(image classifiers only)"))
            data = raw.get("data") if isinstance(raw.get("data"), Mapping) else {}
            dataset = data.get("name", DATA_OPTIONS[0].default)
            data_kind = data_lib.dataset_kind(dataset) if dataset in data_lib.DATASET_NAMES else None
            if data_kind is not None and (kind == "image") != (data_kind == "image"):
                fitting = [n for n in data_lib.DATASET_NAMES if (data_lib.dataset_kind(n) == "image") == (kind == "image")]
                problems.append(("model.name", f"{name!r} does not fit data.name {dataset!r} ({data_kind} data): "
                                               f"{name!r} trains on {', '.join(map(repr, fitting))}"))
    return problems


def _check_one(loc: str, spec: Mapping, registry: Mapping[str, Callable], named: bool = False):
    name = spec.get("name")
    key = lookup(registry, name)
    if key is None:
        where = loc if named else f"{loc}.name"
        return [(where, f"unknown name {name!r}{_did_you_mean(snake(str(name)), registry)}; "
                        f"known: {', '.join(sorted(registry))}")]
    return _check_kwargs(loc, registry[key], {k: v for k, v in spec.items() if k != "name"})


def _check_kwargs(loc: str, fn: Callable, kwargs: Mapping, build: bool = True) -> list[tuple[str, str]]:
    target = fn.__init__ if isinstance(fn, type) else fn  # NNX's metaclass hides classes' own signatures
    params = {n: p for n, p in inspect.signature(target).parameters.items() if n != "self"}
    accepts_any = any(p.kind == p.VAR_KEYWORD for p in params.values())
    returned = typing.get_type_hints(fn).get("return") if not isinstance(fn, type) and accepts_any else None
    if isinstance(returned, type):  # a builder passing **kwargs to the class it returns (resnet, gpt2, ...)
        params.update({n: p for n, p in inspect.signature(returned.__init__).parameters.items()
                       if n != "self" and n not in params})
        params = {n: p for n, p in params.items() if p.kind != p.VAR_KEYWORD}
        accepts_any = False
    names = [n for n, p in params.items() if p.kind not in (p.VAR_POSITIONAL, p.VAR_KEYWORD)]
    unknown = [k for k in kwargs if k not in names and not accepts_any]
    problems = [(f"{loc}.{k}", f"unknown argument{_did_you_mean(k, names)}; accepted: {', '.join(names)}")
                for k in unknown]
    if not problems and build:
        try:
            fn(**kwargs)
        except (TypeError, ValueError) as e:
            problems.append(problem_from_error(loc, kwargs, e))
    return problems


def problem_from_error(loc: str, kwargs: Mapping, error: Exception) -> tuple[str, str]:
    """A builder's ``TypeError``/``ValueError`` as a config problem, pointed at the argument when the message names
    exactly one of them ("Invalid lr=0", "depth must be 6n+2")."""
    named = [k for k in kwargs if re.search(rf"\b{re.escape(k)}\b", str(error))]
    return (f"{loc}.{named[0]}" if len(named) == 1 else loc, str(error))


def build_component(spec: Mapping, registry: Mapping[str, Callable]):
    spec = dict(spec)
    return registry[lookup(registry, spec.pop("name"))](**spec)


def _deep_copy(x):
    if isinstance(x, Mapping):
        return {k: _deep_copy(v) for k, v in x.items()}
    if isinstance(x, list):
        return [_deep_copy(v) for v in x]
    return x


class _YAMLLoader(yaml.SafeLoader):
    """PyYAML's safe loader, reading numbers as YAML 1.2 does: ``1e-3`` and ``3E5`` are floats (YAML 1.1, which
    PyYAML follows, wants a dot, ``1.0e-3``, and otherwise gives the string ``'1e-3'``)."""


_YAMLLoader.add_implicit_resolver(
    "tag:yaml.org,2002:float",
    re.compile(r"^[-+]?(?:[0-9][0-9_]*(?:\.[0-9_]*)?|\.[0-9_]+)[eE][-+]?[0-9]+$"),
    list("-+0123456789."))


def read_yaml(text: str) -> Any:
    """YAML as a config reads it (files and ``--set`` values): exponent-only floats are numbers."""
    return yaml.load(text, Loader=_YAMLLoader)


def _set_dotted(d: dict, dotted: str, value: Any) -> None:
    """Set ``a.b.0.c`` in nested dicts/lists; ``None`` (``--set key=null``) removes the key, so a method or callback
    leaves the recipe and an option goes back to its default."""
    parts = dotted.split(".")
    for depth, p in enumerate(parts[:-1]):
        where = ".".join(parts[:depth + 1])
        if isinstance(d, list):
            if not p.isdigit() or int(p) >= len(d):
                raise IndexError(f"{where}: the list has {len(d)} entries (indices 0..{len(d) - 1})")
            d = d[int(p)]
            continue
        if not isinstance(d, dict):
            raise TypeError(f"{'.'.join(parts[:depth])} holds {d!r}, not a mapping or list")
        if d.get(p) is None:
            if value is None:
                return  # removing something that is not there
            d[p] = {}
        d = d[p]
    last = parts[-1]
    if isinstance(d, list):
        if not last.isdigit() or int(last) >= len(d):
            raise IndexError(f"{dotted}: the list has {len(d)} entries (indices 0..{len(d) - 1})")
        if value is None:
            del d[int(last)]
        else:
            d[int(last)] = value
    elif not isinstance(d, dict):
        raise TypeError(f"{'.'.join(parts[:-1])} holds {d!r}, not a mapping or list")
    elif value is None:
        d.pop(last, None)
    else:
        d[last] = value
