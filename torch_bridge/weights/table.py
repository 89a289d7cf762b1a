"""The conversion-table vocabulary: one :class:`Entry` per NNX variable, built with :class:`TableBuilder`.

A table is data, not code: every NNX variable of a model maps to exactly one torch ``state_dict`` key through a
named layout change (``TRANSFORMS``), so the conversion is checked both ways and lossless. Architecture modules
(``torch_bridge.weights.resnet``, ``.gpt``, ...) each hold one function per torch layout that builds the table for
a given model instance (block counts and optional submodules come from the instance).
"""
from __future__ import annotations

import dataclasses
from typing import Callable

import numpy as np

NnxPath = tuple  # e.g. ("blocks", 0, "conv1", "kernel")

# name -> (NNX -> torch, torch -> NNX); both pure layout changes, so values convert exactly.
TRANSFORMS: dict[str, tuple[Callable[[np.ndarray], np.ndarray], Callable[[np.ndarray], np.ndarray]]] = {
    "copy": (lambda a: a, lambda a: a),
    "linear": (lambda a: a.T, lambda a: a.T),                                        # (in, out) <-> (out, in)
    "conv": (lambda a: a.transpose(3, 2, 0, 1), lambda a: a.transpose(2, 3, 1, 0)),  # HWIO <-> OIHW
}


@dataclasses.dataclass(frozen=True)
class Entry:
    """One NNX variable <-> one torch state-dict key."""

    nnx_path: NnxPath
    torch_key: str
    transform: str = "copy"

    def to_torch(self, a: np.ndarray) -> np.ndarray:
        return TRANSFORMS[self.transform][0](a)

    def to_nnx(self, a: np.ndarray) -> np.ndarray:
        return TRANSFORMS[self.transform][1](a)

    def torch_shape(self, nnx_shape: tuple) -> tuple:
        return tuple(self.to_torch(np.broadcast_to(np.float32(0), nnx_shape)).shape)


@dataclasses.dataclass(frozen=True)
class ConversionTable:
    """How one model instance's variables map onto one torch layout.

    - ``entries``: the variables, each to one key.
    - ``export_zeros``: torch-only int64 counters (``num_batches_tracked``), written as 0 and ignored on import.
    - ``aliases``: ``(key, target)`` pairs of tied weights (an LM head tied to the token embedding). On import the
      key is optional and, when present, must equal ``target``; on export it is written as a copy of ``target``
      when ``export_aliases`` is true (Hugging Face's ``state_dict()`` lists tied weights under both names, so a
      strict ``load_state_dict`` needs both).
    - ``ignored``: keys a torch original may carry that hold no weights (non-persistent buffers that older
      versions saved, such as GPT-2's causal mask); accepted and skipped on import, never exported.
    """

    architecture: str
    layout: str
    entries: tuple[Entry, ...]
    export_zeros: tuple[str, ...] = ()
    aliases: tuple[tuple[str, str], ...] = ()
    export_aliases: bool = False
    ignored: tuple[str, ...] = ()


def _key(parts: tuple) -> str:
    return ".".join(map(str, parts))


class TableBuilder:
    """Collects entries; each helper takes the NNX module path and, where the names differ, the torch one
    (``None``: the same dotted name)."""

    def __init__(self, architecture: str, layout: str):
        self.architecture, self.layout = architecture, layout
        self.entries: list[Entry] = []
        self.zeros: list[str] = []
        self.aliases: list[tuple[str, str]] = []
        self.ignored: list[str] = []

    def add(self, path: NnxPath, key: str, transform: str = "copy") -> None:
        if transform not in TRANSFORMS:
            raise ValueError(f"TableBuilder: unknown transform {transform!r}; known: {sorted(TRANSFORMS)}.")
        self.entries.append(Entry(tuple(path), key, transform))

    def linear(self, path: NnxPath, torch_path: str | None = None, bias: bool = True,
               transform: str = "linear") -> None:
        """``nnx.Linear``; ``transform='copy'`` for Hugging Face's ``Conv1D`` (GPT-2), which stores (in, out)."""
        t = torch_path or _key(path)
        self.add((*path, "kernel"), f"{t}.weight", transform)
        if bias:
            self.add((*path, "bias"), f"{t}.bias")

    def conv(self, path: NnxPath, torch_path: str | None = None, bias: bool = False) -> None:
        t = torch_path or _key(path)
        self.add((*path, "kernel"), f"{t}.weight", "conv")
        if bias:
            self.add((*path, "bias"), f"{t}.bias")

    def batchnorm(self, path: NnxPath, torch_path: str | None = None) -> None:
        t = torch_path or _key(path)
        for ours, theirs in (("scale", "weight"), ("bias", "bias"), ("mean", "running_mean"), ("var", "running_var")):
            self.add((*path, ours), f"{t}.{theirs}")
        self.zeros.append(f"{t}.num_batches_tracked")

    def layernorm(self, path: NnxPath, torch_path: str | None = None) -> None:
        t = torch_path or _key(path)
        self.add((*path, "scale"), f"{t}.weight")
        self.add((*path, "bias"), f"{t}.bias")

    def embed(self, path: NnxPath, torch_path: str | None = None) -> None:
        self.add((*path, "embedding"), f"{torch_path or _key(path)}.weight")

    def alias(self, key: str, target: str) -> None:
        self.aliases.append((key, target))

    def ignore(self, key: str) -> None:
        self.ignored.append(key)

    def build(self, export_aliases: bool = False) -> ConversionTable:
        return ConversionTable(self.architecture, self.layout, tuple(self.entries), tuple(self.zeros),
                               tuple(self.aliases), export_aliases, tuple(self.ignored))
