"""Every failure ``jaxcomposer`` can meet ends with one clear line on stderr and exit code 2, never a traceback;
YAML numbers are numbers; ``--set key=null`` removes; ``methods NAME`` prints a card."""
import pytest
import yaml

from jaxcomposer import load_config
from jaxcomposer.cli import main
from tests.config.test_config import TINY


def _write(tmp_path, name, content):
    path = tmp_path / name
    path.write_text(content if isinstance(content, str) else yaml.safe_dump(content))
    return path


def _existing_save_folder(tmp_path):
    folder = tmp_path / "ck"
    (folder / "4").mkdir(parents=True)  # a committed step of an earlier run
    return {**TINY, "run_dir": str(tmp_path / "runs"), "save_folder": str(folder)}


# (case, config (a dict, YAML text, or a function of tmp_path), extra argv, what stderr must say)
FAILURES = [
    ("unknown key", {**TINY, "max_duraton": "1ep"}, [], "did you mean 'max_duration'"),
    ("yaml syntax", "max_duration: [1ep\nseed: 3\n", [], "is not valid YAML"),
    ("missing file", None, [], "does not exist"),
    ("set out of range", TINY, ["--set", "schedulers.3.t_warmup=1ba"], "schedulers.3: the list has 1 entries"),
    ("set not key=value", TINY, ["--set", "seed"], "is not of the form key.path=value"),
    ("bad flag value", TINY, ["--precision", "fp16"], "precision: Input should be 'fp32' or 'amp_bf16'"),
    ("wrong load_path", {**TINY, "load_path": "/nonexistent/ck"}, [], "load_path: '/nonexistent/ck' does not exist"),
    ("conflicting methods", {**TINY, "algorithms": {"mixup": {}, "cutmix": {}}}, [], "MixUp"),
    ("existing save_folder", _existing_save_folder, [], "already holds checkpoints"),
    ("unknown method", {**TINY, "algorithms": {"mixupp": {}}}, [], "did you mean 'mixup'"),
]


@pytest.mark.parametrize("case, config, argv, says", FAILURES, ids=[c[0] for c in FAILURES])
def test_cli_failures_are_one_clear_line_and_exit_2(tmp_path, capsys, case, config, argv, says):
    if callable(config):
        config = config(tmp_path)
    path = tmp_path / "missing.yaml" if config is None else _write(tmp_path, "run.yaml", config)
    assert main(["fit", str(path), *argv]) == 2
    err = capsys.readouterr().err
    assert err.startswith("jaxcomposer: ") and says in err, err
    assert "Traceback" not in err


def test_yaml_exponent_numbers_are_numbers(tmp_path):
    path = _write(tmp_path, "run.yaml", yaml.safe_dump(TINY) + "scale_schedule_ratio: 1e0\n")
    cfg = load_config(path, ["optimizer.lr=1e-3", "optimizer.weight_decay=5E-4"])
    assert cfg.optimizer["lr"] == 1e-3 and cfg.optimizer["weight_decay"] == 5e-4 and cfg.scale_schedule_ratio == 1.0


def test_set_null_removes_a_method_or_resets_an_option():
    cfg = load_config(TINY, ["algorithms.ema=null", "seed=null", "algorithms.nothing_here=null"])
    assert "ema" not in cfg.algorithms and "label_smoothing" in cfg.algorithms
    assert cfg.seed == 17  # back to the config default


def test_methods_name_prints_the_card(capsys):
    assert main(["methods", "LabelSmoothing"]) == 0
    out = capsys.readouterr().out
    assert out.startswith("LabelSmoothing (label_smoothing)") and "**What it does.**" in out and "**Reference.**" in out
    assert main(["methods", "no_such_method"]) == 2
    known = capsys.readouterr().err.split("known: ")[1].strip().split(", ")
    assert known == sorted(known) and {"augmix", "label_smoothing", "squeeze_excite"} <= set(known)
