"""torch_bridge.export and the interpreter: graph binding, conversion-time checks, key folding, mode handling."""
import copy

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import torch
import torch.nn as nn

import torch_bridge  # noqa: F401  registers the ops
from torch_bridge import UnsupportedOpError, export, from_torch
from torch_bridge.interpreter import can_run, run_graph
from tests.torch_bridge.parity import LAYER_TOL, assert_close_on_scale


class BNDrop(nn.Module):
    def __init__(self):
        super().__init__()
        self.bn, self.d1, self.d2 = nn.BatchNorm1d(4), nn.Dropout(0.5), nn.Dropout(0.5)

    def forward(self, x):
        h = self.bn(x)
        return self.d1(h), self.d2(h)


def test_program_binds_signature():
    ep = export.export_module(BNDrop(), (torch.randn(8, 4),), train=True, dynamic_batch=False)
    prog = export.to_program(ep)
    assert ("user", 0) in prog.inputs and ("state", "bn.weight") in prog.inputs
    buffers = [name for kind, name in prog.outputs if kind == "buffer"]
    assert buffers == ["bn.running_mean", "bn.running_var", "bn.num_batches_tracked"]
    assert [k for k, _ in prog.outputs].count("user") == 2
    assert prog.user_shapes == ((8, 4),)


def test_export_restores_mode_and_eval_graph_has_no_dropout():
    m = BNDrop().eval()
    ep = export.export_module(m, (torch.randn(8, 4),), train=True, dynamic_batch=False)
    assert not m.training
    eval_ep = export.export_module(m, (torch.randn(8, 4),), train=False, dynamic_batch=False)
    targets = {str(n.target) for n in eval_ep.graph.nodes if n.op == "call_function"}
    assert not any("dropout" in t for t in targets)
    assert any("dropout" in str(n.target) for n in ep.graph.nodes)


def test_each_random_node_gets_its_own_key():
    bm = from_torch(BNDrop(), (torch.randn(8, 4),))
    x = np.random.default_rng(0).normal(size=(8, 4))
    (a, b), _ = bm.apply(bm.params, bm.buffers, jax.random.key(0), x, train=True)
    assert not np.array_equal(np.asarray(a) == 0, np.asarray(b) == 0)  # two dropout layers, two masks


def test_tied_storage_key():
    lin = nn.Linear(3, 3)
    other = nn.Linear(3, 3)
    other.weight = lin.weight
    assert export.storage_key(lin.weight) == export.storage_key(other.weight)
    assert export.storage_key(lin.weight) != export.storage_key(lin.bias)


class Unsupported(nn.Module):
    def __init__(self):
        super().__init__()
        self.inner = nn.Linear(4, 4)

    def forward(self, x):
        u = torch.linalg.svd(self.inner(x))[0]
        return torch.linalg.qr(u)[0]


def test_unsupported_ops_all_listed_with_source():
    with pytest.raises(UnsupportedOpError) as info:
        from_torch(Unsupported(), (torch.randn(4, 4),))
    names = list(info.value.ops)
    assert any("svd" in n for n in names) and any("qr" in n for n in names), names
    msg = str(info.value)
    assert "<root> (Unsupported)" in msg and "torch.linalg.svd" in msg


def test_unsupported_op_error_is_a_jaxcomposer_error():
    """One ``except JaxComposerError`` catches bridge failures too; ``except NotImplementedError`` still works."""
    import jaxcomposer.errors

    assert torch_bridge.UnsupportedOpError is jaxcomposer.errors.UnsupportedOpError
    assert issubclass(torch_bridge.UnsupportedOpError, jaxcomposer.errors.JaxComposerError)
    assert issubclass(torch_bridge.UnsupportedOpError, NotImplementedError)
    with pytest.raises(jaxcomposer.errors.JaxComposerError):
        from_torch(Unsupported(), (torch.randn(4, 4),))


def test_interpreter_python_ops():
    assert can_run(torch.ops.aten.sym_size.int)
    import operator
    assert can_run(operator.getitem) and can_run(operator.mul)
    assert not can_run(torch.ops.aten.linalg_qr.default)


def test_data_dependent_control_flow_fails_with_a_hint():
    class Branchy(nn.Module):
        def forward(self, x):
            return x * 2 if x.sum() > 0 else x

    with pytest.raises(Exception) as info:
        from_torch(Branchy(), (torch.randn(3),))
    assert any("torch.cond" in note for note in getattr(info.value, "__notes__", []))


