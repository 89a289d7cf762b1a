"""``jaxcomposer.fit(config)``: a validated config in, a trained model, metrics, a run directory and a plot out."""
from __future__ import annotations

import dataclasses
import inspect
import os
import time
from pathlib import Path
from typing import Any, Mapping

import jax
import numpy as np
import yaml
from flax import nnx

from jaxcomposer import config as config_lib
from jaxcomposer.core import cpu_threads
from jaxcomposer.core.run_state import RunState
from jaxcomposer.core.method import compose
from jaxcomposer.data import dataset_kind, make_loaders
from jaxcomposer.data.data_spec import DataSpec
from jaxcomposer.data.transforms import NormalizeImages
from jaxcomposer.data.mlm import masked_lm_transform
from jaxcomposer.data.datasets import normalize_images
from jaxcomposer import models
from jaxcomposer.models.tasks import CLASSIFICATION_LOSSES, ComposerCausalLM, ComposerClassifier, ComposerMaskedLM
from jaxcomposer.errors import ConfigurationError
from jaxcomposer.options import RUN_OPTIONS
from jaxcomposer.core.collector import collector_paused
from jaxcomposer.trainer.trainer import Trainer
from jaxcomposer.utils.object_store import is_uri

MIN_CACHED_COMPILE_S = 0.1  # programs that compiled in less are not worth a cache file


@dataclasses.dataclass
class FitResult:
    metrics: dict[str, float]
    wall_time_s: float
    run_dir: Path | str  # a local folder, or an object-store URI (s3://bucket/runs/<run_name>)
    state: RunState
    trainer: Trainer
    fallback_note: str | None = None


def _same_on_every_process(seconds: float) -> int:
    """Process 0's clock, in whole seconds, on every process of a multi-process run (so all name the run alike)."""
    if jax.process_count() == 1:
        return int(seconds)
    from jax.experimental import multihost_utils
    return int(multihost_utils.broadcast_one_to_all(np.int32(int(seconds))))  # int32: JAX's default width


def fresh_run_dir(parent: Path, run_name: str) -> Path:
    """``parent/run_name``, or ``run_name-2``, ``-3``, ... when an earlier run already wrote there: a new run never
    appends to or overwrites an old run's files."""
    candidate, n = parent / run_name, 1
    while candidate.exists() and any(candidate.iterdir()):
        n += 1
        candidate = parent / f"{run_name}-{n}"
    return candidate


class NormalizedLoader:
    """A loader whose uint8 images become normalized float32 on the host: for host-side image methods
    (RandAugment, AugMix), which run before anything reaches the device. Forwards length, epoch and position to
    the inner one."""

    def __init__(self, inner, mean: float, std: float):
        self.inner, self.mean, self.std = inner, mean, std

    def __iter__(self):
        for batch in self.inner:
            yield {**batch, "input": normalize_images(batch["input"], self.mean, self.std)}

    def __len__(self):
        return len(self.inner)

    def __getattr__(self, name):  # set_epoch, get_state, set_state, batch_size, num_samples
        return getattr(self.inner, name)


def _flatten(tree: Mapping, prefix: str = "") -> dict[str, Any]:
    """``{'optimizer': {'lr': 0.1}}`` -> ``{'optimizer.lr': 0.1}``: one hyperparameter per leaf."""
    out: dict[str, Any] = {}
    for k, v in tree.items():
        if isinstance(v, Mapping) and v:
            out.update(_flatten(v, f"{prefix}{k}."))
        else:
            out[f"{prefix}{k}"] = v
    return out


def use_compilation_cache(path: str | None) -> str | None:
    """Point JAX's persistent compilation cache at ``path`` (``~`` expanded) unless one is configured already
    (``JAX_COMPILATION_CACHE_DIR`` or ``jax.config``) or ``path`` is None, caching every program that took
    ``MIN_CACHED_COMPILE_S`` or more to compile (unless ``JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS`` says
    otherwise); returns the directory in use, if any."""
    configured = jax.config.jax_compilation_cache_dir
    if configured or path is None:
        return configured or None
    directory = Path(path).expanduser()
    try:
        directory.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise ConfigurationError(f"compilation_cache_dir: cannot create {str(directory)!r} ({e.strerror}); point it "
                                 f"at a writable directory or set it to null to compile every run afresh") from None
    jax.config.update("jax_compilation_cache_dir", str(directory))
    if "JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS" not in os.environ:
        # JAX caches only programs that took >= 1 s to compile, and a small model's train step can compile faster
        # than that: it would then compile again at every run's first step
        jax.config.update("jax_persistent_cache_min_compile_time_secs", MIN_CACHED_COMPILE_S)
    return str(directory)


def prepare_process(cfg: config_lib.Config) -> str:
    """What a run sets up in its process before JAX creates its backends: the config's compilation cache, and one
    XLA:CPU thread beside oneDNN's convolutions on small machines (``jaxcomposer.core.cpu_threads``). Returns the
    thread decision in words. Benchmarks call it to run as ``fit`` does."""
    use_compilation_cache(cfg.compilation_cache_dir)
    return cpu_threads.one_xla_thread_for_onednn(cfg.model)


