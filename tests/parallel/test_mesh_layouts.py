"""Data parallel, FSDP, tensor parallel and hybrid layouts train to the same model; FSDP divides per-device memory.

The 8-device runs happen in one subprocess (``mesh_worker.py``: JAX fixes the device count at start-up); the
option parsing and the placement rules are checked here, on the suite's two devices.
"""
import json
import os
import subprocess
import sys
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from jaxcomposer import parallel
from jaxcomposer.errors import ConfigurationError
from jaxcomposer.parallel import Parallelism, param_specs, parse_parallelism
from jax.sharding import PartitionSpec as P

WORKER = Path(__file__).with_name("mesh_worker.py")
# one worker runs the whole file: its module fixture (a subprocess run) then runs once, not once per worker
pytestmark = pytest.mark.xdist_group("mesh_layouts")


@pytest.fixture(scope="module")
def eight_devices(tmp_path_factory):
    out = tmp_path_factory.mktemp("mesh") / "layouts.json"
    proc = subprocess.run([sys.executable, str(WORKER), str(out)], capture_output=True, text=True, timeout=600,
                          env=dict(os.environ))
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(out.read_text())


@pytest.mark.slow
def test_every_layout_trains_to_the_same_losses_and_parameters(eight_devices):
    reference = eight_devices["1 device"]["losses"]
    assert len(reference) == 4 and reference[0] != reference[-1]
    layouts = [name for name in eight_devices if not name.startswith(("1 device", "restore"))]
    assert len(layouts) == 4
    for name in layouts:
        r = eight_devices[name]
        np.testing.assert_allclose(r["losses"], reference, rtol=1e-6, atol=1e-6, err_msg=name)
        # four AdamW steps at lr 3e-3 move weights by ~1e-2; layouts differ only in the order of sums
        assert r["max_param_diff_to_1_device"] < 1e-4, name


@pytest.mark.slow
def test_the_layouts_place_parameters_where_they_say(eight_devices):
    specs = {name: r["qkv_kernel_spec"] for name, r in eight_devices.items() if "qkv_kernel_spec" in r}
    assert specs == {"1 device": "P(None, None)", "8 fsdp": "P(None, 'fsdp')",
                     "8 fsdp SHARD_GRAD_OP": "P(None, None)", "4 fsdp x 2 tensor": "P('fsdp', 'tensor')",
                     "2 data x 4 fsdp (HYBRID_SHARD)": "P(None, 'fsdp')"}


@pytest.mark.slow
def test_fsdp_divides_per_device_memory(eight_devices):
    one, fsdp = eight_devices["1 device"], eight_devices["8 fsdp"]
    # the parameters one device holds: 1/8, plus the arrays below min_shard_size (biases, norms) kept whole
    assert one["param_bytes_per_device"] / 8 <= fsdp["param_bytes_per_device"] < one["param_bytes_per_device"] / 6.5
    # the whole train state (params + AdamW's two moments) as the compiled step's arguments, per device
    assert one["compiled"]["arguments"] / fsdp["compiled"]["arguments"] > 6.5
    # SHARD_GRAD_OP keeps parameters whole but shards the optimizer state: in between
    zero2 = eight_devices["8 fsdp SHARD_GRAD_OP"]["compiled"]["arguments"]
    assert fsdp["compiled"]["arguments"] < zero2 < one["compiled"]["arguments"] / 2
    hybrid = eight_devices["2 data x 4 fsdp (HYBRID_SHARD)"]["param_bytes_per_device"]
    assert one["param_bytes_per_device"] / 4 <= hybrid < one["param_bytes_per_device"] / 3.5


@pytest.mark.slow
def test_a_checkpoint_written_sharded_restores_bitwise_onto_other_layouts(eight_devices):
    assert eight_devices["restore 8 fsdp -> 1 device"] == {"bitwise_equal": True, "layout_of_qkv": "P(None, None)"}
    assert eight_devices["restore 8 fsdp -> 4 fsdp x 2 tensor"] == {"bitwise_equal": True,
                                                                    "layout_of_qkv": "P('fsdp', 'tensor')"}
    # and back: one device's checkpoint onto 8-way FSDP
    assert eight_devices["restore 1 device -> 8 fsdp"] == {"bitwise_equal": True, "layout_of_qkv": "P(None, 'fsdp')"}


