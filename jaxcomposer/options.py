"""Every run option, declared once: its name, type, default and one line of documentation.

Three things are produced from these tables, so they cannot drift apart:

- the ``Trainer`` validates its arguments with :func:`validate_trainer_args` (and its ``help()`` text lists them);
- :class:`Config`, the schema behind ``jaxcomposer.fit(config)`` and ``jaxcomposer fit CONFIG``;
- ``jaxcomposer fit --help``, where every option is also a flag (``--max_duration 2ep``).

``RUN_OPTIONS`` are the plain values both take. ``TRAINER_OBJECTS`` are the Python objects only the ``Trainer``
takes (a module, loaders, an optimizer); a config names them instead, through ``CONFIG_COMPONENTS`` and
``DATA_OPTIONS``. A type is a pydantic annotation, so the same check runs in the Trainer and in the config.
"""
from __future__ import annotations

import dataclasses
import os
import textwrap
from typing import Annotated, Any, Literal

import pydantic

from jaxcomposer.core.time import Time, TimeUnit
from jaxcomposer.errors import ConfigurationError

_SAME = object()


@dataclasses.dataclass(frozen=True)
class Option:
    name: str
    type: Any  # a pydantic annotation
    default: Any
    doc: str
    config_default: Any = _SAME  # where ``jaxcomposer fit`` wants another default than the Trainer (seed, run_dir)

    @property
    def default_in_config(self) -> Any:
        return self.default if self.config_default is _SAME else self.config_default


# ---- parsers: one place decides what a duration or an interval may be ----
def parse_duration(value: Any, name: str = "duration") -> Time:
    """A positive duration in ep, ba, sp or tok; a bare int counts epochs, as in Composer."""
    try:
        t = Time.from_input(value, TimeUnit.EPOCH)
    except (TypeError, ValueError) as e:
        raise ConfigurationError(f"{name}: {e}") from e
    if t.unit not in (TimeUnit.EPOCH, TimeUnit.BATCH, TimeUnit.SAMPLE, TimeUnit.TOKEN) or t.value <= 0:
        raise ConfigurationError(f"{name}: got {value!r}, expected a positive duration in ep, ba, sp or tok "
                                 "such as '10ep' or '500ba'")
    return t


def parse_interval(value: Any, name: str) -> Time | None:
    """A positive number of epochs or batches between events (an int counts epochs); 0 or None disables it."""
    if value in (0, "0", None):
        return None
    try:
        iv = Time.from_input(value, TimeUnit.EPOCH)
    except (TypeError, ValueError) as e:
        raise ConfigurationError(f"{name}: {e}") from e
    if iv.unit not in (TimeUnit.EPOCH, TimeUnit.BATCH) or iv.value <= 0:
        raise ConfigurationError(f"{name}: got {value!r}, expected a positive number of epochs or batches "
                                 "such as '1ep' or '500ba' (0 disables it)")
    return iv


def _checked_by(parse, allow_callable: bool = False):
    """A pydantic validator that runs ``parse`` for its checks and keeps the value as written (a config stays
    YAML: ``'2ep'`` is stored as ``'2ep'``)."""
    def check(value):
        if value is None or (allow_callable and callable(value)):
            return value
        if isinstance(value, bool):
            raise ValueError(f"expected a time such as '10ep' or '500ba', got {value!r}")
        try:
            parse(value, "value")
        except ConfigurationError as e:
            raise ValueError(str(e).removeprefix("value: ")) from None
        return value
    return pydantic.BeforeValidator(check)


def _path(value):
    if value is None or isinstance(value, str):
        return value
    if isinstance(value, os.PathLike):
        return os.fspath(value)
    raise ValueError(f"expected a path (str or os.PathLike), got {type(value).__name__}")


def _str_list(value):
    if value is None:
        return []
    return [value] if isinstance(value, str) else value


def _microbatch_size(value):
    if value is None or value == "auto" or (isinstance(value, int) and not isinstance(value, bool) and value > 0):
        return value
    raise ValueError(f"expected an int greater than 0 or 'auto', got {value!r}")


