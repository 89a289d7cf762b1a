"""jaxcomposer: MosaicML Composer's speedup methods as composable pure transforms in JAX.

The names below load on first use (PEP 562), so ``jaxcomposer launch`` and ``jaxcomposer --help`` start without
importing JAX; ``import jaxcomposer`` followed by ``jaxcomposer.Trainer`` or ``from jaxcomposer import Trainer``
work as with eager imports.
"""
import importlib
from typing import TYPE_CHECKING

_HOMES = {  # public name -> the module that defines it
    "Algorithm": "jaxcomposer.core.algorithm",
    "Callback": "jaxcomposer.core.events", "Event": "jaxcomposer.core.events", "RunState": "jaxcomposer.core.run_state",
    "Method": "jaxcomposer.core.method", "ModelView": "jaxcomposer.core.method", "PostStep": "jaxcomposer.core.method",
    "RunInfo": "jaxcomposer.core.method", "StepCtx": "jaxcomposer.core.method", "compose": "jaxcomposer.core.method",
    "PureModel": "jaxcomposer.core.model", "Task": "jaxcomposer.core.model", "from_nnx": "jaxcomposer.core.model",
    "TrainState": "jaxcomposer.core.state",
    "Time": "jaxcomposer.core.time", "TimeUnit": "jaxcomposer.core.time", "Timestamp": "jaxcomposer.core.time",
    "Config": "jaxcomposer.config", "ConfigError": "jaxcomposer.config", "load_config": "jaxcomposer.config",
    "FitResult": "jaxcomposer.runner", "fit": "jaxcomposer.runner",
    "ComposerCausalLM": "jaxcomposer.models.tasks", "ComposerClassifier": "jaxcomposer.models.tasks",
    "ConfigurationError": "jaxcomposer.errors", "JaxComposerError": "jaxcomposer.errors",
    "Trainer": "jaxcomposer.trainer.trainer",
    "DataSpec": "jaxcomposer.data.data_spec",
    # Composer's top-level names (composer.State, composer.Evaluator, composer.Logger, ...)
    "State": "jaxcomposer.core.run_state", "Evaluator": "jaxcomposer.core.evaluator",
    "Precision": "jaxcomposer.core.precision", "Logger": "jaxcomposer.loggers.logger",
}
_RENAMED = {"State": "RunState"}  # public name -> the name in its home module
# Composer's torch model classes, handed out by the torch adapter when asked for (jaxcomposer never imports torch)
_TORCH_CLASSES = ("ComposerModel", "HuggingFaceModel")
_SUBMODULES = ("algorithms", "callbacks", "core", "data", "functional", "loggers", "metrics", "models", "optim",
               "profiler", "trainer", "utils")

if TYPE_CHECKING:  # the same names, as type checkers and IDEs see them (at run time: __getattr__ below)
    from jaxcomposer.config import Config as Config, ConfigError as ConfigError, load_config as load_config
    from jaxcomposer.core.algorithm import Algorithm as Algorithm
    from jaxcomposer.core.evaluator import Evaluator as Evaluator
    from jaxcomposer.core.events import Callback as Callback, Event as Event
    from jaxcomposer.core.method import (Method as Method, ModelView as ModelView, PostStep as PostStep,
                                         RunInfo as RunInfo, StepCtx as StepCtx, compose as compose)
    from jaxcomposer.core.model import PureModel as PureModel, Task as Task, from_nnx as from_nnx
    from jaxcomposer.core.precision import Precision as Precision
    from jaxcomposer.core.run_state import RunState as RunState, RunState as State  # Composer's composer.State
    from jaxcomposer.core.state import TrainState as TrainState
    from jaxcomposer.core.time import Time as Time, TimeUnit as TimeUnit, Timestamp as Timestamp
    from jaxcomposer.data.data_spec import DataSpec as DataSpec
    from jaxcomposer.errors import ConfigurationError as ConfigurationError, JaxComposerError as JaxComposerError
    from jaxcomposer.loggers.logger import Logger as Logger
    from jaxcomposer.models.tasks import ComposerCausalLM as ComposerCausalLM, ComposerClassifier as ComposerClassifier
    from jaxcomposer.runner import FitResult as FitResult, fit as fit
    from jaxcomposer.trainer.trainer import Trainer as Trainer
    from jaxcomposer import (algorithms as algorithms, callbacks as callbacks, core as core, data as data,
                             functional as functional, loggers as loggers, metrics as metrics, models as models,
                             optim as optim, profiler as profiler, trainer as trainer, utils as utils)

__all__ = sorted([*_HOMES, *_SUBMODULES])  # (the torch classes are left out: `import *` must not import torch)
__version__ = "0.1.0"


def __getattr__(name: str):
    if name in _SUBMODULES:
        return importlib.import_module(f"jaxcomposer.{name}")
    if name in _TORCH_CLASSES:
        from jaxcomposer.core import adapters
        return adapters.framework_class("torch", name, wanted_by=f"jaxcomposer.{name}")
    if name in _HOMES:
        value = getattr(importlib.import_module(_HOMES[name]), _RENAMED.get(name, name))
        globals()[name] = value  # later lookups skip this hook
        return value
    raise AttributeError(f"module 'jaxcomposer' has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted({*globals(), *__all__})
