"""``from_torch`` and ``BridgedModel``: a torch ``nn.Module`` as pure JAX ``(params, buffers, apply)``.

State layout (docs/design.md, section 'The torch bridge'):
- ``params``: flat ``{state_dict name: jax array}`` of parameters, torch layouts (OIHW, (out, in) linear weights).
  Tied weights appear once, under the first name torch lists; the other names are ``aliases`` and receive the same
  array inside ``apply``, so their gradients sum like torch's.
- ``buffers``: persistent buffers (BatchNorm running_mean / running_var, ``num_batches_tracked`` as int32). ``apply``
  returns them updated from the graph's BUFFER_MUTATION outputs; in eval they come back unchanged.
- constants: non-persistent buffers and lifted constant tensors (a BlurPool filter, a causal mask) are held inside
  the model. They are neither trainable nor part of ``buffers``, and ``to_torch`` leaves them alone. (A
  non-persistent buffer that the forward mutates is the exception: it has to be carried, so it sits in ``buffers``.)
"""
from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import torch
import torch.utils._pytree as torch_pytree

from . import export, kernels
from .interpreter import run_graph
from .ops.registry import to_numpy

# The ChannelsLast method's torch surgery sets this attribute (torch_bridge/methods/channels_last.py) to mark a
# module it converted. The bridge convolves channels-last by default, marked or not; the mark records the method.
CHANNELS_LAST_ATTR = "_torch_bridge_channels_last"


_NARROWED = {np.dtype(np.int64): np.int32, np.dtype(np.uint64): np.uint32, np.dtype(np.float64): np.float32}


def to_jax(x):
    # Host arrays: a private copy (astype copies), then device_put. jnp.asarray of a numpy array compiles an identity
    # program for every new shape and dtype (a compile each: a model's conversion would pay it per parameter shape);
    # device_put alone aliases an aligned host buffer on CPU (even with may_alias=False, JAX 0.10), and a torch
    # tensor's .numpy() is the tensor's own memory, which torch (or to_torch) may later write in place.
    if isinstance(x, torch.Tensor):
        x = to_numpy(x)
    if isinstance(x, np.ndarray):
        return jax.device_put(x.astype(_NARROWED.get(x.dtype, x.dtype)))
    return jnp.asarray(x)


def _to_torch_tensor(v, dtype: torch.dtype) -> torch.Tensor:
    a = np.array(jax.device_get(v))
    if a.dtype.name == "bfloat16":  # numpy has no bfloat16 for torch.from_numpy
        a = a.astype(np.float32)
    return torch.from_numpy(a).to(dtype)


def _pythonize(x):
    """torch pytree containers (namedtuples, ModelOutput-style mappings) as plain JAX-friendly Python containers."""
    if isinstance(x, tuple) and hasattr(x, "_fields"):
        return type(x)(*map(_pythonize, x))
    if isinstance(x, (list, tuple)):
        return type(x)(map(_pythonize, x)) if type(x) in (list, tuple) else tuple(map(_pythonize, x))
    if isinstance(x, Mapping):
        return {k: _pythonize(v) for k, v in x.items()}
    return x


