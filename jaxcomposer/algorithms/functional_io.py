"""The one conversion layer of the functional forms: the caller's arrays in, the caller's type out.

``jaxcomposer.functional`` is Composer's ``composer.functional`` for anyone's own loop, including a Composer user's
torch loop that calls it unchanged. So every functional form accepts JAX arrays, numpy arrays and the arrays of any
framework with an adapter (torch tensors, through ``torch_bridge``; see :mod:`jaxcomposer.core.adapters`), and
returns results of the type it was given: torch in, torch out; numpy in, numpy out; JAX in, JAX out. Forms that
Composer lets take PIL images (``colout_batch``, ``cutout_batch``) take them here too and return PIL images.

Why a decorator rather than conversions in each form: the rules below must be the same for every form, and the
forms' bodies stay plain JAX (the Method factories call the same functions inside jit, where the first rule makes
the decorator a pass-through that costs one signature bind at trace time).

- **Which type is the caller's.** The first array argument the form declares (``arrays=``) decides; the other
  array arguments are converted whatever their type. JAX arrays (and tracers) pass through untouched.
- **Zero-copy where possible.** Framework arrays cross through the adapter's ``to_array``/``from_array``
  (DLPack: no copy when JAX can address the device and dtype and the buffer is aligned as XLA needs). numpy arrays go in with ``jnp.asarray`` and come
  back as ``np.asarray`` views of the results, which numpy marks read-only (copy them to write in place). A result
  that *is* an input (``resize_batch`` at scale 1, ``cutout_batch`` with no holes) comes back as the caller's own
  object, as in Composer.
- **64-bit dtypes.** JAX runs with x64 off, so int64 targets and float64 images compute as int32 / float32. A
  result in the 32-bit dtype an input was narrowed to comes back in the input's 64-bit dtype (torch's
  ``cross_entropy`` needs int64 targets), unless some input had that 32-bit dtype itself.
- **Layout.** ``data_format=None`` (the default of every form that has it) becomes the caller's convention:
  the adapter's (``'NCHW'`` for torch, as Composer's tensors) for framework arrays, ``'NHWC'`` for JAX arrays,
  numpy arrays and PIL images (which are ``(H, W, C)``).
- **Callables** (``select_using_loss``'s ``model`` and ``loss_fun``) of a framework caller are called with the
  caller's arrays, under the adapter's ``no_grad()`` (Composer scores under ``torch.no_grad()``), and their results
  cross back to JAX.
- **Models** (``models=``): a framework model (a torch ``nn.Module``) goes, with the arguments as given, to the
  adapter's own implementation of the form (``compute_ema`` updates a torch EMA module in place, as Composer's);
  a form without one refuses the model by name.
- **Global generators.** A random form called with torch tensors (numpy arrays, PIL images) and no ``key`` draws
  its key from torch's (numpy's) global generator, as Composer's forms draw from them, so ``torch.manual_seed``
  makes a Composer torch loop repeat; the draw happens only when the call needs randomness. JAX arrays keep
  requiring ``key=``, the JAX way (:func:`require_key`).
- **Keys.** A JAX PRNG key given to any argument but ``key`` is refused with a ``TypeError``: the key became
  keyword-only so that Composer's positional arguments keep their places, and an old call that passed it
  positionally must fail loudly, not mix with a key as the mixing coefficient. :func:`require_key` is the one
  message for a random call without ``key=``.
"""
from __future__ import annotations

import contextlib
import functools
import inspect
from typing import Any, Callable, Sequence

import jax
import jax.numpy as jnp
import numpy as np
from PIL import Image

from jaxcomposer.algorithms.augmentation_primitives import hwc_from_pil, pil_from_hwc
from jaxcomposer.core import adapters
from jaxcomposer.errors import MissingKeyError

__all__ = ["functional_form", "require_key", "optimizers_follow"]

_KEY_ARGUMENTS = ("key", "rng")  # the parameters that legitimately take a PRNG key


class GlobalKey:
    """The key of a random call made with a framework's or numpy's arrays and no ``key``: drawn from that
    framework's global generator (``torch.manual_seed`` / ``np.random.seed`` govern it, as they govern Composer's
    forms) only when the call needs randomness, so a call that draws nothing leaves the generator alone."""

    def __init__(self, draw_seed: Callable[[], int]):
        self.draw_seed = draw_seed

    def draw(self) -> jax.Array:
        return jax.random.key(self.draw_seed())


def _numpy_seed() -> int:
    return int(np.random.randint(0, 2**31 - 1))


