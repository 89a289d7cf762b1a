"""Recorded programs (jaxprs) as the algorithm engine compares and runs them: scalar literals lifted to constants,
a hashable structure that ignores the constants' values, and a digest of a constant's value.
"""
from __future__ import annotations

import hashlib
from typing import Any

import jax.extend.core as jax_core
import numpy as np


def lift_literals(jaxpr, consts) -> tuple[Any, list]:
    """``jaxpr`` with the scalar literals of its own equations turned into constants, and the constants' values.

    Tracing inlines scalars (``x * 0.5``, a ``jnp.asarray`` of a per-batch number) into the program's text; lifted,
    they enter the step as values, so a scalar that changes every batch does not make a new program. Literals inside
    nested programs (a ``jax.jit`` the apply calls) stay: they are part of the structure."""
    constvars, values, eqns = list(jaxpr.constvars), list(consts), []
    for eqn in jaxpr.eqns:
        if any(isinstance(v, jax_core.Literal) for v in eqn.invars):
            invars = []
            for v in eqn.invars:
                if isinstance(v, jax_core.Literal):
                    var = jax_core.Var(v.aval)
                    constvars.append(var)
                    values.append(v.val)
                    v = var
                invars.append(v)
            eqn = eqn.replace(invars=invars)
        eqns.append(eqn)
    return jaxpr.replace(constvars=constvars, eqns=eqns), values


def structure(jaxpr) -> tuple:
    """What makes two recorded programs the same program: each equation's primitive, parameters and operands (as
    positions in the dataflow), without the values of the constants (those are the step's arguments). A hashable
    tuple, built without printing the program (printing costs more than tracing it)."""
    ids: dict = {}

    def ref(v):
        if isinstance(v, jax_core.Literal):
            return ("literal", v.aval, np.asarray(v.val).tobytes())
        return ids.setdefault(v, len(ids))

    for v in (*jaxpr.constvars, *jaxpr.invars):
        ids[v] = (len(ids), v.aval)
    body = tuple((eqn.primitive.name, tuple(ref(v) for v in eqn.invars), _frozen(eqn.params),
                  tuple(ref(v) for v in eqn.outvars)) for eqn in jaxpr.eqns)
    return tuple(ids.values())[:len(jaxpr.constvars) + len(jaxpr.invars)], body, tuple(ref(v) for v in jaxpr.outvars)


def _frozen(value):
    """An equation parameter as a hashable value: nested programs by their structure, containers item by item,
    anything else unhashable by its text."""
    if isinstance(value, jax_core.ClosedJaxpr):
        return ("closed", structure(value.jaxpr), tuple(np.asarray(c).tobytes() for c in value.consts))
    if isinstance(value, jax_core.Jaxpr):
        return ("jaxpr", structure(value))
    if isinstance(value, dict):
        return tuple((k, _frozen(v)) for k, v in sorted(value.items(), key=lambda kv: str(kv[0])))
    if isinstance(value, (tuple, list)):
        return tuple(_frozen(v) for v in value)
    try:
        hash(value)
        return value
    except TypeError:
        return repr(value)


def digest(value) -> tuple:
    array = np.asarray(value)
    return array.shape, array.dtype.str, hashlib.blake2b(array.tobytes(), digest_size=16).digest()
