"""One mesh for every kind of parallelism: data parallel, FSDP and tensor parallel are axes of it.

The mesh has three axes, ``("data", "fsdp", "tensor")``:

- ``data``: replicas of the whole state; the batch is split over it (DDP; the replicate groups of HYBRID_SHARD);
- ``fsdp``: the batch is split over it too, and parameters, gradients and optimizer state are sharded over it
  (ZeRO: each device keeps 1/N of the state, and XLA gathers a weight where the step needs it whole);
- ``tensor``: attention heads and MLP hidden units are split over it (Megatron-style); the batch is not.

How parameters are sharded is decided per array, from its shape and the model's logical axes
(``jaxcomposer.models.sharding``): ``fsdp`` takes the largest dimension it divides that ``tensor`` has not taken,
so FSDP needs no annotations and works for bridged torch models as well (by parameter size: arrays below
``min_shard_size`` elements stay replicated, where gathering would cost more than it saves); ``tensor`` takes the
dimensions a model names ``heads`` or ``mlp``, so tensor parallelism needs a model with ``PARTITION_RULES``.
Sharding never changes what a step computes, only where: every layout trains to the same parameters up to the
order of floating-point sums.

The options keep Composer's names (``parallelism_config={'fsdp': {...}, 'tp': {...}}``, or the older
``fsdp_config``); see :func:`parse_parallelism`.
"""
from __future__ import annotations

import dataclasses
import difflib
import warnings
import zlib
from typing import Any, Mapping, Sequence

import jax
import numpy as np
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P

from jaxcomposer.errors import ConfigurationError

MESH_AXES = ("data", "fsdp", "tensor")
BATCH_AXES = ("data", "fsdp")  # the batch dimension is split over both; the tensor axis sees whole batches
TENSOR_LOGICAL_AXES = ("heads", "mlp")  # what tensor parallelism splits (jaxcomposer.models.sharding's names)

# torch FSDP's sharding strategies (Composer passes them through): (parameters sharded at rest, gradients and
# optimizer state sharded). The hybrid ones shard within a replicate group (``data_parallel_replicate_degree``).
SHARDING_STRATEGIES = {
    "FULL_SHARD": (True, True),
    "SHARD_GRAD_OP": (False, True),
    "NO_SHARD": (False, False),
    "HYBRID_SHARD": (True, True),
    "_HYBRID_SHARD_ZERO2": (False, True),
}
_FSDP_KEYS = {"sharding_strategy", "data_parallel_shard_degree", "data_parallel_replicate_degree", "min_shard_size",
              "reshard_after_forward"}
# Composer's FSDPConfig/FSDP2Config fields that steer torch's wrapper (prefetching, wrapping, offload, state-dict
# formats): XLA schedules gathers and frees buffers itself, and checkpoints are always sharded and elastic here,
# so these are accepted (a Composer YAML runs unchanged) and have no effect
_FSDP_TORCH_ONLY_KEYS = {
    "activation_checkpointing", "activation_checkpointing_reentrant", "activation_cpu_offload", "auto_wrap",
    "te_checkpoint_wrapper", "te_shard_fp8_weight", "backward_prefetch", "backward_prefetch_limit", "cpu_offload",
    "forward_prefetch", "forward_prefetch_limit", "ignored_modules", "keep_low_precision_grads",
    "limit_all_gathers", "load_monolith_rank0_only", "load_planner", "mixed_precision", "save_planner",
    "sharded_ckpt_prefix_dir", "state_dict_type", "sync_module_states", "use_orig_params", "verbose",
    "process_group", "device_mesh"}
_TP_KEYS = {"tensor_parallel_degree"}
_TP_TORCH_ONLY_KEYS = {"layer_plan"}  # torch parallel styles per module; ours come from the model's PARTITION_RULES


@dataclasses.dataclass(frozen=True)
class Parallelism:
    """The mesh's shape and what is sharded over its ``fsdp`` axis."""

    data: int = 1
    fsdp: int = 1
    tensor: int = 1
    shard_params: bool = False  # parameters sharded at rest (FULL_SHARD); else gathered between steps
    shard_optimizer: bool = False  # gradients and optimizer (and method) state sharded
    min_shard_size: int = 1024

    @property
    def shape(self) -> tuple[int, int, int]:
        return self.data, self.fsdp, self.tensor

    @property
    def batch_ways(self) -> int:
        """How many pieces the batch dimension is split into."""
        return self.data * self.fsdp

    def describe(self) -> str:
        parts = [f"{n} {name}" for name, n in zip(MESH_AXES, self.shape) if n > 1] or ["1 device"]
        what = ("params, grads and optimizer state sharded" if self.shard_params else
                "grads and optimizer state sharded" if self.shard_optimizer else "state replicated")
        return " x ".join(parts) + f" ({what})"