Duration = Annotated[Any, _checked_by(parse_duration)]
MicrobatchSize = Annotated[Any, pydantic.BeforeValidator(_microbatch_size)]
Interval = Annotated[Any, _checked_by(parse_interval)]
IntervalOrCallable = Annotated[Any, _checked_by(parse_interval, allow_callable=True)]
PathOrNone = Annotated[Any, pydantic.BeforeValidator(_path)]
BatchCount = Annotated[int, pydantic.Field(ge=-1)]
Precision = Literal["fp32", "amp_bf16"]

RUN_OPTIONS: tuple[Option, ...] = (
    Option("max_duration", Duration, None,
           "how long to train: '10ep', '500ba', '60000sp', '1e6tok', or an int of epochs (required to fit, unless "
           "fit(duration=...) is given)"),
    Option("compute_training_metrics", bool, False,
           "compute the model's train metrics (get_metrics(is_train=True)) every batch and log metrics/train/<name> "
           "over the epoch so far, as Composer; costs one more forward (without gradient) per batch"),
    Option("step_schedulers_every_batch", bool | None, None,
           "step torch LR schedulers after every batch (default None: at each epoch's end, as Composer steps "
           "PyTorch schedulers); jaxcomposer.optim's schedulers are functions of the step either way"),
    Option("scale_schedule_ratio", pydantic.PositiveFloat, 1.0,
           "scales max_duration and the schedules (Composer's SSR); needs schedulers"),
    Option("eval_interval", Interval, 1,
           "evaluate every N epochs (an int or 'Nep') or batches ('Nba'); 0 disables it"),
    Option("eval_subset_num_batches", BatchCount, -1, "evaluate on at most this many batches (-1: all)"),
    Option("train_subset_num_batches", BatchCount, -1, "train on at most this many batches per epoch (-1: all)"),
    Option("seed", int | None, None, "the run's seed (random when None); every random draw derives from it and the "
                                     "step", config_default=17),
    Option("precision", Precision | None, None, "'fp32' or 'amp_bf16' (fp32 master weights, bf16 compute); "
                                                "None is 'fp32'", config_default="fp32"),
    Option("device_train_microbatch_size", MicrobatchSize, None,
           "gradient accumulation in microbatches of this size (must divide the batch and be a multiple of the "
           "device count); the update equals the full-batch one. 'auto': the largest size whose compiled step fits "
           "device_memory_bytes, chosen from XLA's memory analysis before the first step"),
    Option("steps_per_execution", pydantic.PositiveInt, 1,
           "train this many batches per compiled call (a scan over the step, as Keras's steps_per_execution): less "
           "host work per batch where steps are short. Events still fire per batch, after the call; callbacks then "
           "see the state after its last batch, and a stop takes effect at its end"),
    Option("device_memory_bytes", pydantic.PositiveInt | None, None,
           "per-device memory 'auto' microbatching fits the train step into (default: the device's limit as JAX "
           "reports it; CPUs report none, so there 'auto' keeps the whole batch unless this is set). Ours"),
    Option("parallelism_config", dict[str, Any] | None, None,
           "Composer's {fsdp: {sharding_strategy: FULL_SHARD | SHARD_GRAD_OP | NO_SHARD | HYBRID_SHARD, "
           "data_parallel_shard_degree, data_parallel_replicate_degree}, tp: {tensor_parallel_degree}}: one mesh of "
           "(data, fsdp, tensor) axes (jaxcomposer.parallel); None: data parallel over every device"),
    Option("fsdp_config", dict[str, Any] | None, None,
           "Composer's older spelling of parallelism_config={fsdp: ...}"),
    Option("run_name", str | None, None, "names the run (and, with autoresume, recognises a relaunch of it)"),
    Option("run_dir", PathOrNone, None, "where metrics.jsonl, TensorBoard events and metrics.png go (none when "
                                        "None); local, or s3://bucket/prefix, gs://... (staged locally, uploaded "
                                        "at each epoch's end and at the end)", config_default="runs"),
    Option("progress_bar", bool, True, "show a progress bar with loss, throughput and ETA"),
    Option("log_to_console", bool, False, "also print metrics as lines", config_default=True),
    Option("console_log_interval", Interval, "1ba", "with log_to_console, print training metrics every 'Nba' or "
                                                    "'Nep' (evaluations always print)", config_default="1ep"),
    Option("console_stream", Literal["stdout", "stderr"], "stderr", "where log_to_console prints"),
    Option("load_path", PathOrNone, None, "a checkpoint directory, or a save_folder (its newest good step), to "
                                          "start from; local, or s3://bucket/prefix, gs://bucket/prefix"),
    Option("save_folder", PathOrNone, None, "where periodic checkpoints go (orbax; atomic, async, checksummed); "
                                            "local, or an object store: s3://bucket/prefix, gs://bucket/prefix"),
    Option("save_interval", IntervalOrCallable, "1ep", "checkpoint every 'Nep' or 'Nba', or when a "
                                                       "(state, event) -> bool callable says so"),
    Option("save_num_checkpoints_to_keep", BatchCount, -1, "keep the newest N checkpoints (-1: all)"),
    Option("save_filename", str, "ep{epoch}-ba{batch}-rank{rank}.pt",
           "Composer's name for each checkpoint in save_folder: a link to its verified step directory, made once "
           "the step is committed; load_path takes it"),
    Option("save_latest_filename", str | None, "latest-rank{rank}.pt",
           "a name that always links to the newest committed checkpoint (None: none)"),
    Option("save_overwrite", bool, False, "replace an earlier run's checkpoints in save_folder (deleted at the "
                                          "first save)"),
    Option("save_weights_only", bool, False, "save params and model state only (such a checkpoint cannot continue "
                                             "a run)"),
    Option("load_weights_only", bool, False, "restore only params and model state from load_path; training starts "
                                             "at batch 0"),
    Option("load_ignore_keys", Annotated[list[str], pydantic.BeforeValidator(_str_list)], (),
           "globs on dotted paths ('params.head.*') kept freshly initialised on load"),
    Option("autoresume", bool, False, "continue from the newest good checkpoint in save_folder (needs run_name)"),
    Option("nonfinite", Literal["raise", "skip"], "raise",
           "'raise' stops at the first NaN/inf loss or gradient (noticed within 8 steps, and before any save or "
           "eval); 'skip' skips such steps (never applied; the clock still advances). Ours: Composer has no such "
           "policy"),
    Option("nonfinite_max_skips", Annotated[int, pydantic.Field(ge=0)], 10,
           "with nonfinite='skip', raise after this many skipped steps in a row"),
)

