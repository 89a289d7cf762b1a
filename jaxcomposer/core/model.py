"""The pure model protocol the trainer sees, and the task wrappers' base.

A *pure model* is three things: trainable ``params``, non-trainable ``state`` (BatchNorm statistics, ...) and
``apply(params, state, inputs, *, train, key) -> (outputs, new_state)``. Native Flax NNX modules become pure models
through :func:`from_nnx`; bridged torch models (``torch_bridge``) produce the same three things.

A *task* (Composer's ``ComposerModel``) adds what training needs on top: which batch entry is the input, a
per-example loss and per-example metrics. Per-example (shape ``(B,)``) rather than scalar, because then
microbatching, masking padded eval examples and MixUp's ``interpolate_loss`` are all plain weighted sums.
"""
from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING, Any, Callable, Mapping

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from jaxcomposer.core import adapters

if TYPE_CHECKING:
    from jaxcomposer.metrics import Metric

Batch = Mapping[str, Any]
ApplyFn = Callable[..., tuple[Any, Any]]


@dataclasses.dataclass(frozen=True)
class PureModel:
    """``apply(params, state, inputs, *, train, key) -> (outputs, new_state)`` plus the initial trees.

    ``bridged`` is the ``torch_bridge.BridgedModel`` a pure model came from (None for native models).
    ``write_back(params, state) -> module`` puts weights into the user's module object, in place, and returns it:
    the Trainer calls it so that the module a user passed holds the trained weights, as in Composer (None: the
    model has no such object).
    """

    apply: ApplyFn
    params: Any
    state: Any
    bridged: Any = None
    write_back: Callable[[Any, Any], Any] | None = None


def own_copy(tree):
    """Fresh single-device copies of a tree's arrays: the Trainer donates its state's buffers to the next step, so
    a module the user keeps must never share them. Arrays sharded over several processes are gathered whole on
    each, all in one program (a collective: every process calls this at the same point)."""
    device = jax.local_devices()[0]
    leaves, treedef = jax.tree.flatten(tree)
    spread = [i for i, x in enumerate(leaves) if isinstance(x, jax.Array) and not x.is_fully_addressable]
    if spread:  # laid out on the Trainer's mesh (jaxcomposer.parallel): NamedShardings of one mesh
        whole = _replicate([leaves[i] for i in spread], leaves[spread[0]].sharding.mesh)
        for i, x in zip(spread, whole):
            leaves[i] = x.addressable_data(0)
    return treedef.unflatten([jax.device_put(x, device, may_alias=False) if isinstance(x, jax.Array) else x
                              for x in leaves])


def _replicate(arrays: list[jax.Array], mesh) -> list[jax.Array]:
    """Arrays sharded over several processes, replicated on every device of their mesh: one compiled program
    (``multihost_utils.process_allgather`` compiles and runs one per array)."""
    replicated = jax.sharding.NamedSharding(mesh, jax.sharding.PartitionSpec())
    return jax.jit(_identity, out_shardings=[replicated] * len(arrays))(arrays)


def _identity(x):
    return x


def low_precision_dtype(params) -> Any:
    """The 16-bit float dtype every floating leaf of ``params`` has (bf16 under the Trainer's AMP), else None."""
    dtypes = {x.dtype for x in jax.tree.leaves(params) if jnp.issubdtype(x.dtype, jnp.floating)}
    if len(dtypes) == 1 and jnp.finfo(next(iter(dtypes))).bits == 16:
        return next(iter(dtypes))
    return None


def compute_in(module: nnx.Module, dtype) -> None:
    """Make the flax layers of ``module`` whose ``dtype`` is left at its default compute in ``dtype``, in place.

    Given bf16 params, such layers would still compute in float32: ``BatchNorm`` promotes its input to its
    float32 running statistics, and ``Embed`` fixes its dtype to its float32 table's at construction, so every
    layer after them would run in float32 too. A ``dtype`` a layer was built with stays (``Embed``'s excepted,
    which cannot be told from its default: so a transformer's residual stream, starting at its embedding, is bf16,
    where torch's autocast keeps it float32; a model wanting that casts the embedding's output itself).
    ``from_nnx`` does this to the fresh copy each step builds, never to the user's module."""
    for _, layer in nnx.iter_modules(module):
        if not type(layer).__module__.startswith("flax.") or not hasattr(layer, "param_dtype"):
            continue
        default = getattr(layer, "dtype", None) is None or (
            isinstance(layer, nnx.Embed) and layer.dtype == layer.param_dtype)
        if default:
            layer.dtype = dtype