# ---- options and rules, in process ----
PARSED = [
    (None, None, 8, Parallelism(data=8)),
    ({"tp": {"tensor_parallel_degree": 2}}, None, 8, Parallelism(data=4, tensor=2)),
    ({"fsdp": {}}, None, 8, Parallelism(fsdp=8, shard_params=True, shard_optimizer=True)),
    (None, {"sharding_strategy": "SHARD_GRAD_OP"}, 8, Parallelism(fsdp=8, shard_optimizer=True)),
    ({"fsdp": {"sharding_strategy": "NO_SHARD"}}, None, 4, Parallelism(fsdp=4)),
    ({"fsdp2": {"reshard_after_forward": False}}, None, 4, Parallelism(fsdp=4, shard_optimizer=True)),
    ({"fsdp": {"sharding_strategy": "HYBRID_SHARD", "data_parallel_replicate_degree": 2},
      "tp": {"tensor_parallel_degree": 2}}, None, 16,
     Parallelism(data=2, fsdp=4, tensor=2, shard_params=True, shard_optimizer=True)),
    ({"fsdp": {"data_parallel_shard_degree": 2, "min_shard_size": 0}}, None, 2,
     Parallelism(fsdp=2, shard_params=True, shard_optimizer=True, min_shard_size=0)),
]


@pytest.mark.parametrize("config, fsdp_config, devices, expected", PARSED)
def test_composer_options_become_a_mesh_shape(config, fsdp_config, devices, expected):
    assert parse_parallelism(config, fsdp_config, devices) == expected


BAD = [
    ({"fdsp": {}}, None, 8, "parallelism_config: unknown key(s) ['fdsp']; known: ['fsdp', 'fsdp2', 'tp']; did you mean 'fsdp'?"),
    ({"fsdp": {"sharding_strategy": "FULL_SHRAD"}}, None, 8, "did you mean 'FULL_SHARD'?"),
    ({"fsdp": {"data_parallel_shard_degree": 3}}, None, 8, "= 3, but there are 8 devices"),
    ({"tp": {"tensor_parallel_degree": 3}}, None, 8, "tensor_parallel_degree: 3 does not divide the 8 devices"),
    ({"fsdp": {"sharding_strategy": "FULL_SHARD"}}, {"sharding_strategy": "FULL_SHARD"}, 8, "fsdp_config: given "
     "together with parallelism_config"),
    ({"fsdp": "FULL_SHARD"}, None, 8, "parallelism_config.fsdp: got str, expected a dict"),
    ({"fsdp": {"min_shard_size": -1}}, None, 8, "min_shard_size: got -1"),
    ({"tp": {"tensor_parallel_degree": 0}}, None, 8, "tensor_parallel_degree: got 0, expected a positive int"),
]


@pytest.mark.parametrize("config, fsdp_config, devices, message", BAD)
def test_bad_parallelism_options_name_the_key_and_value(config, fsdp_config, devices, message):
    with pytest.raises(ConfigurationError, match=None) as info:
        parse_parallelism(config, fsdp_config, devices)
    assert message in str(info.value)


def test_torch_only_fsdp_keys_are_accepted_with_a_warning():
    with pytest.warns(UserWarning, match=r"\['limit_all_gathers', 'mixed_precision'\] steer torch's"):
        got = parse_parallelism({"fsdp": {"mixed_precision": "PURE", "limit_all_gathers": True}}, None, 2)
    assert got == Parallelism(fsdp=2, shard_params=True, shard_optimizer=True)


def test_fsdp_shards_the_largest_divisible_dimension_and_tensor_the_named_one():
    params = {"wide": jnp.zeros((6, 64)), "tall": jnp.zeros((256, 10)), "odd": jnp.zeros((33, 35)),
              "bias": jnp.zeros((64,)), "qkv": jnp.zeros((64, 192))}
    logical = {"qkv": ("embed", "heads"), "wide": ("embed", "mlp")}
    specs = param_specs(params, Parallelism(fsdp=4, tensor=2, min_shard_size=256), logical)
    assert specs == {"wide": P(None, "tensor"),  # 6 rows do not split 4 ways; mlp takes the tensor axis
                     "tall": P("fsdp", None), "odd": P(None, None), "bias": P(None),  # bias: < 256 elements
                     "qkv": P("fsdp", "tensor")}
    assert param_specs(params, Parallelism(fsdp=4, tensor=2, min_shard_size=256), logical,
                       shard_fsdp=False)["qkv"] == P(None, "tensor")


