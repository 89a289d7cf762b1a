import struct

import jax.numpy as jnp
import pytest

from jaxcomposer.loggers import TensorboardLogger
from tests.loggers.helpers import accuracy_eval, fake_fit, make_state


def read_scalars(log_dir):
    """Parse TFRecord framing (u64 length, u32 crc, data, u32 crc) and decode tensorboardX's Event protos."""
    from tensorboardX.proto.event_pb2 import Event

    scalars = {}
    files = sorted(log_dir.glob("events.out.tfevents.*"))
    assert files, f"no event file in {list(log_dir.iterdir())}"
    for f in files:
        data = f.read_bytes()
        pos = 0
        while pos < len(data):
            (length,) = struct.unpack("<Q", data[pos:pos + 8])
            event = Event.FromString(data[pos + 12:pos + 12 + length])
            pos += 12 + length + 4
            for v in event.summary.value:
                if v.HasField("simple_value"):
                    scalars.setdefault(v.tag, []).append((event.step, v.simple_value))
    return scalars


def test_scalars_round_trip(tmp_path):
    log_dir = tmp_path / "tb"
    tb = TensorboardLogger(log_dir)
    assert not log_dir.exists()
    losses = [jnp.asarray(1.0 + i) for i in range(20)]
    fake_fit([tb], make_state(), losses, eval_fn=accuracy_eval([0.25, 0.5, 0.75, 1.0]))
    scalars = read_scalars(log_dir)
    assert scalars["loss/train/total"] == [(i + 1, pytest.approx(1.0 + i)) for i in range(20)]
    assert scalars["metrics/eval/accuracy"] == [(5, 0.25), (10, 0.5), (15, 0.75), (20, 1.0)]


def test_hparams_as_text(tmp_path):
    tb = TensorboardLogger(tmp_path)
    tb.log_hyperparameters({"lr": 0.1})
    tb.close(None, None)
    data = b"".join(f.read_bytes() for f in tmp_path.glob("events.out.tfevents.*"))
    assert b"hparams" in data and b"lr" in data


def test_writing_scalars_does_not_import_torch(tmp_path):
    """tensorboardX would import torch (a slow start-up) only to name a type; a run that logs floats skips it, and
    torch stays importable afterwards."""
    import subprocess
    import sys

    code = ("import sys; from jaxcomposer.loggers import TensorboardLogger; "
            f"log = TensorboardLogger({str(tmp_path)!r}); log.log_metrics({{'loss': 1.5}}, 3); log.flush(); "
            "assert 'torch' not in sys.modules, 'torch was imported'; import torch; print(torch.ones(1).sum().item())")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.strip() == "1.0"
    assert read_scalars(tmp_path) == {"loss": [(3, 1.5)]}