class BridgedModel:
    """A converted module: initial ``params``/``buffers`` and a pure ``apply``. Build it with :func:`from_torch`."""

    def __init__(self, module, programs, params, buffers, constants, aliases, torch_dtypes, dynamic_batch,
                 conv_layout: str = "NCHW", input_dtypes: tuple = ()):
        self.module = module
        self._programs = programs  # {True: train Program, False: eval Program}
        # graphs exported again for other input sizes: {(train, shapes): (Program, that export's own constants)}
        self._resized: dict[tuple, tuple[export.Program, dict[str, jax.Array]]] = {}
        self._input_dtypes = input_dtypes  # the example inputs' torch dtypes, for those exports
        self.params: dict[str, jax.Array] = params
        self.buffers: dict[str, jax.Array] = buffers
        self.constants: dict[str, jax.Array] = constants
        self.aliases: dict[str, str] = aliases  # tied name -> the params key that holds the array
        self._torch_dtypes = torch_dtypes
        self.dynamic_batch = dynamic_batch
        self.conv_layout = conv_layout  # "NCHW" or "NHWC": the layout XLA convolves in (the graph is NCHW)

    def __repr__(self):
        n = sum(int(np.prod(v.shape)) for v in self.params.values())
        return (f"BridgedModel({type(self.module).__name__}, {len(self.params)} params ({n:,} values), "
                f"{len(self.buffers)} buffers, {len(self.aliases)} tied aliases)")

    # ------------------------------------------------------------------------------------------- running
    def apply(self, params, buffers, key, *inputs, train: bool = True):
        """``(outputs, new_buffers)``; pure, so safe under jit/grad/vmap.

        ``train`` picks the train or eval graph. ``key`` feeds dropout (folded per node) and may be None in eval or
        when nothing random runs. Inputs may be numpy, jax or torch arrays; 64-bit ones become 32-bit. Outputs mirror
        the module's return structure (one array, tuple, list or dict).
        """
        prog = self._programs.get(bool(train))
        if prog is None:
            raise ValueError(f"torch_bridge: the {'train' if train else 'eval'} graph was not exported "
                             f"(from_torch(..., modes={tuple(self._programs)}))")
        inputs = [to_jax(x) for x in jax.tree_util.tree_leaves(inputs)]
        prog, constants = self._program_for(prog, inputs, bool(train))
        inputs = self._check_inputs(prog, inputs, train)
        state = {**self.constants, **constants, **params, **{a: params[leaf] for a, leaf in self.aliases.items()},
                 **buffers}
        try:
            placeholders = [state[ref] if kind == "state" else inputs[ref] for kind, ref in prog.inputs]
        except KeyError as e:
            raise KeyError(f"torch_bridge: apply got no value for {e.args[0]!r}; pass the dicts from "
                           "BridgedModel.params / .buffers (or trees with the same keys)") from None
        flat = run_graph(prog.graph, placeholders, key, conv_layout=self.conv_layout)
        new_buffers, user = dict(buffers), []
        for (kind, name), value in zip(prog.outputs, flat):
            if kind == "buffer":  # keep dtypes stable so the buffers tree can be a jit carry
                new_buffers[name] = jnp.asarray(value).astype(buffers[name].dtype)
            else:
                user.append(value)
        return self._structure(user, prog), new_buffers

    def _program_for(self, prog, inputs, train: bool):
        """``prog``, or a graph exported for these inputs' sizes when only their non-batch dims differ from the
        example's (ProgressiveResizing's smaller images): torch.export specializes every dim but the batch, and
        the module's weights are the same placeholders in any size's graph. Each size is exported once."""
        shapes = prog.user_shapes
        if len(inputs) != len(shapes) or all(
                shape is None or (len(shape) == x.ndim and all(s is None or s == d for s, d in
                                                              zip(shape[1:], x.shape[1:])))
                for x, shape in zip(inputs, shapes)):
            return prog, {}  # the example's sizes (a batch mismatch is _check_inputs' to report)
        if any(shape is not None and len(shape) != x.ndim for x, shape in zip(inputs, shapes)) or \
                len(self._input_dtypes) != len(inputs):
            return prog, {}
        key = (train, tuple((x.shape[1:] if self.dynamic_batch else x.shape) for x in inputs))
        if key not in self._resized:
            examples = tuple(torch.zeros(tuple(x.shape), dtype=dtype) for x, dtype in zip(inputs, self._input_dtypes))
            try:
                ep = export.export_module(self.module, examples, train=train, dynamic_batch=self.dynamic_batch)
            except Exception as e:
                e.add_note(f"torch_bridge: the module was exported for inputs of shape "
                           f"{[tuple('*' if d is None else d for d in s) for s in shapes]} and got "
                           f"{[tuple(x.shape) for x in inputs]}; exporting it again for those failed (a method "
                           "that changes the inputs' shape, such as ProgressiveResizing, may not suit this model).")
                raise
            export.check_supported([ep.graph])
            # lifted constants are named per export (lifted_tensor_0, ...), so each graph keeps its own
            constants = {name: to_jax(tensor) for name, (tensor, kind) in export.tensor_sources([ep]).items()
                         if kind == "constant" and name not in self.params and name not in self.aliases}
            self._resized[key] = (export.to_program(ep), constants)
        return self._resized[key]

    def _check_inputs(self, prog, inputs, train):
        if len(inputs) != len(prog.user_shapes):
            raise TypeError(f"torch_bridge: the module was exported with {len(prog.user_shapes)} tensor input(s), "
                            f"apply got {len(inputs)}")
        for i, (x, shape) in enumerate(zip(inputs, prog.user_shapes)):
            if shape is not None and (len(shape) != x.ndim or
                                      any(s is not None and s != d for s, d in zip(shape, x.shape))):
                hint = "" if self.dynamic_batch else " (use from_torch(..., dynamic_batch=True) for other batch sizes)"
                expected = tuple("*" if s is None else s for s in shape)
                raise ValueError(f"torch_bridge: input {i} has shape {tuple(x.shape)}, the "
                                 f"{'train' if train else 'eval'} graph was exported for {expected}{hint}")
        return inputs

    @staticmethod
    def _structure(user, prog):
        try:
            out = torch_pytree.tree_unflatten(user, prog.out_spec)
        except Exception:  # an exotic container torch cannot rebuild around jax arrays: fall back to flat
            out = user[0] if len(user) == 1 else tuple(user)
        return _pythonize(out)

    # ------------------------------------------------------------------------------------------- back to torch
    def state_dict(self, params, buffers) -> dict[str, torch.Tensor]:
        """The module's ``state_dict`` with values from ``params``/``buffers`` (aliases filled, torch dtypes)."""
        out = {}
        for name, template in self.module.state_dict().items():
            leaf = self.aliases.get(name, name)
            if leaf in params:
                out[name] = _to_torch_tensor(params[leaf], template.dtype)
            elif name in buffers:
                out[name] = _to_torch_tensor(buffers[name], template.dtype)
            else:  # not used by either graph: keep torch's value
                out[name] = template
        return out

    def to_torch(self, params, buffers) -> torch.nn.Module:
        """Load ``params``/``buffers`` into the original module (strict) and return it."""
        self.module.load_state_dict(self.state_dict(params, buffers), strict=True)
        persistent = set(self.module.state_dict())
        with torch.no_grad():
            for name, value in buffers.items():
                if name not in persistent:  # a mutated non-persistent buffer
                    self.module.get_buffer(name).copy_(_to_torch_tensor(value, self._torch_dtypes[name]))
        # the copies may start an OpenMP team on this thread (a Trainer writes back after every fit(), and a fit()
        # can follow): free it so it does not throttle the oneDNN kernels' own team
        kernels.release_openmp_team()
        return self.module

    # ------------------------------------------------------------------------------------------- trainer protocol
    def as_pure_model(self):
        """jaxcomposer's ``PureModel``: ``apply(params, state, inputs, *, train, key)`` with state = buffers.

        ``inputs`` is one array, or a tuple of arrays for a multi-input module. The result carries this model as
        ``.bridged``, so trained weights can go back to torch: ``task.pure.bridged.to_torch(params, state)``.
        """
        from jaxcomposer.core.model import PureModel

        def apply(params, state, inputs, *, train: bool, key=None):
            args = inputs if isinstance(inputs, tuple) else (inputs,)
            return self.apply(params, state, key, *args, train=train)

        return PureModel(apply=apply, params=self.params, state=self.buffers, bridged=self, write_back=self.to_torch)


