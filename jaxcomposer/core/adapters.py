"""Adapters: how objects of other frameworks (torch modules, torch DataLoaders) become ones jaxcomposer knows.

jaxcomposer never imports torch or ``torch_bridge``. A package that knows another framework's objects declares an
:class:`Adapter` under the Python entry point group ``jaxcomposer.adapters``; the entry point's *name* is the
framework's top-level package (``torch = "torch_bridge.adapter:ADAPTER"`` in ``pyproject.toml``). An object is
foreign when a class in its MRO comes from that package; only then is the entry point loaded (so runs that never
touch torch never import it). See docs/design.md, "The torch bridge".
"""
from __future__ import annotations

import functools
import sys
from importlib import metadata
from typing import Any, Callable, Mapping, NamedTuple

from jaxcomposer.errors import ConfigurationError
from jaxcomposer.utils.extras import is_installed

GROUP = "jaxcomposer.adapters"


class Adapter(NamedTuple):
    """What a framework bridge provides.

    ``is_model(obj)``: whether ``obj`` is a model of that framework. ``to_pure_model(obj, example_inputs)``: the
    model as a :class:`jaxcomposer.core.model.PureModel` (example inputs are numpy arrays from the first batch).
    ``to_loader(obj, name)``: the framework's data loader as an iterable of numpy batches, or None when ``obj`` is
    not one (``name`` is the argument, for error messages). ``surgery``: method name -> ``fn(module, **kwargs)``,
    the framework-level surgery a ``model``-slot method runs before conversion (see each method's card for the
    keywords and return value). ``to_task(obj)``: a model that carries its own loss (Composer's ``ComposerModel``
    protocol) as a ready :class:`jaxcomposer.core.model.Task`, or None for a bare model (the Trainer then treats
    it as a classifier).

    The rest serve ``jaxcomposer.functional`` called with the framework's own objects (a Composer user's torch loop;
    :mod:`jaxcomposer.algorithms.functional_io`). ``is_array(obj)``: whether ``obj`` is the framework's array type.
    ``to_array(x)``: that array as a ``jax.Array``, sharing memory (DLPack) where device and dtype allow; it must not
    record gradients. ``from_array(like, array, dtype_like=None)``: a ``jax.Array`` (or numpy array) as the
    framework's array on ``like``'s device, in ``dtype_like``'s dtype when given (a 64-bit input JAX narrowed).
    ``data_format``: the image layout the framework's arrays use by convention (``'NCHW'`` for torch), the default
    of the functional forms' ``data_format`` for its arrays. ``no_grad()``: a context in which calls into the
    framework record no gradients (Composer scores examples under ``torch.no_grad()``). ``functional``: functional
    form name -> its implementation on the framework's models, for the forms that act on a model rather than on
    arrays (``compute_ema`` updates a torch EMA module in place, as Composer's does); called with the caller's
    arguments as given. ``kernels``: kernel name -> a JAX function the framework's libraries provide a faster
    implementation of (torch: ``'conv_general_dilated'``, oneDNN convolutions on CPU); see :func:`kernel`.

    ``classes``: Composer's classes for the framework's users by name (torch: ``ComposerModel``,
    ``HuggingFaceModel``, ``ComposerClassifier``), the objects ``jaxcomposer.models`` hands out for those names
    (see :func:`provided`). ``seed(n)``: seed the framework's global generators (Composer's ``seed_all``);
    ``draw_seed()``: a seed drawn from the framework's global generator, for a random functional form called with
    the framework's arrays and no ``key`` (so ``torch.manual_seed`` governs it, as in Composer).
    ``to_optimizer(optimizer, model)``: the framework's optimizer (a ``torch.optim.Optimizer`` built on the model's
    parameters) as an object with ``tx`` and ``lr`` (checked against ``model`` now), ``bind(bridged) -> tx`` (the
    transformation over the converted model's params), ``load(opt_state) -> opt_state`` (the optimizer's own state
    into the run's), ``set_lr(lr_multiplier)`` (its groups' current LR, after each batch),
    ``save(opt_state, lr_multiplier)`` (the run's state back into the optimizer) and ``surgery`` (``before(model)``
    and ``after(model)`` around the methods' model surgery, which moves the optimizer to the new layers'
    parameters); None for an
    object that is not such an optimizer. ``to_scheduler(scheduler, user_optimizer, where)``: the framework's LR
    scheduler (built on that optimizer) as an object with ``multiplier()`` (its LR over the base LR, now) and
    ``step()``; None for an object that is not one.
    """

    is_model: Callable[[Any], bool]
    to_pure_model: Callable[[Any, Any], Any]
    to_loader: Callable[[Any, str], Any] | None = None
    surgery: Mapping[str, Callable] = {}
    to_task: Callable[[Any], Any] | None = None
    is_array: Callable[[Any], bool] | None = None
    to_array: Callable[[Any], Any] | None = None
    from_array: Callable[..., Any] | None = None
    data_format: str = "NHWC"
    no_grad: Callable[[], Any] | None = None
    functional: Mapping[str, Callable] = {}
    kernels: Mapping[str, Callable] = {}
    classes: Mapping[str, Any] = {}
    seed: Callable[[int], None] | None = None
    draw_seed: Callable[[], int] | None = None
    to_optimizer: Callable[[Any, Any], Any] | None = None
    to_scheduler: Callable[[Any, Any, str], Any] | None = None


@functools.cache
def _entry_points() -> dict[str, metadata.EntryPoint]:
    """The adapters whose framework is installed: ``pip install jaxcomposer`` declares the torch adapter whether
    or not torch came with it (``jaxcomposer[torch]``)."""
    return {ep.name: ep for ep in metadata.entry_points(group=GROUP) if is_installed(ep.name)}