TRAINER_OBJECTS: tuple[Option, ...] = (
    Option("model", Any, None, "a task (ComposerClassifier, ComposerCausalLM or your own Task) around a Flax NNX "
                               "module, or a bare torch nn.Module (a classifier, converted from the first batch)"),
    Option("train_dataloader", Any, None, "an iterable of dict batches or (input, target) pairs (numpy, jax or "
                                          "torch arrays), or a DataSpec around one (its transforms run in the "
                                          "compiled step); loaders with set_state/set_epoch resume exactly"),
    Option("eval_dataloader", Any, None, "batches for eval(), or a DataSpec around them; padded and masked so "
                                         "every example counts once. Several sets: a list of Evaluator(label, "
                                         "dataloader, metric_names, subset_num_batches, eval_interval), each "
                                         "logged as metrics/<label>/<name>"),
    Option("optimizers", Any, None, "an optax GradientTransformation (DecoupledSGDW, DecoupledAdamW or any optax "
                                    "one) or a one-element list of it; default DecoupledSGDW(lr=0.1), as Composer"),
    Option("schedulers", Any, None, "Composer schedulers from jaxcomposer.optim, one or a list; their multipliers "
                                    "compose"),
    Option("algorithms", Any, None, "speedup methods from jaxcomposer.algorithms, composed in one step (conflicts "
                                    "raise), and your own Composer Algorithm subclasses (match/apply; the in-step "
                                    "events run inside the compiled step)"),
    Option("algorithm_passes", Any, None, "Composer's engine passes for your Algorithms: fn(algorithms, event) -> "
                                          "algorithms, one or a list, applied in order after the default ones "
                                          "(AFTER_* events run last in, first out)"),
    Option("callbacks", Any, None, "host callbacks run at Composer's events"),
    Option("loggers", Any, None, "logger destinations (jaxcomposer.loggers)"),
    Option("devices", Any, None, "the devices of the data-parallel mesh (default: all)"),
    Option("profiler", Any, None, "Composer's Profiler (jaxcomposer.profiler): Chrome JSON traces of the loop's "
                                  "phases and a jax.profiler device trace, in the batches its schedule picks"),
    Option("device", Any, None, "Composer's device: 'cpu', 'gpu' or 'tpu' (every device of that platform) or one "
                                "JAX device; default: JAX's default platform"),
)