def parse_parallelism(parallelism_config: Mapping | None, fsdp_config: Mapping | None, num_devices: int, *,
                      num_processes: int = 1) -> Parallelism:
    """Composer's ``parallelism_config`` (``{'fsdp': {...}, 'tp': {...}}``; ``fsdp2`` is read as ``fsdp``) or its
    older ``fsdp_config`` as a :class:`Parallelism` over ``num_devices``. Raises ``ConfigurationError`` naming the
    key, the value and what was expected.

    ``fsdp`` keys with an effect: ``sharding_strategy`` (one of :data:`SHARDING_STRATEGIES`, default FULL_SHARD;
    FSDP2's ``reshard_after_forward: false`` means SHARD_GRAD_OP), ``data_parallel_shard_degree`` (-1: the devices
    left over), ``data_parallel_replicate_degree`` (default 1; the number of processes for the hybrid strategies)
    and, ours, ``min_shard_size`` (arrays with fewer elements stay replicated; default 1024). ``tp``:
    ``tensor_parallel_degree``. Composer's other FSDP keys steer torch's wrapper and are accepted without effect.
    Without ``fsdp`` every device is a data-parallel replica (after the tensor axis).
    """
    if fsdp_config is not None and parallelism_config is not None:
        raise ConfigurationError("fsdp_config: given together with parallelism_config; put it under "
                                 "parallelism_config={'fsdp': {...}} (Composer's current form) and drop fsdp_config")
    config = dict(parallelism_config or {})
    if fsdp_config is not None:
        config = {"fsdp": fsdp_config}
    _check_keys(config, {"fsdp", "fsdp2", "tp"}, set(), "parallelism_config")
    if "fsdp" in config and "fsdp2" in config:
        raise ConfigurationError("parallelism_config: both 'fsdp' and 'fsdp2' given; they are one thing here, "
                                 "keep one")
    fsdp_where = "parallelism_config.fsdp2" if "fsdp2" in config else \
        ("fsdp_config" if fsdp_config is not None else "parallelism_config.fsdp")
    fsdp = config.get("fsdp", config.get("fsdp2"))
    tp = config.get("tp")
    fsdp = None if fsdp is None else _as_dict(fsdp, fsdp_where)
    tp = {} if tp is None else _as_dict(tp, "parallelism_config.tp")
    _check_keys(tp, _TP_KEYS, _TP_TORCH_ONLY_KEYS, "parallelism_config.tp")
    tensor = _positive_int(tp.get("tensor_parallel_degree", 1), "parallelism_config.tp.tensor_parallel_degree")
    if num_devices % tensor:
        raise ConfigurationError(f"parallelism_config.tp.tensor_parallel_degree: {tensor} does not divide the "
                                 f"{num_devices} devices; choose a divisor of {num_devices}")
    if fsdp is None:
        return Parallelism(data=num_devices // tensor, tensor=tensor)

    _check_keys(fsdp, _FSDP_KEYS, _FSDP_TORCH_ONLY_KEYS, fsdp_where)
    default_strategy = "FULL_SHARD" if fsdp.get("reshard_after_forward", True) else "SHARD_GRAD_OP"
    strategy = str(fsdp.get("sharding_strategy", default_strategy)).upper()
    if strategy not in SHARDING_STRATEGIES:
        raise ConfigurationError(f"{fsdp_where}.sharding_strategy: got {fsdp['sharding_strategy']!r}, expected one "
                                 f"of {sorted(SHARDING_STRATEGIES)}{_did_you_mean(strategy, SHARDING_STRATEGIES)}")
    hybrid = strategy in ("HYBRID_SHARD", "_HYBRID_SHARD_ZERO2")
    replicate = fsdp.get("data_parallel_replicate_degree")
    replicate = (num_processes if hybrid else 1) if replicate is None else \
        _positive_int(replicate, f"{fsdp_where}.data_parallel_replicate_degree")
    shard = fsdp.get("data_parallel_shard_degree", -1)
    if shard == -1:
        if num_devices % (replicate * tensor):
            raise ConfigurationError(
                f"{fsdp_where}.data_parallel_replicate_degree: {replicate} x tensor_parallel_degree {tensor} does "
                f"not divide the {num_devices} devices")
        shard = num_devices // (replicate * tensor)
    shard = _positive_int(shard, f"{fsdp_where}.data_parallel_shard_degree")
    if replicate * shard * tensor != num_devices:
        raise ConfigurationError(
            f"{fsdp_where}: data_parallel_replicate_degree {replicate} x data_parallel_shard_degree {shard} x "
            f"tensor_parallel_degree {tensor} = {replicate * shard * tensor}, but there are {num_devices} devices; "
            "set data_parallel_shard_degree: -1 to use the devices left over")
    min_size = fsdp.get("min_shard_size", 1024)
    if not isinstance(min_size, int) or isinstance(min_size, bool) or min_size < 0:
        raise ConfigurationError(f"{fsdp_where}.min_shard_size: got {min_size!r}, expected an int >= 0 (arrays with "
                                 "fewer elements stay replicated)")
    shard_params, shard_optimizer = SHARDING_STRATEGIES[strategy]
    return Parallelism(data=replicate, fsdp=shard, tensor=tensor, shard_params=shard_params,
                       shard_optimizer=shard_optimizer, min_shard_size=min_size)


def make_mesh(parallelism: Parallelism, devices: Any = None) -> Mesh:
    """The ``(data, fsdp, tensor)`` mesh, in the order of ``devices`` (default ``jax.devices()``: each process's
    devices together, so each process feeds one contiguous block of the batch, and the tensor axis, innermost,
    stays within a host)."""
    devices = np.asarray(devices if devices is not None else jax.devices()).reshape(-1)
    if devices.size != int(np.prod(parallelism.shape)):
        raise ConfigurationError(f"parallelism: a {'x'.join(map(str, parallelism.shape))} mesh needs "
                                 f"{int(np.prod(parallelism.shape))} devices, got {devices.size}")
    return Mesh(devices.reshape(parallelism.shape), MESH_AXES)


def batch_sharding(mesh: Mesh, leading: int = 0) -> NamedSharding:
    """Batches split over ``data`` and ``fsdp``; ``leading`` unsplit dimensions first (stacked microbatches)."""
    return NamedSharding(mesh, P(*(None,) * leading, BATCH_AXES))


def process_rows_to_global(batch: Mapping[str, Any], sharding: NamedSharding) -> dict:
    """This process's rows of a batch as the global batch's arrays (each process passes its own rows, in process
    order; ``jax.make_array_from_process_local_data``). With one process it is a plain ``device_put``."""
    if jax.process_count() == 1:
        return jax.device_put(dict(batch), sharding)
    return {k: jax.make_array_from_process_local_data(sharding, np.asarray(v)) for k, v in batch.items()}


def same_on_every_process(tree: Any, shardings: Any, *, verify: str | None = None) -> Any:
    """Values every process holds whole (an eval batch, a restored checkpoint, the initial train state) as fresh
    global arrays laid out by ``shardings`` (one sharding, or a tree of them shaped like ``tree``).

    With several processes, each builds only its own shards from its own copy (``jax.make_array_from_callback``):
    no array crosses processes. ``jax.device_put`` would instead check its input by all-gathering every array whole
    onto every process (the whole model to each host, one collective per array). ``verify`` names the values for
    the error when they must be checked: one all-gather of a CRC32 per array, and a clear error naming the first
    array that differs."""
    if isinstance(shardings, jax.sharding.Sharding):
        shardings = jax.tree.map(lambda _: shardings, tree)
    if all(s.is_fully_addressable for s in jax.tree.leaves(shardings)):  # one process (or no leaves at all)
        return jax.device_put(tree, shardings, may_alias=False)
    hosts = jax.tree.map(np.asarray, tree)
    if verify is not None:
        _check_same_on_every_process(hosts, verify)
    return jax.tree.map(lambda x, s: jax.make_array_from_callback(x.shape, s, lambda index: x[index]),
                        hosts, shardings)


def _check_same_on_every_process(hosts: Any, what: str) -> None:
    from jax.experimental import multihost_utils

    paths, leaves = zip(*jax.tree_util.tree_leaves_with_path(hosts))
    local = np.array([array_crc32(x) for x in leaves], np.uint32)
    first = differing_array(multihost_utils.process_allgather(local))
    if first is not None:
        raise ConfigurationError(
            f"{what}: {jax.tree_util.keystr(paths[first])} differs between processes (their CRC32s differ); every "
            "process must build the same model and state (the same seed, the same checkpoint), since the run "
            "shards one state over all of them")


def array_crc32(x: np.ndarray) -> int:
    """CRC32 of an array's bytes (C order), of any dtype."""
    return zlib.crc32(np.ascontiguousarray(x).reshape(-1).view(np.uint8))


def differing_array(crcs: np.ndarray) -> int | None:
    """The first array whose checksum is not the same on every process (``crcs``: processes x arrays), or None."""
    differs = np.flatnonzero((crcs != crcs[:1]).any(axis=0))
    return int(differs[0]) if differs.size else None


def replicated(mesh: Mesh) -> NamedSharding:
    return NamedSharding(mesh, P())


def param_specs(params: Any, parallelism: Parallelism, logical: Mapping[str, tuple] | None = None, *,
                shard_fsdp: bool = True) -> Any:
    """A ``PartitionSpec`` per parameter (same tree as ``params``). ``logical`` maps a parameter's path
    (``blocks/0/attn/qkv/kernel``) to its logical axes; ``shard_fsdp=False`` gives the tensor split alone (the
    layout of parameters at rest under SHARD_GRAD_OP)."""
    def spec(keypath, x):
        dims: list[Any] = [None] * len(x.shape)
        names = (logical or {}).get(_path(keypath), ())
        if parallelism.tensor > 1:
            for i, name in enumerate(names):
                if name in TENSOR_LOGICAL_AXES and x.shape[i] % parallelism.tensor == 0:
                    dims[i] = "tensor"
                    break
        if shard_fsdp and parallelism.fsdp > 1 and x.size >= parallelism.min_shard_size:
            free = [i for i, d in enumerate(dims) if d is None and x.shape[i] % parallelism.fsdp == 0]
            if free:
                dims[max(free, key=lambda i: x.shape[i])] = "fsdp"
        return P(*dims)

    return jax.tree_util.tree_map_with_path(spec, params)


def train_state_shardings(state: Any, mesh: Mesh, parallelism: Parallelism,
                          logical: Mapping[str, tuple] | None = None) -> tuple[Any, Any]:
    """``(state shardings, gradient shardings)`` for a ``TrainState`` (arrays or ``ShapeDtypeStruct``s).

    Parameters follow :func:`param_specs`; every subtree of the optimizer state and of the methods' extras shaped
    like the parameters (Adam's moments, EMA's weights) follows the optimizer layout; everything else (step, key,
    counters, BatchNorm statistics) is replicated."""
    at_rest = _named(mesh, param_specs(state.params, parallelism, logical, shard_fsdp=parallelism.shard_params))
    sharded = _named(mesh, param_specs(state.params, parallelism, logical,
                                       shard_fsdp=parallelism.shard_optimizer or parallelism.shard_params))
    rep = replicated(mesh)
    like_params = _shaped_like(state.params)

    def follow_params(tree):
        return jax.tree.map(lambda sub: sharded if like_params(sub) else jax.tree.map(lambda _: rep, sub), tree,
                            is_leaf=like_params)

    shardings = state._replace(step=rep, params=at_rest, model_state=jax.tree.map(lambda _: rep, state.model_state),
                               opt_state=follow_params(state.opt_state), extras=follow_params(state.extras), key=rep)
    return shardings, sharded


def logical_axes_of(module: Any) -> dict[str, tuple] | None:
    """The logical axes of a native model's parameters, by path (None for a model without ``PARTITION_RULES``,
    such as a bridged torch model: FSDP still shards it by size)."""
    if getattr(type(module), "PARTITION_RULES", None) is None:
        return None
    from jaxcomposer.models.sharding import logical_axes
    return logical_axes(module, strict=False)


def check_tensor_parallel(parallelism: Parallelism, logical: Mapping | None, model_name: str) -> None:
    if parallelism.tensor > 1 and not any(set(axes) & set(TENSOR_LOGICAL_AXES) for axes in (logical or {}).values()):
        raise ConfigurationError(
            f"parallelism_config.tp.tensor_parallel_degree: {parallelism.tensor}, but {model_name} names no "
            f"{'/'.join(TENSOR_LOGICAL_AXES)} dimensions (PARTITION_RULES), so there is nothing to split over the "
            "tensor axis. jaxcomposer's GPT, BERT and ViT have them; shard this model with FSDP instead.")


def memory_per_device(compiled) -> dict[str, int]:
    """Bytes per device from XLA's compiled memory analysis: arguments, outputs, temporaries, and the peak they
    make together (outputs that alias donated arguments counted once)."""
    m = compiled.memory_analysis()
    args, out, temp = m.argument_size_in_bytes, m.output_size_in_bytes, m.temp_size_in_bytes
    alias = getattr(m, "alias_size_in_bytes", 0)
    return {"arguments": args, "outputs": out, "temporaries": temp, "peak": args + out - alias + temp}


# ---- helpers ----
def _named(mesh: Mesh, specs: Any) -> Any:
    return jax.tree.map(lambda s: NamedSharding(mesh, s), specs, is_leaf=lambda x: isinstance(x, P))


def _shaped_like(params: Any):
    """A predicate: is a subtree structured like ``params``, with the same shapes (an optimizer's moments)?"""
    treedef = jax.tree.structure(params)
    shapes = [tuple(x.shape) for x in jax.tree.leaves(params)]

    def check(sub) -> bool:
        if jax.tree.structure(sub) != treedef:
            return False
        return [tuple(getattr(x, "shape", ())) for x in jax.tree.leaves(sub)] == shapes

    return check


def _path(keypath) -> str:
    from jaxcomposer.core.model import param_path
    return "/".join(param_path(keypath))


def _as_dict(value: Any, where: str) -> dict:
    if dataclasses.is_dataclass(value) and not isinstance(value, type):  # Composer's FSDPConfig / TPConfig objects
        value = dataclasses.asdict(value)
    if not isinstance(value, Mapping):
        raise ConfigurationError(f"{where}: got {type(value).__name__}, expected a dict of options such as "
                                 "{'sharding_strategy': 'FULL_SHARD'}")
    return dict(value)


def _check_keys(config: Mapping, known: set, torch_only: set, where: str) -> None:
    unknown = [k for k in config if k not in known | torch_only]
    if unknown:
        raise ConfigurationError(f"{where}: unknown key(s) {unknown}; known: {sorted(known)}"
                                 f"{_did_you_mean(unknown[0], known | torch_only)}")
    ignored = sorted(k for k in config if k in torch_only)
    if ignored:
        warnings.warn(f"{where}: {ignored} steer torch's FSDP/TP wrappers and have no effect here (XLA schedules "
                      "the gathers; checkpoints are always sharded and elastic)", stacklevel=3)


def _positive_int(value: Any, where: str) -> int:
    if not isinstance(value, int) or isinstance(value, bool) or value < 1:
        raise ConfigurationError(f"{where}: got {value!r}, expected a positive int")
    return value


def _did_you_mean(word: str, choices) -> str:
    close = difflib.get_close_matches(str(word), [str(c) for c in choices], n=1)
    return f"; did you mean {close[0]!r}?" if close else ""


_PLATFORMS = {"cpu": ("cpu",), "gpu": ("gpu", "cuda", "rocm"), "cuda": ("cuda", "gpu"), "tpu": ("tpu",)}


def devices_for(device: Any, devices: Sequence | None) -> list:
    """The mesh's devices from Composer's ``device`` ('cpu', 'gpu', 'tpu', or one JAX device) and/or ``devices``."""
    if device is None:
        return list(devices) if devices is not None else jax.devices()
    if devices is not None:
        raise ConfigurationError(f"device={device!r} and devices=... both given; pass one (device picks a platform, "
                                 "devices lists the mesh's devices)")
    if isinstance(device, jax.Device):
        return [device]
    name = getattr(device, "name", device) if not isinstance(device, str) else device
    if not isinstance(name, str) or name.lower() not in _PLATFORMS:
        raise ConfigurationError(f"device: got {device!r}, expected 'cpu', 'gpu' or 'tpu' (or a jax.Device)")
    for platform in _PLATFORMS[name.lower()]:
        try:
            return jax.devices(platform)
        except RuntimeError:
            continue
    raise ConfigurationError(f"device: {device!r} asked for, but JAX has no such device here (it has "
                             f"{sorted({d.platform for d in jax.devices()})}); install jax with that backend, or "
                             "pass device='cpu'")
