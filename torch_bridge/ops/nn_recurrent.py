"""Recurrent ATen ops: ``lstm.input``, ``gru.input``, ``rnn_tanh.input``, ``rnn_relu.input`` (imported by
``ops/nn.py``; split out only to keep files short).

``torch.export`` keeps ``nn.LSTM`` / ``nn.GRU`` / ``nn.RNN`` as one of these ops, in train and eval mode alike, with
the module's flat weight list ``params`` (per layer, per direction: ``w_ih, w_hh[, b_ih, b_hh][, w_hr]``), the
initial states (zeros built in the graph when the caller passes none) and the static flags. An unbatched (2-D)
input reaches the graph already unsqueezed by the module, so the ops only ever see 3-D inputs, as in ATen.

Each layer and direction is one ``lax.scan`` over time: the input projection of the whole sequence is one matmul
outside the scan and the step does only the recurrent matmul, so the traced program (and XLA's compile time) does
not grow with the sequence length. Gate order and formulas are torch's (LSTM ``i, f, g, o``; GRU ``r, z, n`` with
``n = tanh(W_in x + b_in + r * (W_hn h + b_hn))``); LSTM projections (``proj_size``, weight ``w_hr``) are supported.

Inter-layer dropout (``dropout > 0`` and ``train``) is the one random part: its masks come from the node's ``key``
(one per layer boundary), so they are not torch's masks, only the same distribution (Bernoulli(1 - p), kept values
scaled by 1 / (1 - p), on the concatenated output of both directions, never after the last layer).

Not lowered: the ``.data`` overloads (packed sequences). ``torch.export`` cannot export ``pack_padded_sequence``
through an RNN in torch 2.13 (it fails inside the module's forward), and a graph that did hold one is refused at
conversion time with ``UnsupportedOpError`` naming the overload.
"""
from __future__ import annotations

import jax
import jax.numpy as jnp
from jax import lax

import torch

from .registry import lower

A = torch.ops.aten


def _bias(b, ndim):
    """A ``(G,)`` bias shaped to add to a ``(..., G)`` array (rank promotion raises in jaxcomposer)."""
    return b.reshape((1,) * (ndim - 1) + b.shape)


def _lstm_step(w_hh, b_hh, w_hr):
    def step(carry, gx):
        h, c = carry
        gates = gx + h @ w_hh.T
        if b_hh is not None:
            gates = gates + _bias(b_hh, gates.ndim)
        i, f, g, o = jnp.split(gates, 4, axis=-1)
        c = jax.nn.sigmoid(f) * c + jax.nn.sigmoid(i) * jnp.tanh(g)
        h = jax.nn.sigmoid(o) * jnp.tanh(c)
        if w_hr is not None:
            h = h @ w_hr.T
        return (h, c), h
    return step


def _gru_step(w_hh, b_hh):
    def step(h, gx):
        gh = h @ w_hh.T
        if b_hh is not None:
            gh = gh + _bias(b_hh, gh.ndim)
        xr, xz, xn = jnp.split(gx, 3, axis=-1)
        hr, hz, hn = jnp.split(gh, 3, axis=-1)
        r = jax.nn.sigmoid(xr + hr)
        z = jax.nn.sigmoid(xz + hz)
        n = jnp.tanh(xn + r * hn)
        h = (1 - z) * n + z * h
        return h, h
    return step


def _rnn_step(w_hh, b_hh, activation):
    def step(h, gx):
        pre = gx + h @ w_hh.T
        if b_hh is not None:
            pre = pre + _bias(b_hh, pre.ndim)
        h = activation(pre)
        return h, h
    return step


def _layer_weights(params, has_biases, num_layers, num_directions, op):
    """``params`` split into ``[layer][direction] -> (w_ih, w_hh, b_ih, b_hh, w_hr)`` (absent ones None)."""
    cells = num_layers * num_directions
    per = len(params) // cells if cells else 0
    expected = (2, 3) if not has_biases else (4, 5)
    if per * cells != len(params) or per not in expected or (per % 2 and op != "lstm"):
        raise NotImplementedError(f"torch_bridge: aten.{op}.input with {len(params)} weights for num_layers="
                                  f"{num_layers}, bidirectional={num_directions == 2}, has_biases={has_biases} "
                                  "(expected w_ih, w_hh[, b_ih, b_hh][, w_hr] per layer and direction)")
    out = []
    for layer in range(num_layers):
        dirs = []
        for d in range(num_directions):
            w = list(params[(layer * num_directions + d) * per:][:per])
            w_ih, w_hh = w[0], w[1]
            b_ih, b_hh = (w[2], w[3]) if has_biases else (None, None)
            w_hr = w[-1] if per % 2 else None
            dirs.append((w_ih, w_hh, b_ih, b_hh, w_hr))
        out.append(dirs)
    return out