def fit(config: Any, overrides: list[str] | None = None) -> FitResult:
    """Train from a YAML path, a mapping or a :class:`jaxcomposer.Config`; ``overrides`` are ``a.b=value`` strings.

    Everything is validated first (all problems reported at once, nothing written); then data, model, methods and
    the trainer are built, ``fit`` runs, and the run directory receives ``metrics.jsonl``, ``metrics.png``,
    TensorBoard events and ``config.yaml``.
    """
    cfg = config_lib.load_config(config, overrides)
    thread_note = prepare_process(cfg)
    run_name = cfg.run_name or time.strftime("run-%Y%m%d-%H%M%S", time.localtime(_same_on_every_process(time.time())))
    if is_uri(cfg.run_dir):  # a bucket folder: the Trainer stages the files and uploads them (the run name is new)
        run_dir = f"{str(cfg.run_dir).rstrip('/')}/{run_name}"
    else:
        parent = Path(cfg.run_dir).absolute()
        # a relaunch with autoresume continues the same run: its metrics append to the same directory
        run_dir = parent / run_name if cfg.autoresume else fresh_run_dir(parent, run_name)
    # several processes (jaxcomposer launch): process 0 writes the run directory and shows progress; each process
    # writes its shards of every checkpoint
    lead = jax.process_index() == 0
    trainer, info = build_trainer(cfg, run_name=run_name, run_dir=run_dir if lead else None,
                                  **({} if lead else {"progress_bar": False, "log_to_console": False}))
    # the config as hyperparameters, as Composer logs its Trainer's (MLflow params, W&B config, a JSONL line)
    trainer.logger.log_hyperparameters(_flatten(cfg.model_dump(mode="json")))
    trainer.logger.log_hyperparameters({"xla_cpu_threads": thread_note})
    if info.fallback_note:
        trainer.logger.log_hyperparameters({"data_fallback": info.fallback_note})
    if lead:  # (trainer.run_dir: the local folder, or the staging folder of a bucket's)
        trainer.run_dir.mkdir(parents=True, exist_ok=True)  # the config is there from the start, also if cut short
        (trainer.run_dir / "config.yaml").write_text(yaml.safe_dump(cfg.model_dump(), sort_keys=False))
    start = time.perf_counter()
    try:
        state = trainer.fit()
    finally:
        trainer.close()
    wall = time.perf_counter() - start
    return FitResult(metrics=dict(state.eval_metrics.get("eval", {})), wall_time_s=wall, run_dir=run_dir,
                     state=state, trainer=trainer, fallback_note=info.fallback_note)


def loaders_from_config(cfg: config_lib.Config):
    """``make_loaders`` for the config's data section: (train loader, eval loader, DatasetInfo), not normalized."""
    d = cfg.data
    return make_loaders(d.name, d.batch_size, d.eval_batch_size, seed=cfg.seed, data_dir=d.data_dir,
                        seq_len=d.seq_len, max_bytes=d.max_bytes,
                        **d.model_dump(exclude={"name", "batch_size", "eval_batch_size", "data_dir", "seq_len",
                                                "max_bytes", "mlm_probability"}))


@collector_paused  # loading data, building the model and tracing its initial state make many lasting objects
def build_trainer(cfg: config_lib.Config, **replace: Any):
    """The ``Trainer`` a validated config describes, and the loaded data's ``DatasetInfo``: loaders (normalized
    images), model, optimizer, schedulers, methods, callbacks, loggers and every run option, as ``fit`` builds it,
    except the run directory (none: nothing is written unless ``replace`` names one). ``replace`` overrides Trainer
    arguments (a benchmark passes its own ``callbacks=[...]`` and ``loggers=[]``)."""
    d = cfg.data
    train, evals, info = loaders_from_config(cfg)
    if jax.process_count() > 1:  # launched on several processes: each feeds its devices its rows of every batch
        train.shard_for_processes(jax.process_index(), jax.process_count())
    algorithms = [config_lib.build_component(_with_normalization({"name": n, **(kw or {})}, info),
                                             config_lib.ALGORITHMS) for n, kw in cfg.algorithms.items()]
    if info.mean is not None:  # every image dataset says its pixel statistics
        if compose(algorithms).has_data:  # host-side methods work on the normalized images
            train, evals = (NormalizedLoader(x, info.mean, info.std) for x in (train, evals))
        else:  # normalized in the compiled steps
            normalize = NormalizeImages(info.mean, info.std)
            train, evals = (DataSpec(x, batch_transforms=normalize) for x in (train, evals))
    if models.MODEL_KINDS.get(cfg.model["name"]) == "masked_lm":
        # masking is host work, per batch, seeded from (seed, epoch, batch): resumes exactly, evaluates the same
        # masked positions every time
        mask_id = info.num_classes if info.mask_token_id is None else info.mask_token_id
        train.transform = evals.transform = masked_lm_transform(mask_token_id=mask_id, vocab_size=info.num_classes,
                                                                mlm_probability=d.mlm_probability)
    components = {
        "model": _build_task(cfg, info), "train_dataloader": train, "eval_dataloader": evals,
        "optimizers": config_lib.build_component(cfg.optimizer, config_lib.OPTIMIZERS),
        "schedulers": [config_lib.build_component(s, config_lib.SCHEDULERS) for s in cfg.schedulers],
        "algorithms": algorithms,
        "callbacks": [config_lib.build_component({"name": n, **(kw or {})}, config_lib.CALLBACKS)
                      for n, kw in cfg.callbacks.items()],
        "loggers": [config_lib.build_component({"name": n, **(kw or {})}, config_lib.LOGGERS)
                    for n, kw in cfg.loggers.items()],
    }
    run_options = {o.name: getattr(cfg, o.name) for o in RUN_OPTIONS}  # the config holds every one of them
    # the config's run_dir is the parent of run directories; the run's own (fresh) one is fit's to choose
    run_options["run_dir"] = None
    return Trainer(**{**run_options, **components, **replace}), info


