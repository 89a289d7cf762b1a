"""Cheap running-statistic writes for ``nnx.BatchNorm`` inside a trace.

``nnx.BatchNorm`` updates its running mean and variance with ``stat[...] = new``. Before replacing the value, flax
compares the new value's ``.sharding`` with the old one's, and on a traced value that property raises an error whose
message walks the whole jaxpr traced so far. That is one walk per write, so a training trace costs time quadratic in
the number of writes, most of all with GhostBatchNorm, which writes once per chunk.
"""
from __future__ import annotations

from flax import nnx


class RunningStat(nnx.BatchStat):
    """A BatchNorm running statistic whose whole-array write of a same-shape, same-dtype value replaces the value
    directly, which is what flax ends up doing for one: values, and so results, are unchanged. Other writes
    (broadcasts, partial indices) take flax's path."""

    def __setitem__(self, key, value) -> None:
        old = self.get_value()
        same = getattr(value, "shape", None) == old.shape and getattr(value, "dtype", None) == old.dtype
        if key is Ellipsis and same:
            self.set_value(value)
        else:
            super().__setitem__(key, value)


def with_cheap_stat_writes(bn: nnx.BatchNorm) -> nnx.BatchNorm:
    """``bn`` (in place) with its running statistics held in :class:`RunningStat` variables."""
    if not isinstance(bn.mean, RunningStat):
        bn.mean, bn.var = RunningStat(bn.mean.get_value()), RunningStat(bn.var.get_value())
    return bn
