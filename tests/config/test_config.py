"""Config validation: every problem at once, dotted paths, suggestions, nothing written; CLI; a tiny real fit."""
import json
import subprocess
import sys

import pytest
import yaml

from jaxcomposer import Config, ConfigError, fit, load_config
from jaxcomposer.cli import main

TINY = {
    "run_name": "tiny", "max_duration": "2ep", "seed": 0, "progress_bar": False, "log_to_console": False,
    "model": {"name": "mlp", "hidden": [32]},
    "data": {"name": "digits", "batch_size": 32, "eval_batch_size": 128},
    "optimizer": {"name": "decoupled_sgdw", "lr": 0.1, "momentum": 0.9},
    "schedulers": [{"name": "cosine_annealing_with_warmup", "t_warmup": "5ba"}],
    "algorithms": {"label_smoothing": {"smoothing": 0.1}, "ema": {"half_life": "20ba"}},
}


def test_misspelt_key_and_bad_time_string_fail_together_and_write_nothing(tmp_path):
    bad = {**TINY, "run_dir": str(tmp_path / "runs"), "max_duraton": "3ep", "eval_interval": "10epochs"}
    with pytest.raises(ConfigError) as info:
        fit(bad)
    msg = str(info.value)
    assert "max_duraton: unknown key; did you mean 'max_duration'?" in msg
    assert "eval_interval" in msg and "10epochs" in msg
    assert len(info.value.problems) == 2
    assert not (tmp_path / "runs").exists()


def test_every_problem_is_reported_with_its_dotted_path():
    bad = {**TINY, "precision": "fp16", "seed": "three",
           "data": {"name": "digits", "batch_sise": 3},
           "optimizer": {"name": "decoupled_sgdw", "lr": -1.0},
           "schedulers": [{"name": "cosine_anealing", "t_max": "1dur"}],
           "algorithms": {"mixup": {"alpha": 0.2, "interpolate": True}, "label_smoothin": {}},
           "model": {"name": "resnet_cifar", "dept": 8},
           "loggers": {"mlfow": {}, "wandb": {"log_artifacts": True}}}
    with pytest.raises(ConfigError) as info:
        load_config(bad)
    got = dict(info.value.problems)
    assert "precision" in got and "seed" in got
    assert "did you mean 'batch_size'" in got["data.batch_sise"]
    assert "lr=-1.0" in got["optimizer.lr"]  # the argument the builder rejected, not just the component
    assert "did you mean 'cosine_annealing'" in got["schedulers.0.name"]
    assert "did you mean 'interpolate_loss'" in got["algorithms.mixup.interpolate"]
    assert "did you mean 'label_smoothing'" in got["algorithms.label_smoothin"]
    assert "did you mean 'depth'" in got["model.dept"]
    assert "did you mean 'mlflow'" in got["loggers.mlfow"]
    assert "log_artifacts=True (uploading checkpoints as W&B artifacts) is not offered" in \
        got["loggers.wandb.log_artifacts"]


def test_missing_max_duration_and_overrides():
    raw = {k: v for k, v in TINY.items() if k != "max_duration"}
    with pytest.raises(ConfigError, match="max_duration: required"):
        load_config(raw)
    cfg = load_config(raw, ["max_duration=3ep", "optimizer.lr=0.05", "algorithms.ema.half_life=10ba"])
    assert cfg.max_duration == "3ep" and cfg.optimizer["lr"] == 0.05
    assert cfg.algorithms["ema"]["half_life"] == "10ba"
    assert isinstance(load_config(cfg), Config)


def test_model_and_dataset_must_match():
    with pytest.raises(ConfigError, match="model.name"):
        load_config({**TINY, "model": {"name": "gpt"}})


