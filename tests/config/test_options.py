"""The option table is the one source: the Trainer's signature and checks, Config and ``fit --help`` all follow it."""
import inspect

import pytest

from jaxcomposer import Trainer, load_config
from jaxcomposer.cli import build_parser, main
from jaxcomposer.errors import ConfigError, ConfigurationError
from jaxcomposer.options import (CONFIG_COMPONENTS, DATA_OPTIONS, PROCESS_OPTIONS, RUN_OPTIONS, TRAINER_OPTIONS,
                                 Config, DataConfig)
from tests.config.test_config import TINY
from tests.trainer.helpers import loaders, mlp_task


def test_trainer_signature_is_the_table():
    params = {n: p for n, p in inspect.signature(Trainer.__init__).parameters.items() if n != "self"}
    assert list(params) == [n for n in params if n in TRAINER_OPTIONS] and set(params) == set(TRAINER_OPTIONS)
    for o in RUN_OPTIONS:  # the signature's default is the table's, and help(Trainer) documents it
        assert params[o.name].default == o.default, o.name
    doc = inspect.getdoc(Trainer)
    for name, o in TRAINER_OPTIONS.items():
        assert f"    {name}: {o.doc[:30]}" in doc


def test_config_schema_is_the_table():
    assert list(Config.model_fields) == [o.name for o in RUN_OPTIONS + PROCESS_OPTIONS + CONFIG_COMPONENTS]
    assert list(DataConfig.model_fields) == [o.name for o in DATA_OPTIONS]
    defaults = Config().model_dump()
    for o in RUN_OPTIONS + PROCESS_OPTIONS:
        assert defaults[o.name] == (list(o.default_in_config) if isinstance(o.default_in_config, tuple)
                                    else o.default_in_config), o.name
        assert Config.model_fields[o.name].description == o.doc


def test_fit_help_lists_every_option_with_its_doc():
    help_text = " ".join(build_parser()._subparsers._group_actions[0].choices["fit"].format_help().split())
    for o in RUN_OPTIONS + PROCESS_OPTIONS + CONFIG_COMPONENTS:
        assert f"--{o.name}" in help_text and " ".join(o.doc.split())[:40] in help_text, o.name
    for o in DATA_OPTIONS:
        assert f"--data.{o.name}" in help_text


# (option, bad value, what the message says): checked by the same table entry in the Trainer and in a config
BAD = [
    ("precision", "fp16", "'fp32' or 'amp_bf16'"),
    ("nonfinite", "ignore", "'raise' or 'skip'"),
    ("eval_subset_num_batches", -3, "greater than or equal to -1"),
    ("nonfinite_max_skips", -1, "greater than or equal to 0"),
    ("scale_schedule_ratio", 0, "greater than 0"),
    ("device_train_microbatch_size", 0, "an int greater than 0 or 'auto'"),
    ("device_train_microbatch_size", "big", "an int greater than 0 or 'auto'"),
    ("max_duration", "10epochs", "Cannot parse time string '10epochs'"),
    ("max_duration", "0.5dur", "expected a positive duration in ep, ba, sp or tok"),
    ("eval_interval", "1.5ep", "must be an integer"),
    ("save_interval", "2sp", "expected a positive number of epochs or batches"),
    ("progress_bar", "maybe", "valid boolean"),
    ("seed", "three", "valid integer"),
]


@pytest.mark.parametrize("name, value, says", BAD, ids=[f"{n}={v}" for n, v, _ in BAD])
def test_a_bad_value_gets_the_same_message_from_trainer_and_config(name, value, says):
    with pytest.raises(ConfigurationError) as trainer_error:
        Trainer(model=mlp_task(), **{name: value})
    with pytest.raises(ConfigError) as config_error:
        load_config({**TINY, name: value})
    message = dict(config_error.value.problems)[name]
    assert says in message and repr(value) in message
    assert f"{name}: {message}" in str(trainer_error.value)


def test_trainer_names_every_bad_argument_at_once_before_building_anything():
    train, _ = loaders()
    with pytest.raises(ConfigurationError) as info:
        Trainer(model="not even a model", train_dataloader=train, precision="fp16", nonfinite="ignore",
                eval_interval="1.5ep")
    for name in ("precision: ", "nonfinite: ", "eval_interval: "):
        assert name in str(info.value)


def test_cli_flags_are_config_overrides(tmp_path, monkeypatch):
    import yaml

    import jaxcomposer.runner
    path = tmp_path / "tiny.yaml"
    path.write_text(yaml.safe_dump(TINY))
    seen = {}

    def validate_only(config, overrides):
        seen["cfg"] = load_config(config, overrides)
        raise SystemExit(0)

    monkeypatch.setattr(jaxcomposer.runner, "fit", validate_only)
    with pytest.raises(SystemExit):
        main(["fit", str(path), "--max-duration", "3ba", "--data.batch_size", "64", "--seed", "5",
              "--optimizer", "{name: adam, learning_rate: 0.001}", "--set", "seed=6"])
    cfg = seen["cfg"]
    assert cfg.max_duration == "3ba" and cfg.data.batch_size == 64 and cfg.optimizer["name"] == "adam"
    assert cfg.seed == 6  # --set comes after the flags, so it wins
    assert main(["fit", str(path), "--precision", "fp16"]) == 2
