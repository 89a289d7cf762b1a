"""A training run for the fault-injection tests, launched as its own process so it can be SIGKILLed.

``python tests/trainer/fault_run.py FOLDER DEVICES MAX_BATCHES OUT [--autoresume]``: trains an MLP with dropout
under MixUp + EMA and a user's Composer ``Algorithm`` with state of its own (``CyclingGradScale``: resumed right only
if its ``state_dict`` is) on shuffled digits with ``DEVICES`` fake CPU devices, saving asynchronously every 2 batches to
``FOLDER`` (``-``: nowhere, for a reference run); at the end writes every leaf of the train state, the timestamp and the
loader position to ``OUT`` (an ``.npz``). The hidden layers are wide (2.4M parameters; with momentum and EMA ~28 MB
per checkpoint, above the 16 MiB up to which states are written as ``.npz`` items) so a save goes through orbax's
array format and takes long enough for a kill to land inside it.
"""
import os
import sys


def dump(path, trainer, loader) -> None:
    import jax
    import numpy as np

    leaves = [np.asarray(x) for x in jax.tree_util.tree_leaves(trainer.state.train_state)]
    ts = trainer.state.timestamp
    np.savez(path, *leaves, position=np.array([ts.epoch, ts.batch, ts.batch_in_epoch, ts.sample]),
             loader=np.array([loader.get_state()["epoch"], loader.get_state()["batch_index"]]))


def cycling_grad_scale():
    """A user's algorithm that counts the batches it scaled on ``self`` (host state, kept by its ``state_dict``) and
    scales each batch's gradients by a factor that follows the count."""
    import jax

    from jaxcomposer import Algorithm, Event

    class CyclingGradScale(Algorithm):
        def __init__(self):
            self.seen = 0

        def match(self, event, state):
            return event == Event.AFTER_TRAIN_BATCH

        def apply(self, event, state, logger):
            factor = 1.0 / (1.0 + 0.25 * (self.seen % 3))
            self.seen += 1
            state.grads = jax.tree.map(lambda g: g * factor, state.grads)

        def state_dict(self):
            return {"seen": self.seen}

        def load_state_dict(self, state):
            self.seen = state["seen"]

    return CyclingGradScale()


def main(folder: str, max_batches: int, out: str, autoresume: bool) -> None:
    from flax import nnx

    from jaxcomposer import Trainer
    from jaxcomposer.algorithms import EMA, MixUp
    from jaxcomposer.data import ArrayLoader
    from jaxcomposer.models import MLP
    from jaxcomposer.models.tasks import ComposerClassifier
    from jaxcomposer.optim import CosineAnnealingScheduler, DecoupledSGDW
    from tests.trainer.helpers import digits

    task = ComposerClassifier(MLP(64, hidden=(4096, 512), num_classes=10, dropout=0.2, rngs=nnx.Rngs(0)),
                              num_classes=10)
    loader = ArrayLoader(digits("train", 512), 32, seed=5)
    trainer = Trainer(model=task, train_dataloader=loader, max_duration=f"{max_batches}ba",
                      optimizers=DecoupledSGDW(lr=0.05, momentum=0.9, weight_decay=1e-4),
                      schedulers=[CosineAnnealingScheduler()],
                      algorithms=[MixUp(alpha=0.4), EMA(half_life="3ba"), cycling_grad_scale()],
                      seed=11, progress_bar=False, run_name="fault", save_folder=None if folder == "-" else folder,
                      save_interval="2ba", autoresume=autoresume)
    print(f"START batch={trainer.state.timestamp.batch}", flush=True)
    trainer.fit()
    trainer.close()
    dump(out, trainer, loader)
    print("DONE", flush=True)


if __name__ == "__main__":
    # the device count is this run's own; other flags (the test session's compile-time ones) pass through
    inherited = [f for f in os.environ.get("XLA_FLAGS", "").split() if "xla_force_host_platform_device_count" not in f]
    os.environ["XLA_FLAGS"] = " ".join([*inherited, f"--xla_force_host_platform_device_count={int(sys.argv[2])}"])
    os.environ.setdefault("JAX_PLATFORMS", "cpu")
    sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", ".."))
    main(sys.argv[1], int(sys.argv[3]), sys.argv[4], "--autoresume" in sys.argv[5:])