def test_fit_from_yaml_writes_run_dir(tmp_path):
    path = tmp_path / "tiny.yaml"
    path.write_text(yaml.safe_dump({**TINY, "run_dir": str(tmp_path / "runs"),
                                    "loggers": {"mlflow": {"experiment_name": "configs"}}}))
    result = fit(path)
    assert result.metrics["MulticlassAccuracy"] > 0.85
    assert result.wall_time_s > 0
    assert result.run_dir == tmp_path / "runs" / "tiny"
    lines = [json.loads(l) for l in (result.run_dir / "metrics.jsonl").read_text().splitlines()]
    assert any("metrics/eval/MulticlassAccuracy" in l.get("metrics", {}) for l in lines)
    assert (result.run_dir / "metrics.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert yaml.safe_load((result.run_dir / "config.yaml").read_text())["max_duration"] == "2ep"
    hparams = next(l["hparams"] for l in lines if "hparams" in l)  # the config, one entry per leaf
    assert hparams["optimizer.lr"] == 0.1 and hparams["algorithms.ema.half_life"] == "20ba"
    from mlflow.tracking import MlflowClient  # the config's logger: the run's MLflow store in the run directory
    client = MlflowClient(f"sqlite:///{result.run_dir / 'mlflow.db'}")
    (run,) = client.search_runs([client.get_experiment_by_name("configs").experiment_id])
    assert run.info.run_name == "tiny" and run.data.params["optimizer.lr"] == "0.1"
    assert run.data.metrics["metrics/eval/MulticlassAccuracy"] == pytest.approx(result.metrics["MulticlassAccuracy"])


def test_cli_methods_lists_every_algorithm(capsys):
    assert main(["methods"]) == 0
    out = capsys.readouterr().out
    for name in ("label_smoothing", "mixup", "cutout", "gradient_clipping", "ema"):
        assert name in out


def test_cli_reports_config_errors_with_exit_code_2(tmp_path, capsys):
    # in this process: ``python -m jaxcomposer.cli`` exits with main's return code, as the real processes of
    # tests/trainer/test_preemption.py show (0 and 143)
    path = tmp_path / "bad.yaml"
    path.write_text(yaml.safe_dump({**TINY, "max_duration": "10epochs"}))
    assert main(["fit", str(path)]) == 2
    err = capsys.readouterr().err
    assert "max_duration" in err and "10epochs" in err


def test_fit_saves_and_autoresumes_from_config(tmp_path):
    base = {**TINY, "run_dir": str(tmp_path / "runs"), "save_folder": str(tmp_path / "ck"), "save_interval": "1ep",
            "max_duration": "1ep"}
    first = fit(base)
    assert first.trainer.store.all_steps() == [len(first.trainer.train_dataloader)]
    again = fit({**base, "max_duration": "2ep", "autoresume": True})
    assert again.state.timestamp.epoch == 2
    n = len(again.trainer.train_dataloader)
    assert again.trainer.store.all_steps() == [n * k for k in (1, 2)]
    # one run, one directory: the continued part appends to the first part's metrics
    assert again.run_dir == first.run_dir and (again.run_dir / "config.yaml").is_file()
    from jaxcomposer.loggers.jsonl import read_jsonl
    steps = [r["step"] for r in read_jsonl(again.run_dir / "metrics.jsonl") if "loss/train/total" in r.get("metrics", {})]
    assert steps == list(range(1, 2 * n + 1))
    hparams = [r["hparams"] for r in read_jsonl(again.run_dir / "metrics.jsonl") if "hparams" in r]
    resumed = {"resumed_from": str(tmp_path / "ck" / str(n)), "resumed_at_batch": n}
    assert any(resumed.items() <= h.items() for h in hparams)
    with pytest.raises(ConfigError, match="save_interval"):
        load_config({**base, "save_interval": "2epochs"})


def test_fit_turns_on_the_compilation_cache_where_none_is_configured(tmp_path):
    # a fresh process: in this one the test suite's own cache is configured (tests/conftest.py)
    import os
    cache = tmp_path / "xla"
    code = ("import jax, jax.numpy as jnp; from jaxcomposer.runner import use_compilation_cache as use; "
            "jnp.ones(2).sum().block_until_ready(); "  # a compile first: the cache must still switch on after it
            f"print(use({str(cache)!r})); print(jax.config.jax_compilation_cache_dir); "
            "jax.jit(lambda x: jnp.sin(x) * 3)(jnp.ones(4)).block_until_ready()")
    env = {k: v for k, v in os.environ.items() if k != "JAX_COMPILATION_CACHE_DIR"}
    env["JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS"] = "0"
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True)
    assert out.stdout.split() == [str(cache), str(cache)]
    assert any("jit__lambda" in p.name for p in cache.iterdir()), sorted(p.name for p in cache.iterdir())