def test_optimizer_and_method_state_follow_the_parameters():
    from jaxcomposer.core.state import TrainState
    import optax
    params = {"w": jnp.zeros((8, 4)), "b": jnp.zeros((4,))}
    opt_state = optax.adam(1e-3).init(params)
    state = TrainState(jnp.zeros((), jnp.int32), params, {}, opt_state, {"ema": {"params": params, "n": jnp.zeros(())}},
                       jax.random.PRNGKey(0))
    par = Parallelism(fsdp=2, shard_optimizer=True, min_shard_size=0)
    mesh = parallel.make_mesh(par, jax.devices()[:2])
    shardings, grads = parallel.train_state_shardings(state, mesh, par)
    spec = lambda s: s.spec
    assert jax.tree.map(spec, shardings.params) == {"w": P(None, None), "b": P(None)}  # whole at rest
    assert jax.tree.map(spec, grads) == {"w": P("fsdp", None), "b": P("fsdp")}
    assert jax.tree.map(spec, shardings.opt_state[0].mu) == {"w": P("fsdp", None), "b": P("fsdp")}
    assert shardings.opt_state[0].count.spec == P()
    assert jax.tree.map(spec, shardings.extras) == {"ema": {"params": {"w": P("fsdp", None), "b": P("fsdp")},
                                                             "n": P()}}


def test_tensor_parallelism_needs_a_model_that_names_its_axes():
    from jaxcomposer.models.mlp import MLP
    from jaxcomposer.models.tasks import ComposerClassifier
    from jaxcomposer.trainer.trainer import Trainer
    batches = [{"input": np.zeros((4, 8), np.float32), "target": np.zeros((4,), np.int32)}]
    with pytest.raises(ConfigurationError, match="names no heads/mlp dimensions"):
        Trainer(model=ComposerClassifier(MLP(8, (16,), 2, rngs=nnx.Rngs(0)), num_classes=2),
                train_dataloader=batches, max_duration="1ba", progress_bar=False,
                parallelism_config={"tp": {"tensor_parallel_degree": 2}})


def test_placing_one_state_checks_every_process_holds_the_same_bits():
    """With several processes, the state is placed shard by shard from each process's own copy after comparing one
    CRC32 per array (tests/test_launch.py runs it on two processes); the pieces of that check, here."""
    import ml_dtypes

    a = np.arange(6, dtype=np.float32).reshape(2, 3)
    assert parallel.array_crc32(a) == parallel.array_crc32(a.copy()) != parallel.array_crc32(a + 1)
    assert parallel.array_crc32(a.T) == parallel.array_crc32(np.ascontiguousarray(a.T))  # C order, any strides
    assert parallel.array_crc32(np.float32(2.0)) != parallel.array_crc32(np.float32(-2.0))  # 0-d arrays
    assert parallel.array_crc32(a.astype(ml_dtypes.bfloat16)) != parallel.array_crc32(a.astype(np.float16))
    same = np.array([[1, 2, 3], [1, 2, 3]], np.uint32)
    assert parallel.differing_array(same) is None
    assert parallel.differing_array(np.array([[1, 2, 3], [1, 5, 6], [1, 2, 3]], np.uint32)) == 1

    # one process: a plain placement, onto fresh buffers (the state is donated; the user's arrays must survive)
    mesh = parallel.make_mesh(Parallelism(fsdp=2))
    sharding = jax.sharding.NamedSharding(mesh, P("fsdp"))
    x = jnp.arange(4.0)
    placed = parallel.same_on_every_process({"x": x, "y": np.ones(2, np.float32)}, sharding, verify="a test state")
    assert placed["x"].sharding == sharding and placed["y"].sharding == sharding
    buffers = {s.data.unsafe_buffer_pointer() for s in placed["x"].addressable_shards}
    assert x.unsafe_buffer_pointer() not in buffers
    np.testing.assert_array_equal(placed["x"], x)
