"""SIGTERM mid-run: the step in flight finishes, is saved, the CLI exits 143, and autoresume carries on."""
import json
import signal
import subprocess
import sys
import time

import pytest
import yaml


@pytest.mark.slow
def test_sigterm_saves_exits_143_and_autoresume_finishes(tmp_path):
    cfg = {"run_name": "pre", "run_dir": str(tmp_path / "runs"), "max_duration": "400ba", "seed": 0,
           "progress_bar": False, "log_to_console": False, "eval_interval": 0,
           "model": {"name": "mlp", "hidden": [32]}, "data": {"name": "digits", "batch_size": 16},
           "optimizer": {"name": "decoupled_sgdw", "lr": 0.05}, "save_folder": str(tmp_path / "ck"),
           "save_interval": "100ba"}
    path = tmp_path / "c.yaml"
    path.write_text(yaml.safe_dump(cfg))
    proc = subprocess.Popen([sys.executable, "-m", "jaxcomposer.cli", "fit", str(path)],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    metrics = tmp_path / "runs" / "pre" / "metrics.jsonl"
    deadline = time.time() + 120
    while time.time() < deadline and proc.poll() is None:  # wait until training is under way
        if metrics.exists() and len(metrics.read_text().splitlines()) > 20:
            break
        time.sleep(0.2)
    proc.send_signal(signal.SIGTERM)
    out, err = proc.communicate(timeout=120)
    assert proc.returncode == 143, err[-2000:]
    assert "SIGTERM received: stopped after batch" in err
    saved = sorted(int(p.name) for p in (tmp_path / "ck").iterdir() if p.name.isdigit())
    assert saved and 0 < saved[-1] < 400  # the interrupted step itself was saved, off the 100ba interval

    cfg.update(autoresume=True, run_name="pre2")
    path.write_text(yaml.safe_dump(cfg))
    done = subprocess.run([sys.executable, "-m", "jaxcomposer.cli", "fit", str(path)], capture_output=True,
                          text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    lines = [json.loads(l) for l in (tmp_path / "runs" / "pre2" / "metrics.jsonl").read_text().splitlines()]
    steps = [l["step"] for l in lines if "loss/train/total" in l.get("metrics", {})]
    assert steps[0] == saved[-1] + 1 and steps[-1] == 400
