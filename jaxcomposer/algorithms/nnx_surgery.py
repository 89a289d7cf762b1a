"""Module surgery on Flax NNX graphs, shared by the methods that rewrite a model (BlurPool, SqueezeExcite,
Factorize, GhostBatchNorm, GyroDropout, StochasticDepth, the low-precision norms, WeightStandardization), and
:func:`apply_surgery`, which sends a model to the native surgery or to its framework's. Not a method: it has no
``ENTRY``."""
from __future__ import annotations

from typing import Any, Callable

from flax import nnx

from jaxcomposer.algorithms.functional_io import optimizers_follow
from jaxcomposer.core import adapters


def apply_surgery(method: str, model: Any, native_fn: Callable[[nnx.Module], Any], *, who: str,
                  optimizers: Any = None, **torch_kwargs: Any) -> Any:
    """``native_fn(model)`` for a Flax NNX module; for another framework's module, the surgery its adapter registers
    under the method's name ``method`` (``torch_bridge.methods``), called as ``surgery(model, **torch_kwargs)``
    with a torch optimizer given as ``optimizers`` following the new layers (:func:`optimizers_follow`). Both
    return the method's own result, which is returned.

    Raises TypeError, naming ``who`` (the public function), when ``model`` is neither.
    """
    if isinstance(model, nnx.Module):
        return native_fn(model)
    surgery = adapters.surgery(method, model)
    if surgery is None:
        raise TypeError(f"{who}: expected a flax.nnx.Module or a torch.nn.Module, got {type(model).__name__}.")
    with optimizers_follow(model, optimizers, who):
        return surgery(model, **torch_kwargs)


def set_child(parent: Any, key: Any, value: Any) -> None:
    """Put ``value`` where ``parent`` holds the child ``key`` (an ``nnx.List`` index, a module attribute, or a plain
    list/dict entry)."""
    if isinstance(parent, nnx.List):
        parent[int(key)] = value
    elif isinstance(parent, nnx.Module):
        setattr(parent, str(key), value)
    else:  # a plain list/dict graph node
        parent[key] = value


def find_modules(model: nnx.Module, wanted: Callable[[Any], bool], *, skip: tuple[type, ...] = (),
                 enter_matches: bool = False) -> list[tuple[Any, list]]:
    """``[(module, [(parent, key), ...]), ...]``: each module ``wanted(m)`` selects, with every place that holds it.

    Depth first, children in order (torch's ``modules()`` order, which Composer's ``module_index`` follows); a module
    held by two parents appears once. Modules of the types in ``skip`` (a method's own wrappers: never wrap twice)
    are not searched; selected modules are searched too only with ``enter_matches``.
    """
    refs: dict[int, tuple[Any, list]] = {}
    seen: set[int] = set()

    def walk(node):
        if id(node) in seen:
            return
        seen.add(id(node))
        for key, child in nnx.iter_children(node):
            selected = wanted(child)
            if selected:
                refs.setdefault(id(child), (child, []))[1].append((node, key))
            if (enter_matches or not selected) and not isinstance(child, (nnx.Variable, *skip)):
                walk(child)

    walk(model)
    return list(refs.values())


def replace_found(found: list[tuple[Any, list]], make: Callable[[Any, int], Any]) -> int:
    """Replace each of :func:`find_modules`' modules by ``make(module, index)`` in every place that holds it (one
    shared replacement for a shared module); the number replaced. Every replacement is made before the first edit,
    so a ``make`` that raises leaves the model as it was."""
    made = [(make(module, i), parents) for i, (module, parents) in enumerate(found)]
    for replacement, parents in made:
        for parent, key in parents:
            set_child(parent, key, replacement)
    return len(made)


def replace_modules(model: nnx.Module, wanted: Callable[[Any], bool], make: Callable[[Any, int], Any], *,
                    skip: tuple[type, ...] = (), enter_matches: bool = False) -> int:
    """:func:`find_modules` then :func:`replace_found`: the number of modules replaced."""
    return replace_found(find_modules(model, wanted, skip=skip, enter_matches=enter_matches), make)