def require_key(key: Any, where: str, why: str) -> Any:
    """``key`` (a :class:`GlobalKey` drawn now), or a :class:`MissingKeyError` naming the function (``where``) and
    what it draws (``why``)."""
    if isinstance(key, GlobalKey):
        return key.draw()
    if key is None:
        raise MissingKeyError(
            f"{where}: pass key=jax.random.key(0) (any JAX PRNG key, a new one per call): this call draws {why}. "
            "JAX arrays never draw from a global random state (torch tensors and numpy arrays without key= draw "
            "from torch's and numpy's, as Composer's forms do).")
    return key


def _is_prng_key(x: Any, legacy: bool) -> bool:
    """A typed JAX key; with ``legacy``, also a raw ``uint32[2]`` JAX array (``jax.random.PRNGKey``'s)."""
    if not isinstance(x, jax.Array):
        return False
    if jax.dtypes.issubdtype(x.dtype, jax.dtypes.prng_key):
        return True
    return legacy and x.dtype == jnp.uint32 and x.shape == (2,)


class _Caller:
    """How one call's arrays came in, so that its results go back the same way."""

    def __init__(self, kind: str | None, adapter: adapters.Adapter | None, like: Any):
        self.kind, self.adapter, self.like = kind, adapter, like  # kind: 'jax', 'numpy', 'pil', 'foreign', None
        self.originals: dict[int, Any] = {}  # id(converted array) -> the caller's object
        self.keep: list[Any] = []  # the converted arrays, alive for the call so their ids stay unique
        self.narrowed: dict[np.dtype, Any] = {}  # JAX's 32-bit dtype -> a caller array with the 64-bit one
        self.native: set[np.dtype] = set()  # dtypes some input had unchanged
        self.pil: Image.Image | None = None

    @classmethod
    def of(cls, value: Any, pil: bool) -> "_Caller":
        leaves = jax.tree_util.tree_leaves(value)
        first = leaves[0] if leaves else None
        if isinstance(first, jax.Array):
            return cls("jax", None, first)
        if isinstance(first, np.ndarray):
            return cls("numpy", None, first)
        if pil and isinstance(first, Image.Image):
            return cls("pil", None, first)
        adapter = adapters.array_adapter(first) if first is not None else None
        if adapter is not None and adapter.to_array is not None and adapter.from_array is not None:
            return cls("foreign", adapter, first)
        return cls(None, None, first)

    def _record(self, original: Any, converted: jax.Array) -> jax.Array:
        self.originals[id(converted)] = original
        self.keep.append(converted)
        dt, orig_dt = np.dtype(converted.dtype), getattr(original, "dtype", None)
        itemsize = getattr(original, "itemsize", None) or getattr(orig_dt, "itemsize", None)
        if itemsize is not None and itemsize > dt.itemsize:
            self.narrowed.setdefault(dt, original)
        else:
            self.native.add(dt)
        return converted

    def to_jax(self, x: Any, pil: bool = False, host: bool = False) -> Any:
        """One leaf of an argument as a JAX array (a numpy array with ``host``); anything that is not an array is
        returned as is."""
        if isinstance(x, jax.Array) or x is None:
            return x
        if isinstance(x, np.ndarray):
            return x if host else self._record(x, jnp.asarray(x))
        if pil and isinstance(x, Image.Image):
            self.pil = self.pil or x
            return self._record(x, hwc_from_pil(x) if host else jnp.asarray(hwc_from_pil(x)))
        adapter = adapters.array_adapter(x)
        if adapter is not None and adapter.to_array is not None:
            converted = adapter.to_array(x)
            return self._record(x, np.asarray(converted) if host else converted)
        return x

    def back(self, leaf: Any) -> Any:
        """One leaf of a result in the caller's type."""
        if not isinstance(leaf, (jax.Array, np.ndarray)) or isinstance(leaf, jax.core.Tracer):
            return leaf  # a traced result (a form called under the caller's own jit) stays traced
        if id(leaf) in self.originals:
            return self.originals[id(leaf)]
        if self.kind == "jax":
            return jnp.asarray(leaf)  # host forms (augmix_image) compute in numpy
        dt = np.dtype(leaf.dtype)
        widen = self.narrowed.get(dt) if dt not in self.native else None
        if self.kind == "foreign":
            return self.adapter.from_array(self.like, leaf, widen)
        out = np.asarray(leaf)
        if widen is not None:
            out = out.astype(widen.dtype)
        if self.kind == "pil" and out.ndim == 3:
            image = pil_from_hwc(out)
            if self.pil is not None and self.pil.mode == "P" and image.mode == "L":
                image.putpalette(self.pil.getpalette())  # palette indices stay indices of the same palette
            return image
        return out

    def wrap_callable(self, f: Callable) -> Callable:
        """``f`` called with the caller's arrays, without recording gradients, its results as JAX arrays."""

        @functools.wraps(f)
        def call(*args, **kwargs):
            args, kwargs = jax.tree_util.tree_map(self.back, (args, kwargs))
            with self.adapter.no_grad() if self.adapter.no_grad is not None else contextlib.nullcontext():
                out = f(*args, **kwargs)
            return jax.tree_util.tree_map(self.to_jax, out)

        return call


