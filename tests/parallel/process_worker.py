"""One process of a multi-process run (or the whole single-process reference), for tests/parallel/test_processes.py.

``python tests/parallel/process_worker.py OUT_DIR LAYOUT [KILL_AT]``: joins the JAX runtime when started by
``jaxcomposer launch`` (its environment says so), trains a small GPT for 6 batches with a checkpoint every 2 and
autoresume (to ``OUT_DIR/checkpoints``, or the ``WORKER_SAVE_FOLDER`` the environment names, a bucket's), and process
0 writes the final parameters and the losses it saw to ``OUT_DIR/result.npz``. ``KILL_AT``:
process 1 kills itself with SIGKILL once that batch is done (and its checkpoint committed), as a lost machine.
"""
import json
import os
import signal
import sys
import time

from jaxcomposer.launch import initialize_from_env

initialize_from_env()

import jax  # noqa: E402
import numpy as np  # noqa: E402
from flax import nnx  # noqa: E402

from jaxcomposer.core.events import Callback  # noqa: E402
from jaxcomposer.data import ArrayLoader  # noqa: E402
from jaxcomposer.models.gpt import GPT  # noqa: E402
from jaxcomposer.models.tasks import ComposerCausalLM  # noqa: E402
from jaxcomposer.optim import DecoupledAdamW  # noqa: E402
from jaxcomposer.trainer.checkpoint import flat_paths  # noqa: E402
from jaxcomposer.trainer.trainer import Trainer  # noqa: E402

TOKENS = np.random.default_rng(0).integers(0, 128, (96, 17)).astype(np.int32)


class Record(Callback):
    def __init__(self, out_dir: str, kill_at: int | None):
        self.out_dir, self.kill_at = out_dir, kill_at
        self.losses = {}

    def batch_end(self, state, logger):
        batch = int(state.timestamp.batch)
        self.losses[batch] = float(state.batch_metrics["loss"])  # replicated: every process holds it whole
        if jax.process_index() == 0:  # the test watches this to time its signals
            with open(os.path.join(self.out_dir, "progress"), "a") as f:
                f.write(f"{batch}\n")
        time.sleep(float(os.environ.get("WORKER_SLEEP_S", "0")))
        if batch == self.kill_at and jax.process_index() == 1:
            state_ok = os.path.join(self.out_dir, "killed_after")
            with open(state_ok, "w") as f:
                f.write(str(batch))
            os.kill(os.getpid(), signal.SIGKILL)


def main(out_dir: str, layout: str, kill_at: int | None) -> None:
    parallelism = {"fsdp": {"sharding_strategy": "FULL_SHARD"}} if layout == "fsdp" else None
    loader = ArrayLoader({"input_ids": TOKENS}, 16, shuffle=True, seed=0, drop_last=True)
    loader.shard_for_processes(jax.process_index(), jax.process_count())
    record = Record(out_dir, kill_at)
    trainer = Trainer(model=ComposerCausalLM(GPT(vocab_size=128, seq_len=16, d_model=64, n_layers=2, n_heads=4,
                                                 rngs=nnx.Rngs(0))),
                      train_dataloader=loader, max_duration="6ba", optimizers=DecoupledAdamW(lr=3e-3), seed=3,
                      progress_bar=False, parallelism_config=parallelism, callbacks=[record],
                      save_folder=os.environ.get("WORKER_SAVE_FOLDER") or os.path.join(out_dir, "checkpoints"),
                      save_interval="2ba", autoresume=True,
                      run_name="processes")
    trainer.fit()
    trainer.close()
    # the module passed in holds the trained weights whole, on every process: each process checks its own shards
    # of the train state against it (together they cover every shard)
    params = {k: np.asarray(v) for k, v in flat_paths(nnx.state(trainer.state.model, nnx.Param)).items()}
    sharded = flat_paths(trainer.state.train_state.params)
    assert params.keys() == sharded.keys()
    for k, x in sharded.items():
        assert all(np.array_equal(params[k][s.index], s.data) for s in x.addressable_shards), f"write-back of {k}"
    if jax.process_index() == 0:
        np.savez(os.path.join(out_dir, "result.npz"), **params)
        with open(os.path.join(out_dir, "losses.json"), "w") as f:
            json.dump({"losses": record.losses, "processes": jax.process_count(), "devices": jax.device_count(),
                       "parallelism": trainer.parallelism.describe()}, f)


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2], int(sys.argv[3]) if len(sys.argv) > 3 else None)