def _inter_layer_dropout(x, p, key, op, layer):
    if p >= 1:
        return jnp.zeros_like(x)
    if key is None:
        raise ValueError(f"torch_bridge: aten.{op}.input with dropout={p} needs a PRNG key in train mode; pass "
                         "key=jax.random.key(...) to apply")
    keep = jax.random.bernoulli(jax.random.fold_in(key, layer), 1.0 - p, x.shape)
    return jnp.where(keep, x / (1.0 - p), 0).astype(x.dtype)


def _recurrent(op, x, states, params, has_biases, num_layers, dropout, train, bidirectional, batch_first, key):
    """The shared driver: ``states`` is a tuple of ``(L * D, B, H)`` initial states (h, or h and c); returns the
    output sequence and the tuple of final states in the same layout."""
    if x.ndim != 3:
        raise NotImplementedError(f"torch_bridge: aten.{op}.input with a {x.ndim}-D input (ATen takes 3-D; the "
                                  "module unsqueezes an unbatched input itself)")
    num_directions = 2 if bidirectional else 1
    weights = _layer_weights(params, has_biases, num_layers, num_directions, op)
    seq = x.swapaxes(0, 1) if batch_first else x  # (T, B, F): scan runs over the leading axis
    finals = [[] for _ in states]
    for layer in range(num_layers):
        if layer > 0 and train and dropout > 0:
            seq = _inter_layer_dropout(seq, dropout, key, op, layer)
        outs = []
        for d in range(num_directions):
            w_ih, w_hh, b_ih, b_hh, w_hr = weights[layer][d]
            # the input projection of every time step at once: one matmul instead of T small ones in the loop
            gx = seq @ w_ih.T
            if b_ih is not None:
                gx = gx + _bias(b_ih, gx.ndim)
            init = tuple(s[layer * num_directions + d] for s in states)
            if op == "lstm":
                step, carry = _lstm_step(w_hh, b_hh, w_hr), init
            elif op == "gru":
                step, carry = _gru_step(w_hh, b_hh), init[0]
            else:
                step, carry = _rnn_step(w_hh, b_hh, jnp.tanh if op == "rnn_tanh" else jax.nn.relu), init[0]
            # the reverse direction reads the sequence backwards and stores each output at its own time index
            carry, ys = lax.scan(step, carry, gx, reverse=d == 1)
            for acc, s in zip(finals, carry if op == "lstm" else (carry,)):
                acc.append(s)
            outs.append(ys)
        seq = outs[0] if num_directions == 1 else jnp.concatenate(outs, axis=-1)
    out = seq.swapaxes(0, 1) if batch_first else seq
    return out, tuple(jnp.stack(f) for f in finals)


@lower(A.lstm.input, random=True)
def lstm(input, hx, params, has_biases, num_layers, dropout, train, bidirectional, batch_first, *, key=None):
    """(output, h_n, c_n); ``hx`` is ``[h_0, c_0]`` (``h_0`` has ``proj_size`` features when projecting)."""
    h0, c0 = hx
    out, (h, c) = _recurrent("lstm", input, (h0, c0), params, has_biases, num_layers, dropout, train,
                             bidirectional, batch_first, key)
    return out, h, c


@lower(A.gru.input, random=True)
def gru(input, hx, params, has_biases, num_layers, dropout, train, bidirectional, batch_first, *, key=None):
    out, (h,) = _recurrent("gru", input, (hx,), params, has_biases, num_layers, dropout, train, bidirectional,
                           batch_first, key)
    return out, h


@lower(A.rnn_tanh.input, random=True)
def rnn_tanh(input, hx, params, has_biases, num_layers, dropout, train, bidirectional, batch_first, *, key=None):
    out, (h,) = _recurrent("rnn_tanh", input, (hx,), params, has_biases, num_layers, dropout, train,
                           bidirectional, batch_first, key)
    return out, h


@lower(A.rnn_relu.input, random=True)
def rnn_relu(input, hx, params, has_biases, num_layers, dropout, train, bidirectional, batch_first, *, key=None):
    out, (h,) = _recurrent("rnn_relu", input, (hx,), params, has_biases, num_layers, dropout, train,
                           bidirectional, batch_first, key)
    return out, h
