"""``aten.instance_norm`` and the running statistics ``torch.export`` does not record (torch_bridge/ops/
nn_instance_norm.py): the op against torch, and ``nn.InstanceNorm*d`` modules converted with ``from_torch`` whose
running statistics must move in training exactly as torch's do."""
import copy

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import torch
import torch.nn as nn
from torch.export.graph_signature import OutputKind

from torch_bridge import export, from_torch
from torch_bridge.ops import nn_instance_norm
from tests.torch_bridge.parity import LAYER_TOL, MODEL_TOL, assert_close_on_scale, grads_against_torch, run_lowering

A = torch.ops.aten


def randn(*shape, seed=0):
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed))


@pytest.mark.parametrize("shape", [(3, 4, 7), (2, 3, 5, 6), (2, 2, 3, 4, 5)])
@pytest.mark.parametrize("use_input_stats", [True, False])
@pytest.mark.parametrize("affine", [True, False])
def test_op_values_and_gradients(shape, use_input_stats, affine):
    c = shape[1]
    x = randn(*shape) * 3 + 1
    w, b = (randn(c, seed=1), randn(c, seed=2)) if affine else (None, None)
    rm, rv = randn(c, seed=3), randn(c, seed=4).abs() + 0.5
    args = (x, w, b, rm, rv, use_input_stats, 0.1, 1e-5, False)
    want = A.instance_norm.default(*args)
    for jit in (False, True):
        assert_close_on_scale(run_lowering(A.instance_norm.default, args, jit=jit), want, LAYER_TOL, f"jit={jit}")
    wrt = [0, 1, 2] if affine else [0]
    ours, theirs = grads_against_torch(A.instance_norm.default, args, {}, wrt)
    for i, g, t in zip(wrt, ours, theirs):
        assert_close_on_scale(g, t, LAYER_TOL, f"grad of arg {i}")


class Net(nn.Module):
    def __init__(self, track: bool, dims: int = 2):
        super().__init__()
        conv, norm = (nn.Conv2d, nn.InstanceNorm2d) if dims == 2 else (nn.Conv1d, nn.InstanceNorm1d)
        self.conv = conv(3, 6, 3, padding=1)
        self.norm = norm(6, affine=True, track_running_stats=track, momentum=0.3)
        self.head = nn.Linear(6, 4)

    def forward(self, x):
        h = torch.relu(self.norm(self.conv(x)))
        return self.head(h.flatten(2).mean(-1))


def test_running_statistics_follow_torch_over_steps_and_drive_eval():
    torch.manual_seed(0)
    module = Net(track=True)
    ref = copy.deepcopy(module)
    xs = [randn(4, 3, 8, 8, seed=10 + i) * (1 + i) + i for i in range(3)]
    bridged = from_torch(module, (xs[0],))
    params, buffers = bridged.params, dict(bridged.buffers)
    ref.train()
    apply = jax.jit(lambda p, b, x: bridged.apply(p, b, None, x, train=True))
    for x in xs:  # three training forwards: statistics must compound as torch's do
        out, buffers = apply(params, buffers, jnp.asarray(x.numpy()))
        assert_close_on_scale(out, ref(x), MODEL_TOL, "train forward")
    for name in ("norm.running_mean", "norm.running_var"):
        assert_close_on_scale(buffers[name], ref.state_dict()[name], LAYER_TOL, name)
        assert not np.allclose(np.asarray(buffers[name]), module.state_dict()[name].numpy())  # they did move
    np.testing.assert_array_equal(np.asarray(buffers["norm.num_batches_tracked"]), 0)  # torch never counts here
    ref.eval()
    out, same = bridged.apply(params, buffers, None, jnp.asarray(xs[0].numpy()), train=False)
    assert_close_on_scale(out, ref(xs[0]), MODEL_TOL, "eval forward with the trained statistics")
    for name in buffers:
        np.testing.assert_array_equal(np.asarray(same[name]), np.asarray(buffers[name]))
    restored = bridged.to_torch(params, buffers)
    np.testing.assert_allclose(restored.norm.running_var.numpy(), ref.norm.running_var.numpy(), rtol=1e-5)


def test_export_records_the_update_only_where_torch_makes_one():
    x = randn(2, 3, 8)
    tracked = export.export_module(Net(track=True, dims=1), (x,), train=True, dynamic_batch=False)
    mutated = [s.target for s in tracked.graph_signature.output_specs if s.kind == OutputKind.BUFFER_MUTATION]
    assert mutated == ["norm.running_mean", "norm.running_var"]
    assert any(n.target is nn_instance_norm.instance_norm_with_stats for n in tracked.graph.nodes)
    for module, train in ((Net(track=True, dims=1), False), (Net(track=False, dims=1), True)):
        ep = export.export_module(module, (x,), train=train, dynamic_batch=False)
        assert not [s for s in ep.graph_signature.output_specs if s.kind == OutputKind.BUFFER_MUTATION]


def test_untracked_instance_norm_gradients_match_torch():
    torch.manual_seed(1)
    module = Net(track=False, dims=1)
    x, y = randn(5, 3, 9), torch.tensor([0, 1, 2, 3, 1])
    bridged = from_torch(module, (x,))

    def loss(params):
        out, _ = bridged.apply(params, bridged.buffers, None, jnp.asarray(x.numpy()), train=True)
        return -jnp.take_along_axis(jax.nn.log_softmax(out), jnp.asarray(y.numpy())[:, None], 1).mean()

    grads = jax.jit(jax.grad(loss))(bridged.params)
    torch.nn.functional.cross_entropy(module(x), y).backward()
    for name, p in module.named_parameters():
        assert_close_on_scale(grads[name], p.grad, MODEL_TOL, name)
