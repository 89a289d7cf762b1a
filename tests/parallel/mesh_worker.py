"""Train one small GPT under several mesh layouts on 8 fake CPU devices and write what each run ended with.

Run as ``python tests/parallel/mesh_worker.py OUT.json`` (tests/parallel/test_mesh_layouts.py does): the device count
is fixed when JAX starts, so the 8-device runs need a process of their own. Every layout trains the same model on
the same batches; only where the arrays live differs.
"""
import json
import os
import re
import sys

os.environ["XLA_FLAGS"] = re.sub(r"--xla_force_host_platform_device_count=\d+", "",
                                 os.environ.get("XLA_FLAGS", "")) + " --xla_force_host_platform_device_count=8"
os.environ.setdefault("JAX_PLATFORMS", "cpu")

import jax  # noqa: E402
import numpy as np  # noqa: E402
from flax import nnx  # noqa: E402

from jaxcomposer import parallel  # noqa: E402
from jaxcomposer.core.events import Callback  # noqa: E402
from jaxcomposer.data import ArrayLoader  # noqa: E402
from jaxcomposer.models.gpt import GPT  # noqa: E402
from jaxcomposer.models.tasks import ComposerCausalLM  # noqa: E402
from jaxcomposer.optim import DecoupledAdamW  # noqa: E402
from jaxcomposer.trainer.checkpoint import flat_paths  # noqa: E402
from jaxcomposer.trainer.trainer import Trainer  # noqa: E402

LAYOUTS = {
    "1 device": (1, None),
    "8 fsdp": (8, {"fsdp": {"sharding_strategy": "FULL_SHARD"}}),
    "8 fsdp SHARD_GRAD_OP": (8, {"fsdp": {"sharding_strategy": "SHARD_GRAD_OP"}}),
    "4 fsdp x 2 tensor": (8, {"fsdp": {"data_parallel_shard_degree": 4}, "tp": {"tensor_parallel_degree": 2}}),
    "2 data x 4 fsdp (HYBRID_SHARD)": (8, {"fsdp": {"sharding_strategy": "HYBRID_SHARD",
                                                    "data_parallel_replicate_degree": 2}}),
}
TOKENS = np.random.default_rng(0).integers(0, 128, (64, 17)).astype(np.int32)


class Losses(Callback):
    def __init__(self):
        self.values = []

    def batch_end(self, state, logger):
        self.values.append(state.batch_metrics["loss"])


def trainer(n_devices: int, layout, **kw) -> tuple[Trainer, Losses]:
    losses = Losses()
    model = GPT(vocab_size=128, seq_len=16, d_model=64, n_layers=2, n_heads=4, rngs=nnx.Rngs(0))
    loader = ArrayLoader({"input_ids": TOKENS}, 16, shuffle=True, seed=0, drop_last=True)
    t = Trainer(model=ComposerCausalLM(model), train_dataloader=loader, max_duration="4ba",
                optimizers=DecoupledAdamW(lr=3e-3), seed=3, progress_bar=False, devices=jax.devices()[:n_devices],
                parallelism_config=layout, callbacks=[losses], **kw)
    return t, losses


def host_params(t: Trainer) -> dict[str, np.ndarray]:
    return {k: np.asarray(v) for k, v in flat_paths(t.state.train_state.params).items()}


def host_state(t: Trainer) -> list[np.ndarray]:
    """Every leaf of the train state: parameters, optimizer moments, step counters, the PRNG key."""
    return [np.asarray(jax.random.key_data(x) if jax.dtypes.issubdtype(x.dtype, jax.dtypes.prng_key) else x)
            for x in jax.tree.leaves(t.state.train_state)]


def main(out: str) -> None:
    results, final, states, saved = {}, {}, {}, {}
    batch = {"input_ids": TOKENS[:16]}
    for name, (n, layout) in LAYOUTS.items():
        t, losses = trainer(n, layout)
        t.fit()
        params = host_params(t)
        final[name] = params
        state = t.state.train_state
        # what one device holds of the parameters: its shards' bytes, read off the live arrays
        param_bytes = sum(x.addressable_shards[0].data.nbytes for x in jax.tree.leaves(state.params))
        results[name] = {
            "parallelism": t.parallelism.describe(),
            "losses": [float(v) for v in losses.values],
            "param_bytes_per_device": int(param_bytes),
            "compiled": parallel.memory_per_device(t.compiled_train_step(batch)),
            "max_param_diff_to_1_device": (None if name == "1 device" else
                                           max(float(np.max(np.abs(params[k] - final["1 device"][k])))
                                               for k in params)),
            "qkv_kernel_spec": str(state.params["blocks"][0]["attn"]["qkv"]["kernel"].sharding.spec),
        }
        if name in ("1 device", "8 fsdp"):
            states[name] = host_state(t)
            saved[name] = t.save_checkpoint(os.path.join(os.path.dirname(os.path.abspath(out)), f"{n}_ckpt"))
    # a checkpoint written by one layout, restored onto others: the whole train state, bit for bit
    for source, name in (("8 fsdp", "1 device"), ("8 fsdp", "4 fsdp x 2 tensor"), ("1 device", "8 fsdp")):
        n, layout = LAYOUTS[name]
        t, _ = trainer(n, layout, load_path=str(saved[source]))
        restored = host_state(t)
        results[f"restore {source} -> {name}"] = {
            "bitwise_equal": len(restored) == len(states[source]) and all(
                np.array_equal(a, b) for a, b in zip(restored, states[source])),
            "layout_of_qkv": str(t.state.train_state.params["blocks"][0]["attn"]["qkv"]["kernel"].sharding.spec)}
    with open(out, "w") as f:
        json.dump(results, f, indent=1)
    for name, r in results.items():
        print(f"{name:34s} {r}")


if __name__ == "__main__":
    main(sys.argv[1])