def from_nnx(module: nnx.Module) -> PureModel:
    """Split an NNX module into a pure model.

    The module's ``__call__`` must accept ``(inputs, *, train: bool, key: jax.Array | None)``: ``train`` switches
    dropout and BatchNorm, ``key`` feeds every random op, so the pure function owns all of its randomness. Given
    16-bit params (the Trainer's ``precision='amp_bf16'``), flax's layers compute in that dtype where their own
    ``dtype`` is left at its default (:func:`compute_in`); normalization statistics stay float32.
    """
    graphdef, params, state = nnx.split(module, nnx.Param, ...)

    def apply(params, state, inputs, *, train: bool, key=None):
        # copy=True: fresh Variables at the current trace level, so BatchNorm may update them under jax.grad
        live = nnx.merge(graphdef, params, state, copy=True)
        low = low_precision_dtype(params)
        if low is not None:
            compute_in(live, low)
        outputs = live(inputs, train=train, key=key)
        _, _, new_state = nnx.split(live, nnx.Param, ...)
        return outputs, new_state

    def write_back(params, state) -> nnx.Module:
        nnx.update(module, own_copy(params), own_copy(state))
        return module

    return PureModel(apply=apply, params=params, state=state, write_back=write_back)


def to_pure_model(model: Any, example_inputs: Any = None) -> PureModel:
    """Native NNX modules, objects with ``as_pure_model()`` (bridged torch models) and other frameworks' modules
    (through their adapter, given example inputs) as pure models."""
    if isinstance(model, PureModel):
        return model
    if isinstance(model, nnx.Module):
        return from_nnx(model)
    if hasattr(model, "as_pure_model"):  # torch_bridge.BridgedModel
        return model.as_pure_model()
    if adapters.is_foreign_model(model):
        if example_inputs is None:
            raise TypeError(f"model: a {type(model).__name__} needs example inputs to be converted; the Trainer takes "
                            "them from the first batch, or call task.bind(batch) yourself.")
        return adapters.adapter_for(model).to_pure_model(model, example_inputs)
    raise TypeError(
        f"model: expected a flax.nnx.Module, a torch.nn.Module or a jaxcomposer PureModel, got {type(model).__name__}.")


def param_path(keypath) -> tuple[str, ...]:
    """A param's path as strings: dict keys (a bridged model's ``'layer1.0.conv1.weight'`` split on dots, so modules
    become levels), sequence indices; the ``.value`` inside an ``nnx.Variable`` is not a level."""
    out: list[str] = []
    for k in keypath:
        if isinstance(k, jax.tree_util.DictKey):
            out.extend(str(k.key).split("."))
        elif isinstance(k, jax.tree_util.SequenceKey):
            out.append(str(k.idx))
        elif isinstance(k, jax.tree_util.FlattenedIndexKey):
            out.append(str(k.key))
    return tuple(out)


def param_use_order(forward: Callable, params: Any, state: Any, batch: Batch) -> tuple[tuple[str, ...], ...]:
    """Param paths in the order ``forward(params, state, batch, train=True, key=...)`` first reads them.

    Read off the forward's jaxpr, so it is the same for NNX and bridged torch models and needs no definition
    order (which ``nnx.clone`` loses). Params first read by the same equation (a nested jit that takes a whole
    layer) are ordered inside it when the equation carries one sub-jaxpr, else by their flatten order.
    """
    leaves = jax.tree_util.tree_flatten_with_path(params)[0]
    paths = [param_path(kp) for kp, _ in leaves]
    closed = jax.make_jaxpr(lambda p: forward(p, state, batch, train=True, key=jax.random.PRNGKey(0))[0])(params)
    order: list[int] = []
    seen: set[int] = set()

    def visit(jaxpr, index: dict) -> None:
        for eqn in jaxpr.eqns:
            hits = [(i, v) for i, v in enumerate(eqn.invars) if _is_var(v) and v in index]
            if not hits:
                continue
            subs = [j for j in eqn.params.values() if hasattr(j, "eqns") or hasattr(j, "jaxpr")]
            sub = subs[0] if len(subs) == 1 else None
            sub = getattr(sub, "jaxpr", sub)
            if sub is not None and len(sub.invars) == len(eqn.invars):
                visit(sub, {sub.invars[i]: index[v] for i, v in hits})
            for leaf in sorted(index[v] for _, v in hits):
                if leaf not in seen:
                    seen.add(leaf)
                    order.append(leaf)

    visit(closed.jaxpr, {v: i for i, v in enumerate(closed.jaxpr.invars)})
    order += [i for i in range(len(paths)) if i not in seen]  # params the forward never reads go last
    return tuple(paths[i] for i in order)