def test_layerdrop_failures_say_how_to_convert():
    """Hugging Face LayerDrop (Wav2Vec2, Whisper, BART...) skips a layer when a torch.rand draw is below
    config.layerdrop: a Python `if` on a tensor, which torch.export refuses in training mode."""
    import types

    class LayerDrop(nn.Module):
        def __init__(self, layerdrop):
            super().__init__()
            self.config = types.SimpleNamespace(layerdrop=layerdrop)
            self.layer = nn.Linear(3, 3)

        def forward(self, x):
            skip = self.training and self.config.layerdrop > 0 and torch.rand([]) < self.config.layerdrop
            return x if skip else self.layer(x)

    with pytest.raises(Exception) as info:
        from_torch(LayerDrop(0.1), (torch.randn(2, 3),))
    assert any("config.layerdrop = 0" in n for n in getattr(info.value, "__notes__", []))
    bridged = from_torch(LayerDrop(0.0), (torch.randn(2, 3),))  # what the note suggests converts
    assert "layer.weight" in bridged.params


def test_other_export_failures_get_no_control_flow_hint():
    class Broken(nn.Module):
        def forward(self, x):
            return x @ torch.ones(5, 2)  # a shape error, not control flow

    with pytest.raises(Exception) as info:
        from_torch(Broken(), (torch.randn(3, 4),))
    notes = getattr(info.value, "__notes__", [])
    assert any("torch.export failed in train mode" in n for n in notes)
    assert not any("torch.cond" in n for n in notes)


def test_run_graph_feeds_placeholders_in_order():
    ep = export.export_module(nn.Linear(2, 3), (torch.randn(1, 2),), train=False, dynamic_batch=False)
    w, b, x = np.ones((3, 2), np.float32), np.arange(3, dtype=np.float32), np.ones((1, 2), np.float32)
    (out,) = run_graph(ep.graph, [w, b, x], key=None)
    np.testing.assert_allclose(np.asarray(out), [[2.0, 3.0, 4.0]])


# ------------------------------------------------------------------------------------------ functionalize_in_place
class Counting(nn.Module):
    """Updates a non-persistent buffer, then reads it; BatchNorm updates its running statistics twice (shared)."""

    def __init__(self):
        super().__init__()
        self.bn = nn.BatchNorm1d(4)
        self.register_buffer("calls", torch.zeros(()), persistent=False)

    def forward(self, x):
        self.calls.add_(1)
        return self.bn(self.bn(x)) * self.calls


class ViewOfUpdated(nn.Module):
    """A view taken before an in-place update: torch's view sees the update."""

    def __init__(self):
        super().__init__()
        self.register_buffer("buf", torch.arange(4.0).reshape(2, 2))

    def forward(self, x):
        flat = self.buf.view(-1)
        self.buf.add_(1)
        return x + flat


class InPlaceResidual(nn.Module):
    """torchvision's habits: ``nn.ReLU(inplace=True)`` and ``out += identity`` write intermediates in place."""

    def __init__(self):
        super().__init__()
        self.lin, self.bn, self.relu = nn.Linear(4, 4), nn.BatchNorm1d(4), nn.ReLU(inplace=True)

    def forward(self, x):
        identity = self.relu(x * 1.0)
        out = self.relu(self.bn(self.lin(identity)))
        out += identity
        return self.relu(out) - out.mean()


class LowPrecisionInPlace(nn.Module):
    """An in-place add keeps its bfloat16 tensor bfloat16 although the other operand is float32."""

    def forward(self, x):
        h = (x * 2).to(torch.bfloat16)
        h.add_(x)
        return h.float() * 3


FUNCTIONAL_CASES = [(BNDrop, True), (Counting, True), (InPlaceResidual, True), (LowPrecisionInPlace, True),
                    (ViewOfUpdated, False)]


@pytest.mark.parametrize("make,rewritten", FUNCTIONAL_CASES, ids=[m.__name__ for m, _ in FUNCTIONAL_CASES])
def test_in_place_functionalization_equals_torch_and_run_decompositions(make, rewritten, monkeypatch):
    """Graphs of lowered ops whose in-place updates write buffers are rewritten without ``run_decompositions``; a
    view of an updated buffer is declined. Either way the train step equals torch (outputs and every buffer), and
    the rewritten graph equals the decomposed one bit for bit (dropout masks aside: a node's key follows its place
    in the graph, and the two graphs number their nodes differently)."""
    from torch_bridge import functionalize

    torch.manual_seed(0)
    x, original = torch.randn(8, 4), make()
    with export._mode(module := copy.deepcopy(original), True):
        assert functionalize.functionalize_in_place(torch.export.export(module, (x,))) is rewritten
    fast = from_torch(copy.deepcopy(original), (x,), modes=(True,))
    monkeypatch.setattr(functionalize, "functionalize_in_place", lambda ep: False)
    decomposed = from_torch(copy.deepcopy(original), (x,), modes=(True,))
    reference = copy.deepcopy(original).train()
    with torch.no_grad():
        expected = reference(x)
    expected = expected if isinstance(expected, tuple) else (expected,)
    for bm in (fast, decomposed):
        out, buffers = bm.apply(bm.params, bm.buffers, None if make is not BNDrop else jax.random.key(0), x.numpy())
        out = out if isinstance(out, tuple) else (out,)
        if make is not BNDrop:  # dropout masks are JAX's own: compare the deterministic models only
            for o, e in zip(out, expected):
                np.testing.assert_allclose(np.asarray(o), e.numpy(), rtol=1e-5, atol=1e-5)
        for name, value in buffers.items():
            np.testing.assert_allclose(np.asarray(value), reference.get_buffer(name).numpy(), rtol=1e-5, atol=1e-5,
                                       err_msg=name)
    f_out, f_buf = fast.apply(fast.params, fast.buffers, jax.random.key(0), x.numpy())
    d_out, d_buf = decomposed.apply(decomposed.params, decomposed.buffers, jax.random.key(0), x.numpy())
    assert set(f_buf) == set(d_buf) == set(fast.buffers)
    same = (f_buf, d_buf) if make is BNDrop else ((f_out, f_buf), (d_out, d_buf))
    for a, b in zip(*map(jax.tree_util.tree_leaves, same)):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))