def test_the_cache_keeps_programs_that_compile_in_under_a_second_unless_the_user_says_otherwise(tmp_path):
    import os
    from jaxcomposer.runner import MIN_CACHED_COMPILE_S
    code = ("import jax; from jaxcomposer.runner import use_compilation_cache as use; "
            f"use({str(tmp_path / 'xla')!r}); print(jax.config.jax_persistent_cache_min_compile_time_secs)")
    env = {k: v for k, v in os.environ.items()
           if k not in ("JAX_COMPILATION_CACHE_DIR", "JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS")}
    for users, expected in ((None, MIN_CACHED_COMPILE_S), ("2.5", 2.5)):
        run_env = env if users is None else {**env, "JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS": users}
        out = subprocess.run([sys.executable, "-c", code], env=run_env, capture_output=True, text=True, check=True)
        assert float(out.stdout.split()[-1]) == expected


def test_a_configured_compilation_cache_is_left_alone_and_a_bad_directory_is_named(tmp_path):
    import jax
    from jaxcomposer.errors import ConfigurationError
    from jaxcomposer.runner import use_compilation_cache
    configured = jax.config.jax_compilation_cache_dir
    assert configured  # tests/conftest.py
    assert use_compilation_cache(str(tmp_path / "other")) == configured and not (tmp_path / "other").exists()
    assert use_compilation_cache(None) == configured
    (tmp_path / "file").write_text("")
    jax.config.update("jax_compilation_cache_dir", None)
    try:
        with pytest.raises(ConfigurationError, match=r"compilation_cache_dir: cannot create .*file/xla.*null"):
            use_compilation_cache(str(tmp_path / "file" / "xla"))
        assert use_compilation_cache(None) is None
    finally:
        jax.config.update("jax_compilation_cache_dir", configured)


def test_a_model_argument_the_model_refuses_is_a_config_error_before_any_write(tmp_path):
    bad = {**TINY, "run_dir": str(tmp_path / "runs"), "model": {"name": "resnet_cifar", "depth": 7, "width": 4}}
    with pytest.raises(ConfigError, match=r"model\.depth: ResNetCIFAR: depth must be 6n\+2 with n >= 1, got depth=7"):
        fit(bad)
    assert not (tmp_path / "runs").exists()


def test_fit_normalizes_images_in_the_step_unless_a_host_method_needs_them_normalized():
    from jaxcomposer.data import NormalizeImages
    from jaxcomposer.runner import NormalizedLoader, build_trainer
    trainer, _ = build_trainer(load_config(TINY), loggers=[])
    assert isinstance(trainer.train_data_spec.batch_transforms, NormalizeImages)
    assert isinstance(trainer.eval_data_spec.batch_transforms, NormalizeImages)
    assert next(iter(trainer.train_dataloader))["input"].dtype == "uint8"  # what crosses to the device
    with_host_method = load_config({**TINY, "algorithms": {"randaugment": {"severity": 3}}})
    trainer, _ = build_trainer(with_host_method, loggers=[])
    assert trainer.train_data_spec is None and isinstance(trainer.train_dataloader, NormalizedLoader)
    assert next(iter(trainer.train_dataloader))["input"].dtype == "float32"
