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
    plot = PlotLogger(out)
    losses = [2.0 * math.exp(-0.1 * i) for i in range(20)]
    fake_fit([plot], make_state(), losses, eval_fn=accuracy_eval([0.3, 0.5, 0.6, 0.7]), clock=clock,
             batch_time=0.25)
    data = out.read_bytes()
    assert data[:8] == PNG_MAGIC and len(data) > 20_000
    image = matplotlib.image.imread(out)
    assert image.ndim == 3 and image.shape[0] > 300 and image.shape[1] > 800
    assert image.std() > 0.01  # not a blank canvas
    # Series are against batches (the samples axis comes from the batch size)
    assert [b for b, _ in plot.series["loss/train/total"]] == list(range(1, 21))
    assert plot.series["metrics/eval/accuracy"] == [(5, 0.3), (10, 0.5), (15, 0.6), (20, 0.7)]
    assert plot.samples_per_batch == make_state().batch_size
    assert dict(matplotlib.rcParams) == rc_before and matplotlib.get_backend() == backend_before


def test_directory_path_and_empty_run(tmp_path):
    plot = PlotLogger(tmp_path / "d")
    assert not (tmp_path / "d").exists()
    path = plot.save(title="empty")
    assert path == tmp_path / "d" / "metrics.png" and path.read_bytes()[:8] == PNG_MAGIC


def test_a_resumed_run_plots_its_earlier_part_from_the_jsonl(tmp_path):
    import json
    history = tmp_path / "metrics.jsonl"
    lines = [{"step": b, "metrics": {"loss/train/total": 3.0 - 0.1 * b}} for b in range(1, 9)]  # killed at batch 8
    history.write_text("".join(json.dumps(line) + "\n" for line in lines))
    state = make_state()
    state.timestamp = state.timestamp.copy(batch=6)  # resumed from the checkpoint at batch 6
    plot = PlotLogger(tmp_path / "metrics.png", history=history)
    fake_fit([plot], state, [1.0, 0.9], eval_every=None)
    assert [b for b, _ in plot.series["loss/train/total"]] == [1, 2, 3, 4, 5, 6, 7, 8]
    assert plot.series["loss/train/total"][-2:] == [(7, 1.0), (8, 0.9)]  # the resumed batches, not the killed run's


def test_live_plot_outside_a_kernel_writes_only_its_file(tmp_path):
    """(In a kernel it redraws in place: tests/notebooks/test_live_view.py.)"""
    from jaxcomposer.loggers import LivePlotLogger

    live, silent = LivePlotLogger(tmp_path / "live.png"), LivePlotLogger()
    losses = [2.0 * math.exp(-0.1 * i) for i in range(10)]
    fake_fit([live, silent], make_state(), losses, eval_fn=accuracy_eval([0.3, 0.5]), clock=FakeClock(),
             batch_time=0.25)
    assert (tmp_path / "live.png").read_bytes()[:8] == PNG_MAGIC and live.renders == silent.renders == 0
    assert live.series["metrics/eval/accuracy"] == [(5, 0.3), (10, 0.5)]
    assert not silent.writes_file and not silent.path.exists()  # without a path, no file
