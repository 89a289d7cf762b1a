"""The Composer-named callbacks and loggers in a real (tiny) run of the Trainer."""
import io

import pytest

from jaxcomposer import Trainer
from jaxcomposer.callbacks import EarlyStopper, LRMonitor, MemoryMonitor, RuntimeEstimator, SystemMetricsMonitor
from jaxcomposer.loggers import ConsoleLogger, FileLogger, InMemoryLogger
from jaxcomposer.optim import CosineAnnealingScheduler, DecoupledSGDW
from tests.trainer.helpers import loaders, mlp_task


def test_a_composer_script_runs_unchanged(tmp_path):
    train, evals = loaders(batch_size=32, n_train=128)  # 4 batches per epoch
    mem, console_out = InMemoryLogger(), io.StringIO()
    file_logger = FileLogger(str(tmp_path / "{run_name}" / "logs-rank{rank}.txt"))
    trainer = Trainer(model=mlp_task(), train_dataloader=train, eval_dataloader=evals, max_duration="3ep",
                      optimizers=DecoupledSGDW(lr=0.1, momentum=0.9), schedulers=CosineAnnealingScheduler(),
                      run_name="composer-script", seed=0, progress_bar=False,
                      callbacks=[LRMonitor(), MemoryMonitor(), RuntimeEstimator(), SystemMetricsMonitor(),
                                 EarlyStopper("MulticlassAccuracy", "eval", patience=1)],
                      loggers=[mem, file_logger, ConsoleLogger(log_interval="2ba", stream=console_out)])
    # Composer's State holds the optimizers; until the trainer sets them, a script can (LRMonitor reads them)
    if not getattr(trainer.state, "optimizers", None):
        trainer.state.optimizers = [trainer.optimizer]
    trainer.fit()
    trainer.close()

    batches = [ts.batch for ts, _ in mem.data["loss/train/total"]]
    assert batches == list(range(1, 13))
    lrs = [v for _, v in mem.data["lr-DecoupledSGDW/group0"]]
    assert lrs[0] == pytest.approx(0.1) and lrs[-1] < 0.01 and lrs == sorted(lrs, reverse=True)
    assert {"memory/host_rss_mem", "time/remaining_estimate", "cpu_percentage"} <= set(mem.data)
    assert mem.most_recent_values["time/remaining_estimate"] >= 0
    assert mem.hyperparameters["time/remaining_estimate_unit"] == "hours"
    assert [ts.epoch for ts, _ in mem.data["metrics/eval/MulticlassAccuracy"]] == [1, 2, 3]
    series = mem.get_timeseries("metrics/eval/MulticlassAccuracy")
    assert list(series["batch"]) == [4, 8, 12]

    lines = (tmp_path / "composer-script" / "logs-rank0.txt").read_text().splitlines()
    loss_lines = [line for line in lines if "loss/train/total" in line]
    assert len(loss_lines) == 12 and loss_lines[0].startswith("[metric][batch=1]: loss/train/total: ")
    assert "[hyperparameter]: time/remaining_estimate_unit: \"hours\" " in lines
    assert any(line.startswith("[metric][batch=12]: metrics/eval/MulticlassAccuracy: ") for line in lines)

    text = console_out.getvalue()
    assert text.startswith("******************************\nConfig:\ntime/remaining_estimate_unit: hours\n"
                           "******************************\n[epoch=1][batch=1/4]:\n\t Train cpu_percentage: ")
    headers = [line for line in text.splitlines() if line.startswith("[epoch=")]
    # the first batch, then every 2 batches (log_interval='2ba')
    assert headers == ["[epoch=1][batch=1/4]:"] + \
        [f"[epoch={(b - 1) // 4 + 1}][batch={(b - 1) % 4 + 1}/4]:" for b in (2, 4, 6, 8, 10, 12)]
    assert text.count("\t Train loss/train/total: ") == 7
    assert "[epoch=3][batch=4/4]:" in text and "[fit end] composer-script: 12 batches" in text
