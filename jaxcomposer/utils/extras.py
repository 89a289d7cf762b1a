"""Optional dependencies: ``pip install jaxcomposer`` is the JAX library; torch (the bridge), tfds, matplotlib,
object stores (obstore), MLflow and W&B come with its extras (``jaxcomposer[torch]``, ``[tfds]``, ``[plots]``,
``[remote]``, ``[mlflow]``, ``[wandb]``, ``[all]``), imported only by the feature that needs them."""
from __future__ import annotations

import importlib
import importlib.util
from types import ModuleType


def optional_import(module: str, *, needed_by: str, package: str, extra: str | None = None) -> ModuleType:
    """Import ``module``, or raise an ImportError that names what installs it (our extra, when it has one)."""
    try:
        return importlib.import_module(module)
    except ImportError as e:
        raise ImportError(f"{needed_by} needs {package}; install it with {how_to_install(package, extra)}.") from e


def how_to_install(package: str, extra: str | None = None) -> str:
    how = f"`pip install {package}`"
    return f"`pip install jaxcomposer[{extra}]` (or {how})" if extra else how


def is_installed(module: str) -> bool:
    """Whether ``module``'s top-level package can be imported (without importing it)."""
    return importlib.util.find_spec(module.split(".")[0]) is not None