def from_torch(module: torch.nn.Module, example_inputs: tuple, *, dynamic_batch: bool = False,
               modes: tuple[bool, ...] = (True, False), conv_layout: str | None = None) -> BridgedModel:
    """Export ``module`` (train and eval graphs) and bind its weights; fails here, not mid-training, on missing ops.

    ``example_inputs`` is the positional input tuple (a lone tensor is accepted too). Without ``dynamic_batch`` the
    graphs are specialized to the example shapes; with it, dim 0 of every tensor input is symbolic. ``modes``
    picks the graphs to export (``(True,)``: the train graph only, for a module whose modes do not differ).
    Inputs whose other dims differ from the example's (same rank: ProgressiveResizing's smaller images) get a graph
    exported for their sizes on first use, kept for later calls.
    ``conv_layout`` ``"NHWC"`` (the default, ``None``) runs 2-D convolution nets channels-last: activations stay
    NHWC from the convolution that makes them to the first op that needs NCHW (:mod:`torch_bridge.channels_last`;
    faster on CNNs, benchmarks/bridge_layout.py). ``"NCHW"`` keeps torch's layout throughout,
    each convolution transposing into and out of the kernel's layout. Outputs are equal up to float rounding.
    """
    if conv_layout is None:
        conv_layout = "NHWC"
    if conv_layout not in ("NCHW", "NHWC"):
        raise ValueError(f"from_torch: conv_layout must be 'NCHW' or 'NHWC' (or None), got {conv_layout!r}")
    if not isinstance(example_inputs, tuple):
        example_inputs = (example_inputs,)
    eps = {mode: export.export_module(module, example_inputs, train=mode, dynamic_batch=dynamic_batch)
           for mode in modes}
    export.check_supported([ep.graph for ep in eps.values()])
    programs = {mode: export.to_program(ep) for mode, ep in eps.items()}

    params, buffers, constants, aliases, dtypes, owner = {}, {}, {}, {}, {}, {}
    for name, (tensor, kind) in export.tensor_sources(list(eps.values())).items():
        dtypes[name] = tensor.dtype
        if kind == "param" and not tensor.requires_grad:
            # frozen (requires_grad=False): held like a constant, so it gets no gradient and no optimizer state,
            # and to_torch leaves the module's tensor as it was
            kind = "constant"
        if kind == "param":
            leaf = owner.setdefault(export.storage_key(tensor), name)
            if leaf != name:
                aliases[name] = leaf
                continue
        {"param": params, "buffer": buffers, "constant": constants}[kind][name] = to_jax(tensor)
    input_dtypes = tuple(x.dtype for x in example_inputs) \
        if all(isinstance(x, torch.Tensor) for x in example_inputs) else ()
    return BridgedModel(module, programs, params, buffers, constants, aliases, dtypes, dynamic_batch, conv_layout,
                        input_dtypes)