class _VarArgs(nn.Module):
    """``forward(x, *extras)``: torch.export groups the extras into one tuple, and so must the dynamic-shapes spec."""

    def __init__(self):
        super().__init__()
        self.linear = nn.Linear(4, 3)

    def forward(self, x, *extras):
        y = self.linear(x)
        for e in extras:
            y = y + e
        return y


@pytest.mark.parametrize("example_batch", [2, 1])  # 1: torch.export would specialize the batch to 1
def test_dynamic_batch_with_varargs_and_batch_one_examples(example_batch):
    module = _VarArgs()
    g = torch.Generator().manual_seed(0)
    example = (torch.randn(example_batch, 4, generator=g), torch.randn(example_batch, 3, generator=g),
               torch.randn(example_batch, 3, generator=g))
    bridged = from_torch(module, example, dynamic_batch=True)
    for batch in (1, 3):
        inputs = (torch.randn(batch, 4, generator=g), torch.randn(batch, 3, generator=g),
                  torch.randn(batch, 3, generator=g))
        out, _ = bridged.apply(bridged.params, bridged.buffers, None, *(jnp.asarray(x.numpy()) for x in inputs),
                               train=True)
        assert_close_on_scale(out, module(*inputs), LAYER_TOL, f"batch {batch}")


def test_dynamic_shapes_follow_the_signature():
    x, m = torch.randn(2, 4), torch.randn(1, 4)  # m: a shared (1, T) mask, not batched
    spec = export._dynamic_shapes((x, x, m), _VarArgs())
    assert spec[0] == {0: spec[1][0][0]} and isinstance(spec[1], tuple) and spec[1][1] is None
    table = torch.randn(5, 4)  # dim 0 is not the batch's (the first tensor input's): left as it is
    widened = export._widen_batch((x[:1], table))
    assert widened[0].shape == (2, 4) and torch.equal(widened[0][1], x[0]) and widened[1] is table


class _NumpyMask(nn.Module):  # SpecAugment-style: the mask is drawn on the host at forward time
    def forward(self, x):
        import numpy
        keep = numpy.random.rand(*x.shape) < 0.5
        return x * torch.from_numpy(keep).to(x.dtype)


class _PythonLayerDrop(nn.Module):  # LayerDrop with Python's random: the draw picks a branch
    def __init__(self):
        super().__init__()
        self.linear = nn.Linear(4, 4)

    def forward(self, x):
        import random
        return x if random.random() < 0.5 else self.linear(x)


class _Deterministic(nn.Module):  # a forward-time constant and torch's own randomness: nothing frozen by accident
    def forward(self, x):
        return torch.nn.functional.dropout(x, 0.5, self.training) + torch.tensor([1.0, 2.0, 3.0, 4.0])


def test_host_randomness_in_forward_is_reported_with_the_module():
    model = nn.Sequential(nn.Linear(4, 4), _NumpyMask())
    with pytest.warns(torch_bridge.HostRandomnessWarning, match=r"module\(s\) 1\b.*np\.random"):
        export.export_module(model, (torch.randn(2, 4),), train=True, dynamic_batch=False)
    with pytest.warns(torch_bridge.HostRandomnessWarning, match="control flow"):
        export.export_module(_PythonLayerDrop(), (torch.randn(2, 4),), train=True, dynamic_batch=False)
    import warnings
    with warnings.catch_warnings():
        warnings.simplefilter("error", torch_bridge.HostRandomnessWarning)
        export.export_module(_Deterministic(), (torch.randn(2, 4),), train=True, dynamic_batch=False)