TRAINER_OPTIONS: dict[str, Option] = {o.name: o for o in TRAINER_OBJECTS + RUN_OPTIONS}

DATA_OPTIONS: tuple[Option, ...] = (
    Option("name", Literal["fashion_mnist", "digits", "stdlib_text", "imagefolder", "imagenet", "synthetic_images",
                           "synthetic_tokens", "text_files", "tfds_text"], "fashion_mnist",
           "the dataset (Fashion-MNIST falls back to digits when its Debian package is missing)"),
    Option("batch_size", pydantic.PositiveInt, 128, "training batch size"),
    Option("eval_batch_size", pydantic.PositiveInt, 1000, "evaluation batch size"),
    Option("data_dir", str | None, None, "where the dataset's files are (default: the system's location)"),
    Option("seq_len", pydantic.PositiveInt, 128, "text datasets: tokens per example"),
    Option("max_bytes", pydantic.PositiveInt | None, None, "text datasets: read at most this many bytes"),
    Option("image_size", pydantic.PositiveInt, 224, "imagefolder/imagenet/synthetic_images: side of the square "
                                                    "images (train RandomResizedCrop, eval resize to size/0.875 "
                                                    "+ center crop)"),
    Option("eval_image_size", pydantic.PositiveInt | None, None, "imagefolder/imagenet/synthetic_images: side of "
           "the evaluation's center crop (default: image_size; Composer's ResNet recipes train at 176, evaluate at "
           "224)"),
    Option("eval_resize", pydantic.PositiveInt | None, None, "imagefolder/imagenet: shorter side the evaluation "
           "resizes to before its center crop (default: eval_image_size / 0.875; Composer's ResNet recipes: 232)"),
    Option("num_workers", pydantic.NonNegativeInt, 8, "imagefolder/imagenet: threads decoding images (0 or 1: "
                                                      "the loading thread); batches are the same for any value"),
    Option("tokenizer_dir", str | None, None, "text_files/tfds_text: folder with the tokenizer's tokenizer.json "
                                              "(and tokenizer_config.json naming eos_token)"),
    Option("cache_dir", str | None, None, "text_files/tfds_text: where the tokenized corpus is cached (default: "
                                          "next to the data)"),
    Option("tfds_name", str | None, None, "imagenet/tfds_text: the TFDS dataset in data_dir (default "
                                          "imagenet2012, c4/en)"),
    Option("synthetic_num_classes", pydantic.PositiveInt, 1000, "synthetic_images: number of classes"),
    Option("synthetic_vocab_size", pydantic.PositiveInt, 50257, "synthetic_tokens: vocabulary size"),
    Option("synthetic_num_train", pydantic.PositiveInt, 1281167, "synthetic datasets: examples in a nominal "
                                                                 "training epoch (default ImageNet's)"),
    Option("synthetic_num_eval", pydantic.PositiveInt, 50000, "synthetic datasets: examples in the eval set"),
    Option("mlm_probability", Annotated[float, pydantic.Field(gt=0, lt=1)], 0.15,
           "masked-LM models (bert): share of tokens selected for prediction (80% [MASK], 10% random, 10% kept)"),
)

_STRICT = pydantic.ConfigDict(extra="forbid", validate_default=True)  # defaults come out as a config holds them


