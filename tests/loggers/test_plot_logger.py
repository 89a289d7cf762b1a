import math

import matplotlib
import matplotlib.image

from jaxcomposer.loggers import PlotLogger
from tests.loggers.helpers import FakeClock, accuracy_eval, fake_fit, make_state

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


def test_png_written_at_fit_end(tmp_path):
    rc_before = dict(matplotlib.rcParams)
    backend_before = matplotlib.get_backend()
    clock = FakeClock()
    out = tmp_path / "plots" / "run.png"
    plot = PlotLogger(out, clock=clock)
    losses = [2.0 * math.exp(-0.1 * i) for i in range(20)]
    fake_fit([plot], make_state(), losses, eval_fn=accuracy_eval([0.3, 0.5, 0.6, 0.7]), clock=clock,
             batch_time=0.25)
    data = out.read_bytes()
    assert data[:8] == PNG_MAGIC and len(data) > 20_000
    image = matplotlib.image.imread(out)
    assert image.ndim == 3 and image.shape[0] > 300 and image.shape[1] > 800
    assert image.std() > 0.01  # not a blank canvas
    # Series are against wall time since FIT_START (from the injected clock).
    loss_t = [t for t, _ in plot.series["loss/train/total"]]
    assert loss_t[0] == 0.25 and math.isclose(loss_t[-1], 5.0)
    assert [v for _, v in plot.series["metrics/eval/accuracy"]] == [0.3, 0.5, 0.6, 0.7]
    assert dict(matplotlib.rcParams) == rc_before and matplotlib.get_backend() == backend_before


def test_directory_path_and_empty_run(tmp_path):
    plot = PlotLogger(tmp_path / "d")
    assert not (tmp_path / "d").exists()
    path = plot.save(title="empty")
    assert path == tmp_path / "d" / "metrics.png" and path.read_bytes()[:8] == PNG_MAGIC
