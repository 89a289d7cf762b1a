"""jaxcomposer: MosaicML Composer's speedup methods as composable pure transforms in JAX."""
from jaxcomposer.core.events import Callback, Event, RunState
from jaxcomposer.core.method import Method, ModelView, PostStep, RunInfo, StepCtx, compose
from jaxcomposer.core.model import PureModel, Task, from_nnx
from jaxcomposer.core.state import TrainState
from jaxcomposer.core.time import Time, TimeUnit, Timestamp
from jaxcomposer.config import Config, ConfigError, load_config
from jaxcomposer.runner import FitResult, fit
from jaxcomposer.models.tasks import ComposerCausalLM, ComposerClassifier
from jaxcomposer.errors import ConfigurationError, JaxComposerError
from jaxcomposer.trainer.trainer import Trainer
from jaxcomposer import algorithms, callbacks, functional, loggers, metrics, optim  # noqa: E402

__all__ = ["Callback", "ComposerCausalLM", "ComposerClassifier", "Config", "ConfigError", "ConfigurationError", "JaxComposerError",
           "Event", "FitResult", "Method", "ModelView", "PostStep", "PureModel", "RunInfo", "RunState", "StepCtx", "Task", "Time", "TimeUnit",
           "Timestamp", "Trainer", "TrainState", "algorithms", "callbacks", "compose", "fit", "from_nnx",
           "functional", "load_config", "loggers", "metrics", "optim"]
__version__ = "0.1.0"