def _model(name: str, options: tuple[Option, ...], doc: str, **extra) -> type[pydantic.BaseModel]:
    fields = {o.name: (o.type, pydantic.Field(default=o.default_in_config, description=o.doc)) for o in options}
    return pydantic.create_model(name, __config__=_STRICT, __doc__=doc, **fields, **extra)


DataConfig = _model("DataConfig", DATA_OPTIONS, "The dataset a config trains and evaluates on.")

CONFIG_COMPONENTS: tuple[Option, ...] = (
    Option("model", dict[str, Any], {"name": "resnet_cifar"}, "the model: {name: ..., <its builder's arguments>}"),
    Option("data", DataConfig, DataConfig(), "the dataset: " + ", ".join(f"{o.name}" for o in DATA_OPTIONS)),
    Option("optimizer", dict[str, Any], {"name": "decoupled_sgdw", "lr": 0.1},
           "the optimizer: {name: ..., <its arguments>}"),
    Option("schedulers", list[dict[str, Any]], [], "schedulers: a list of {name: ..., <its arguments>}"),
    Option("algorithms", dict[str, dict[str, Any] | None], {}, "speedup methods: {name: {<its arguments>}}"),
    Option("callbacks", dict[str, dict[str, Any] | None], {}, "callbacks: {name: {<its arguments>}}"),
    Option("loggers", dict[str, dict[str, Any] | None], {},
           "more logger destinations, beside the run directory's: {mlflow: {<MLFlowLogger arguments>}, wandb: {...}}"),
)

# Options of the process ``jaxcomposer fit`` runs in, not of the Trainer (whose users set JAX's config themselves)
PROCESS_OPTIONS: tuple[Option, ...] = (
    Option("compilation_cache_dir", str | None, "~/.cache/jaxcomposer/xla",
           "JAX's persistent compilation cache: a rerun of the same steps loads them instead of compiling them "
           "again, most of a small run's start-up (benchmarks/README.md); null turns it off. An already configured "
           "cache (JAX_COMPILATION_CACHE_DIR, jax.config) is left alone"),
)

Config = _model("Config", RUN_OPTIONS + PROCESS_OPTIONS + CONFIG_COMPONENTS,
                "A whole run, as ``jaxcomposer fit`` reads it. Field names follow Composer's Trainer arguments; "
                "each field's description is its documentation (``jaxcomposer fit --help`` lists them).")
_TrainerArgs = _model("TrainerArgs", RUN_OPTIONS, "The Trainer's plain-valued arguments, validated together.")


def validate_trainer_args(values: dict[str, Any]) -> pydantic.BaseModel:
    """Check the Trainer's plain-valued arguments against ``RUN_OPTIONS``, all at once: every bad one is named
    with its value and what was expected. Returns them validated (``load_ignore_keys`` a list, paths str)."""
    try:
        return _TrainerArgs.model_validate({o.name: values[o.name] for o in RUN_OPTIONS})
    except pydantic.ValidationError as e:
        raise ConfigurationError("; ".join(f"{loc}: {msg}" for loc, msg in describe_errors(e))) from None


def describe_errors(error: pydantic.ValidationError) -> list[tuple[str, str]]:
    """``(dotted.path, message)`` per problem, the message ending with the value that was given."""
    problems = []
    for err in error.errors():
        loc = ".".join(str(p) for p in err["loc"])
        msg = err["msg"].removeprefix("Value error, ")
        value = err.get("input")
        problems.append((loc, msg if isinstance(value, (dict, list)) or err["type"] == "extra_forbidden"
                         else f"{msg} (got {value!r})"))
    return problems


def args_doc(options: tuple[Option, ...], indent: str = "    ") -> str:
    """A Google-style ``Args:`` section for these options, each entry wrapped at 110 columns."""
    entries = [textwrap.fill(f"{o.name}: {o.doc}" + ("" if o.default is None else f" (default {o.default!r})"),
                             110, initial_indent=indent + "    ", subsequent_indent=indent + "        ",
                             break_on_hyphens=False)
               for o in options]
    return f"\n{indent}Args:\n" + "\n".join(entries) + "\n"