@functools.cache
def _load(name: str) -> Adapter:
    adapter = _entry_points()[name].load()
    if not isinstance(adapter, Adapter):
        raise TypeError(f"entry point {name!r} in {GROUP!r} must name a jaxcomposer Adapter, got {type(adapter).__name__}")
    return adapter


def adapter_for(obj: Any) -> Adapter | None:
    """The adapter of the framework ``obj`` comes from, or None for objects jaxcomposer handles itself."""
    if obj is None:
        return None
    packages = {c.__module__.split(".")[0] for c in type(obj).__mro__}
    for name in _entry_points():
        if name in packages:
            return _load(name)
    return None


def function_adapter(fn: Any) -> Adapter | None:
    """The adapter of the framework a function comes from (``torch.less``), by its module; None for others."""
    package = (getattr(fn, "__module__", None) or "").split(".")[0]
    return _load(package) if package in _entry_points() else None


def is_foreign_model(obj: Any) -> bool:
    """Whether ``obj`` is another framework's model (a torch ``nn.Module``) that an adapter converts."""
    adapter = adapter_for(obj)
    return adapter is not None and adapter.is_model(obj)


def as_task(model: Any) -> Any:
    """``model`` as a Task when its framework's adapter recognises a model with its own loss, else None."""
    adapter = adapter_for(model)
    return None if adapter is None or adapter.to_task is None else adapter.to_task(model)


def array_adapter(obj: Any) -> Adapter | None:
    """The adapter whose framework ``obj`` is an array of (a torch tensor), or None."""
    adapter = adapter_for(obj)
    return adapter if adapter is not None and adapter.is_array is not None and adapter.is_array(obj) else None


def model_adapter(obj: Any) -> Adapter | None:
    """The adapter whose framework ``obj`` is a model of (a torch ``nn.Module``), or None."""
    adapter = adapter_for(obj)
    return adapter if adapter is not None and adapter.is_model(obj) else None


def surgery(method: str, model: Any) -> Callable | None:
    """The framework-level surgery registered for ``method`` on ``model``'s framework, or None."""
    adapter = adapter_for(model)
    return None if adapter is None else adapter.surgery.get(method)


def kernel(framework: str, name: str, *, wanted_by: str) -> Callable:
    """The JAX kernel ``name`` that ``framework``'s adapter provides (loading that adapter, and so the framework).

    ``wanted_by`` names the argument that asked for it, for the error when the adapter or kernel is missing.
    """
    if framework not in _entry_points():
        raise ConfigurationError(f"{wanted_by}: needs the {framework!r} adapter (entry point group {GROUP!r}), which "
                                 f"is not installed; `pip install jaxcomposer[{framework}]`, or choose another "
                                 f"implementation.")
    provided = _load(framework).kernels
    if name not in provided:
        raise ConfigurationError(f"{wanted_by}: the {framework!r} adapter provides no kernel {name!r}; it has "
                                 f"{sorted(provided) or 'none'}.")
    return provided[name]


def installed(framework: str) -> bool:
    """Whether ``framework``'s adapter is installed (without loading it, or the framework)."""
    return framework in _entry_points()


def loaded_kernel(framework: str, name: str) -> Callable | None:
    """The kernel ``name`` of ``framework``'s adapter when this process has loaded that adapter already (something
    asked for one of its kernels or classes), else None: asking never imports the framework."""
    entry = _entry_points().get(framework)
    if entry is None or entry.module not in sys.modules:
        return None
    return _load(framework).kernels.get(name)


def provided(obj: Any, name: str) -> Any:
    """The class ``name`` that the adapter of ``obj``'s framework provides for ``obj`` (``ComposerClassifier`` for a
    torch module), or None when ``obj`` is not another framework's model or its adapter has no such class."""
    adapter = model_adapter(obj)
    return None if adapter is None else adapter.classes.get(name)


def framework_class(framework: str, name: str, *, wanted_by: str) -> Any:
    """The class ``name`` that ``framework``'s adapter provides (loading it, and so the framework)."""
    if framework not in _entry_points():
        raise ImportError(f"{wanted_by} is a {framework} class: it needs the {framework!r} adapter (entry point "
                          f"group {GROUP!r}), which is not installed; `pip install jaxcomposer[{framework}]`")
    classes = _load(framework).classes
    if name not in classes:
        raise ImportError(f"{wanted_by}: the {framework!r} adapter provides no class {name!r}; it has {sorted(classes)}")
    return classes[name]


def seed_frameworks(seed: int, *, load: bool) -> None:
    """Seed every adapter's framework generators; with ``load``, load installed adapters first (an explicit
    ``seed_all``), else seed only frameworks this process has imported (the Trainer: a torch DataLoader or model
    means torch is imported)."""
    for name in _entry_points():
        if load or name in sys.modules:
            adapter = _load(name)
            if adapter.seed is not None:
                adapter.seed(seed)


def generator_states() -> list:
    """The global random generators' states: Python's, numpy's and those of every framework this process has
    imported (its adapter's ``functional['rng_state']``), for :func:`restore_generator_states`. Never imports a
    framework."""
    import random

    import numpy as np
    states = [("random", random.getstate()), ("numpy", np.random.get_state())]
    for name in _entry_points():
        if name in sys.modules:
            get = _load(name).functional.get("rng_state")
            if get is not None:
                states.append((name, get()))
    return states


def restore_generator_states(states: list) -> None:
    """Put the generators back as :func:`generator_states` found them (a try that drew must leave no trace)."""
    import random

    import numpy as np
    for name, state in states:
        if name == "random":
            random.setstate(state)
        elif name == "numpy":
            np.random.set_state(state)
        else:
            _load(name).functional["set_rng_state"](state)

