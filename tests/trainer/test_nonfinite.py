"""Non-finite losses: the step never applies them; the host raises ('raise') or skips up to a limit ('skip')."""
import numpy as np
import pytest

from jaxcomposer import Trainer
from jaxcomposer.callbacks import NonFiniteLossError
from jaxcomposer.optim import DecoupledSGDW
from tests.trainer.helpers import digits, leaves, mlp_task


class PoisonedLoader:
    """32-example batches of digits; the batches whose numbers are in ``bad`` (1-based) hold a NaN."""

    def __init__(self, bad):
        self.data, self.bad = digits("train", 320), set(bad)

    def __len__(self):
        return 10

    def __iter__(self):
        for i in range(10):
            batch = {k: v[i * 32:(i + 1) * 32].copy() for k, v in self.data.items()}
            if i + 1 in self.bad:
                batch["input"][0, 0, 0, 0] = np.nan
            yield batch


def make(bad, tmp_path=None, **kw):
    return Trainer(model=mlp_task(), train_dataloader=PoisonedLoader(bad), max_duration="6ba",
                   optimizers=DecoupledSGDW(lr=0.1), seed=0, progress_bar=False,
                   save_folder=None if tmp_path is None else tmp_path / "ck", save_interval="1ba", **kw)


def test_raise_names_the_batch_and_never_saves_the_bad_state(tmp_path):
    trainer = make({3}, tmp_path)
    with pytest.raises(NonFiniteLossError, match="batch 3: the loss is nan"):
        trainer.fit()
    trainer.close()
    assert max(trainer.store.all_steps()) == 2
    assert all(np.all(np.isfinite(x)) for x in leaves(trainer.state.train_state.params))


def test_skip_leaves_params_bitwise_unchanged_across_the_bad_step():
    seen = []

    from jaxcomposer import Callback

    class Snapshot(Callback):
        def batch_end(self, state, logger):
            seen.append(leaves(state.train_state.params))

    trainer = make({3}, nonfinite="skip", callbacks=[Snapshot()])
    trainer.fit()
    for a, b in zip(seen[1], seen[2]):  # after batch 2 == after batch 3 (skipped)
        np.testing.assert_array_equal(a, b)
    assert any(not np.array_equal(a, b) for a, b in zip(seen[2], seen[3]))  # batch 4 trains again
    assert trainer.state.timestamp.batch == 6


def test_skip_raises_past_the_limit():
    trainer = make({2, 3, 4}, nonfinite="skip", nonfinite_max_skips=2)
    with pytest.raises(NonFiniteLossError, match="batch 4: .*3 such steps in a row"):
        trainer.fit()


def test_policy_is_validated():
    with pytest.raises(ValueError, match="nonfinite: Input should be 'raise' or 'skip' \\(got 'ignore'\\)"):
        make(set(), nonfinite="ignore")