def _with_normalization(spec: dict, info) -> dict:
    """Host-side image methods (RandAugment, AugMix) see the loader's normalized floats: tell them the dataset's
    mean and std so they can work on pixels, unless the config already says."""
    factory = config_lib.ALGORITHMS[config_lib.lookup(config_lib.ALGORITHMS, spec["name"])]
    accepts = inspect.signature(factory).parameters
    if info.mean is not None and "mean" in accepts and "std" in accepts and "mean" not in spec and "std" not in spec:
        return {**spec, "mean": info.mean, "std": info.std}
    return spec


def _build_task(cfg, info):
    """The config's model as a task; a model argument its builder refuses (``depth: 7``) is a ``ConfigError``."""
    try:
        return _build_task_unchecked(cfg, info)
    except (TypeError, ValueError) as e:
        if isinstance(e, config_lib.ConfigError):
            raise
        kwargs = {k: v for k, v in cfg.model.items() if k != "name"}
        raise config_lib.ConfigError([config_lib.problem_from_error("model", kwargs, e)]) from None


def _image_kwargs(info) -> dict:
    return {"num_classes": info.num_classes, "in_channels": info.input_shape[-1]}


def _flat_features(info) -> int:
    n = 1
    for s in info.input_shape:
        n *= s
    return n


# config model name -> the module from the data's DatasetInfo, the config's model keywords and the run's rngs. The
# data supplies what it determines (classes, channels, image size, vocabulary, context); the config's keywords come
# last and win. models.MODEL_KINDS says what each trains ("image" classification, "causal_lm", "masked_lm").
MODEL_FROM_DATA: dict[str, Any] = {
    "mlp": lambda info, kw, rngs: models.MLP(
        **{"in_features": _flat_features(info), "num_classes": info.num_classes, **kw}, rngs=rngs),
    "convnet": lambda info, kw, rngs: models.ConvNet(
        **{**_image_kwargs(info), "image_size": info.input_shape[0], **kw}, rngs=rngs),
    "resnet_cifar": lambda info, kw, rngs: models.ResNetCIFAR(**{**_image_kwargs(info), **kw}, rngs=rngs),
    "resnet": lambda info, kw, rngs: models.resnet(**{**_image_kwargs(info), **kw}, rngs=rngs),
    "vit": lambda info, kw, rngs: models.vit(
        **{**_image_kwargs(info), "image_size": tuple(info.input_shape[:2]), **kw}, rngs=rngs),
    "gpt": lambda info, kw, rngs: models.GPT(
        **{"vocab_size": info.num_classes, "seq_len": info.input_shape[0], **kw}, rngs=rngs),
    "gpt2": lambda info, kw, rngs: models.gpt2(
        **{"vocab_size": info.num_classes, "seq_len": info.input_shape[0], **kw}, rngs=rngs),
    # without a [MASK] in the tokenizer (byte-level text, GPT-2's BPE) one extra embedding row is the mask token
    "bert": lambda info, kw, rngs: models.bert(
        **{"vocab_size": info.num_classes + (info.mask_token_id is None),
           "max_position_embeddings": info.input_shape[0], **kw}, rngs=rngs),
}


def _build_task_unchecked(cfg, info):
    kwargs = {k: v for k, v in cfg.model.items() if k not in ("name", "loss")}
    name = cfg.model["name"]
    kind, build = models.MODEL_KINDS[name], MODEL_FROM_DATA[name]
    data_kind = dataset_kind(info.name)
    if (kind == "image") != (data_kind == "image"):
        wants = "an image dataset" if kind == "image" else "a text dataset"
        raise config_lib.ConfigError([("model.name", f"{name!r} needs {wants}; data.name {info.name!r} is "
                                                     f"{data_kind}")])
    module = build(info, kwargs, nnx.Rngs(cfg.seed))
    if kind == "causal_lm":
        return ComposerCausalLM(module)
    if kind == "masked_lm":
        return ComposerMaskedLM(module)
    return ComposerClassifier(module, num_classes=info.num_classes, loss_fn=CLASSIFICATION_LOSSES[
        cfg.model.get("loss", "cross_entropy")])