def _is_var(v) -> bool:
    return type(v).__name__ != "Literal"


class Task:
    """Base of the task wrappers (Composer's ``ComposerModel``).

    Subclasses set ``input_key`` and implement ``loss``, one value per example. Evaluation asks ``get_metrics``
    for the metrics (``jaxcomposer.metrics``: pure sum states, run inside the jitted eval step) and feeds each of
    them ``metric_inputs(outputs, batch)``.
    """

    input_key: str = "input"
    target_key: str = "target"
    num_classes: int | None = None

    def __init__(self, model: Any):
        # A foreign (torch) module is converted once example inputs are known (``bind``); the rest converts now.
        self.source = model
        self._pure = None if adapters.is_foreign_model(model) else to_pure_model(model)

    @property
    def pure(self) -> PureModel:
        if self._pure is None:
            raise RuntimeError(f"{type(self).__name__}: the torch module is not converted yet; it needs example "
                               "inputs: task.bind(batch) (the Trainer does this with the first batch).")
        return self._pure

    @pure.setter
    def pure(self, value: PureModel) -> None:
        self._pure = value

    @property
    def user_model(self) -> Any:
        """The model as the user sees it (``state.model``): ``source``, unless a wrapper holds it (a torch
        ``ComposerClassifier``, whose ``module`` is the source)."""
        return self.source

    def user_param_name(self, name: str) -> str:
        """A parameter's name (its dotted path in ``params``) as the user's model names it (``state.model``'s
        ``named_parameters()`` for a torch model)."""
        return name

    @property
    def is_bound(self) -> bool:
        return self._pure is not None

    def bind(self, batch: Batch) -> "Task":
        """Convert a torch module using ``batch`` as the example inputs (a no-op for models already pure)."""
        if self._pure is None:
            self._pure = to_pure_model(self.source, self.model_inputs(batch))
        return self

    def model_inputs(self, batch: Batch):
        """What the model is called with, taken from a batch."""
        return batch[self.input_key]

    @property
    def params(self):
        return self.pure.params

    @property
    def state(self):
        return self.pure.state

    def with_model(self, model: Any) -> "Task":
        """A copy of this task around another model (surgery returns new objects, it never edits in place)."""
        new = object.__new__(type(self))
        new.__dict__.update(self.__dict__)
        new.source, new._pure = model, (None if adapters.is_foreign_model(model) else to_pure_model(model))
        return new

    def forward(self, params, state, batch: Batch, *, train: bool, key=None):
        return self.pure.apply(params, state, self.model_inputs(batch), train=train, key=key)

    def loss(self, outputs, batch: Batch) -> jax.Array:  # (B,)
        raise NotImplementedError

    def get_metrics(self, is_train: bool = False) -> dict[str, Metric]:
        """The evaluation metrics by name, as Composer's ``ComposerModel.get_metrics`` (the Trainer asks with
        ``is_train=False``); none by default."""
        return {}

    def metric_inputs(self, outputs, batch: Batch) -> tuple[Any, Any]:
        """What every metric's ``update`` compares: ``(predictions, targets)``."""
        return outputs, batch[self.target_key]

    def num_samples(self, batch: Batch) -> int:
        return int(jax.tree_util.tree_leaves(batch[self.input_key])[0].shape[0])

    def num_tokens(self, batch: Batch) -> int:
        return 0