def functional_form(*, arrays: Sequence[str], models: Sequence[str] = (), callables: Sequence[str] = (),
                    pil: bool = False, host: bool = False) -> Callable[[Callable], Callable]:
    """Make ``fn`` a functional form that takes and returns the caller's array types (see the module docstring).

    ``arrays``: the parameters holding arrays (or tuples / pytrees of arrays), the first of them deciding the
    caller's type. ``models``: parameters that may hold a framework model, sent to the adapter's implementation
    of ``fn.__name__``. ``callables``: parameters holding functions of arrays, called in the caller's framework.
    ``pil``: PIL images are accepted (as ``(H, W, C)`` arrays) and returned as PIL images. ``host``: the form
    computes in numpy on the host (``augmix_image``), so arrays cross as numpy arrays rather than JAX arrays.
    """

    def decorate(fn: Callable) -> Callable:
        sig = inspect.signature(fn)
        where = fn.__name__
        has_layout = "data_format" in sig.parameters

        @functools.wraps(fn)
        def wrapper(*args, **kwargs):
            bound = sig.bind(*args, **kwargs)
            given = bound.arguments
            for name in models:
                adapter = adapters.model_adapter(given.get(name))
                if adapter is not None:
                    impl = adapter.functional.get(where)
                    if impl is None:
                        raise TypeError(f"{where}: {name} is a {type(given[name]).__module__}."
                                        f"{type(given[name]).__name__}, a model of another framework, which "
                                        f"{where} does not take; pass its weights as a JAX pytree.")
                    return impl(*bound.args, **bound.kwargs)  # as passed: no defaults of ours added
            for name, value in given.items():
                if name in _KEY_ARGUMENTS or name in models or name in callables:
                    continue  # weight pytrees and modules may hold keys of their own (nnx.Rngs)
                # a data array is refused only when it is a key itself; a scalar argument also as a raw uint32[2]
                leaves = [value] if name in arrays else jax.tree_util.tree_leaves(value)
                if any(_is_prng_key(v, legacy=name not in arrays) for v in leaves):
                    raise TypeError(f"{where}: {name} got a JAX PRNG key; pass it as key=... instead. The key is "
                                    f"keyword-only so that Composer's positional arguments keep their places, "
                                    f"and {name} is {where}'s argument in that position.")
            present = [given[n] for n in arrays if given.get(n) is not None]
            caller = _Caller.of(present[0] if present else None, pil)
            if has_layout and given.get("data_format") is None:
                given["data_format"] = caller.adapter.data_format if caller.kind == "foreign" else "NHWC"
            if "key" in sig.parameters and given.get("key") is None and caller.kind in ("foreign", "numpy", "pil"):
                draw = caller.adapter.draw_seed if caller.kind == "foreign" else _numpy_seed
                if draw is not None:  # Composer's forms draw from torch's / numpy's global generators
                    given["key"] = GlobalKey(draw)
            if caller.kind in (None, "jax"):
                out = fn(*bound.args, **bound.kwargs)
                return out if caller.kind is None else jax.tree_util.tree_map(caller.back, out)
            for name in arrays:
                if given.get(name) is not None:
                    given[name] = jax.tree_util.tree_map(lambda x: caller.to_jax(x, pil, host), given[name])
            if caller.kind == "foreign":
                for name in callables:
                    if callable(given.get(name)):
                        given[name] = caller.wrap_callable(given[name])
            out = fn(*bound.args, **bound.kwargs)
            return jax.tree_util.tree_map(caller.back, out)

        return wrapper

    return decorate


@contextlib.contextmanager
def optimizers_follow(model: Any, optimizers: Any, where: str):
    """Composer's ``optimizers=`` of a surgery form: an optimizer of the model's framework, built on
    ``model.parameters()``, holds the new layers' parameters after the surgery inside this block (Composer's
    ``update_params_in_optimizer``: replaced parameters leave it, new ones join group 0). An NNX model's optimizer
    state is built from its params after surgery, so it takes none."""
    if optimizers is None:
        yield
        return
    adapter = adapters.model_adapter(model)
    follower = None if adapter is None else adapter.functional.get("surgery_follower")
    if follower is None:
        raise TypeError(f"{where}: optimizers= keeps a torch optimizer on a torch model's parameters; "
                        f"{type(model).__name__} is not such a model (an optax state is built from the params after "
                        "surgery): pass optimizers=None")
    follower = follower(optimizers)
    follower.before(model)
    yield
    follower.after(model)
