"""ExportForInferenceCallback and ImageVisualizer in real (tiny) runs of the Trainer: the exported files hold the
trained weights and reproduce the model's outputs; the image grid's pixels are the batch's images."""
import importlib.util

import jax
import numpy as np
import pytest
from flax import nnx

from jaxcomposer import Trainer
from jaxcomposer.callbacks import ExportForInferenceCallback, ImageVisualizer
from jaxcomposer.callbacks.export_for_inference import export_stablehlo
from jaxcomposer.callbacks.image_visualizer import to_uint8
from jaxcomposer.core.events import Callback, Event
from jaxcomposer.core.run_state import RunPlan, RunState
from jaxcomposer.core.time import Timestamp
from jaxcomposer.data import ArrayLoader
from jaxcomposer.loggers import LoggerDestination
from jaxcomposer.models import MLP
from jaxcomposer.models.tasks import ComposerClassifier
from jaxcomposer.optim import DecoupledSGDW
from tests.trainer.helpers import digits, loaders, mlp_task

HAS_FLATBUFFERS = importlib.util.find_spec("flatbuffers") is not None


def _flat(tree) -> dict:
    """{dotted path: numpy array}, the names safetensors files hold."""
    out = {}
    for path, leaf in jax.tree_util.tree_flatten_with_path(tree)[0]:
        parts = [str(getattr(k, "key", getattr(k, "idx", getattr(k, "name", k)))) for k in path]
        out[".".join(p for p in parts if p != "value")] = np.asarray(leaf)
    return out


def _train_mlp(tmp_path, callbacks, batches=4, **kw):
    train, _ = loaders(batch_size=32, n_train=128)
    task = mlp_task()
    initial = _flat(nnx.state(task.source, nnx.Param))
    trainer = Trainer(model=task, train_dataloader=train, max_duration=f"{batches}ba", seed=0, progress_bar=False,
                      optimizers=DecoupledSGDW(lr=0.5), callbacks=callbacks, **kw)
    trainer.fit()
    return trainer, initial


# ---------------------------------------------------------------------------------------------- NNX exports
def test_nnx_safetensors_export_holds_the_final_weights(tmp_path):
    from safetensors.numpy import load_file

    path = tmp_path / "out" / "model.safetensors"
    export = ExportForInferenceCallback("safetensors", path)
    uploads = []

    class Uploader(LoggerDestination):
        def upload_file(self, remote_file_name, file_path, overwrite=False):
            uploads.append((remote_file_name, file_path))

    trainer, initial = _train_mlp(tmp_path, [export], loggers=[Uploader()])
    assert export.exported_path == path
    assert uploads == [(str(path), path)]  # as Composer, the export goes to the logger's file uploaders
    saved = load_file(str(path))
    final = _flat(trainer.state.train_state.params)
    assert set(saved) == set(final) == {"hidden.0.kernel", "hidden.0.bias", "head.kernel", "head.bias"}
    for name, value in final.items():
        np.testing.assert_array_equal(saved[name], value, err_msg=name)
    # the weights after 4 steps, not the initial ones
    assert not np.allclose(saved["head.kernel"], initial["head.kernel"])


def test_stablehlo_reproduces_the_trained_model_for_any_batch_size(tmp_path):
    trainer, _ = _train_mlp(tmp_path, [])
    module = trainer.state.model  # the Trainer wrote the trained weights into it at the end of fit
    x = digits("test", n=11)["input"]
    exported = export_stablehlo(module, x[:4])
    expected = np.asarray(module(x, train=False))
    for n in (1, 7, 11):  # the batch axis is symbolic: not only the sample's 4
        np.testing.assert_allclose(np.asarray(exported.call(x[:n])), expected[:n], rtol=1e-5, atol=1e-6)
    if HAS_FLATBUFFERS:
        restored = jax.export.deserialize(exported.serialize())
        np.testing.assert_allclose(np.asarray(restored.call(x)), expected, rtol=1e-5, atol=1e-6)


@pytest.mark.skipif(not HAS_FLATBUFFERS, reason="jax.export serializes through the flatbuffers package")
def test_stablehlo_file_from_the_callback_deserializes_to_the_trained_model(tmp_path):
    path = tmp_path / "model.stablehlo"
    trainer, _ = _train_mlp(tmp_path, [ExportForInferenceCallback("stablehlo", path)])
    x = digits("test", n=9)["input"]
    restored = jax.export.deserialize(bytearray(path.read_bytes()))
    expected = np.asarray(trainer.state.model(x, train=False))
    np.testing.assert_allclose(np.asarray(restored.call(x)), expected, rtol=1e-5, atol=1e-6)


def test_stablehlo_without_flatbuffers_is_refused_before_training(monkeypatch, tmp_path):
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "flatbuffers" else real(name, *a))
    train, _ = loaders(batch_size=32, n_train=64)
    with pytest.raises(ImportError, match="'flatbuffers' package"):
        Trainer(model=mlp_task(), train_dataloader=train, max_duration="1ba", progress_bar=False,
                callbacks=[ExportForInferenceCallback("stablehlo", tmp_path / "m")])
    assert not (tmp_path / "m").exists()


@pytest.mark.skipif(not HAS_FLATBUFFERS, reason="INIT refuses 'stablehlo' without flatbuffers")
def test_stablehlo_asks_for_sample_input_at_the_first_batch_when_the_batch_has_no_input(tmp_path):
    from jaxcomposer.data import lm_arrays
    from jaxcomposer.models import GPT
    from jaxcomposer.models.tasks import ComposerCausalLM

    tokens = np.random.default_rng(0).integers(0, 16, 16 * 9 + 1)
    loader = ArrayLoader(lm_arrays(tokens, 8), 4, shuffle=False)
    task = ComposerCausalLM(GPT(16, seq_len=8, d_model=16, n_layers=1, n_heads=2, rngs=nnx.Rngs(0)))
    seen = []

    class Count(Callback):
        def batch_end(self, state, logger):
            seen.append(state.timestamp.batch)

    trainer = Trainer(model=task, train_dataloader=loader, max_duration="3ba", progress_bar=False,
                      callbacks=[ExportForInferenceCallback("stablehlo", tmp_path / "m"), Count()])
    with pytest.raises(ValueError, match="no 'input' entry.*sample_input"):
        trainer.fit()
    assert seen == []  # raised at the first batch's end, not after training


def test_refusals_name_the_problem(tmp_path):
    with pytest.raises(ValueError, match="save_format must be one of"):
        ExportForInferenceCallback("tflite", tmp_path / "m")
    with pytest.raises(TypeError, match="save_object_store must have Composer's upload_object"):
        ExportForInferenceCallback("safetensors", tmp_path / "m", save_object_store=object())
    train, _ = loaders(batch_size=32, n_train=64)
    with pytest.raises(ValueError, match="'torchscript' does not apply to an NNX model.*stablehlo"):
        Trainer(model=mlp_task(), train_dataloader=train, max_duration="1ba", progress_bar=False,
                callbacks=[ExportForInferenceCallback("torchscript", tmp_path / "m")])


# -------------------------------------------------------------------------------------------- torch exports
def _torch_mlp():
    import torch

    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Flatten(), torch.nn.Linear(64, 16), torch.nn.ReLU(), torch.nn.Linear(16, 10))


def test_torch_exports_hold_the_final_weights_and_reproduce_the_model(tmp_path):
    import torch
    from safetensors.torch import load_file

    module = _torch_mlp()
    initial = {k: v.clone() for k, v in module.state_dict().items()}
    paths = {fmt: tmp_path / f"model.{fmt}" for fmt in ("torchscript", "state_dict", "safetensors")}
    train, _ = loaders(batch_size=32, n_train=128)
    trainer = Trainer(model=module, train_dataloader=train, max_duration="4ba", seed=0, progress_bar=False,
                      optimizers=DecoupledSGDW(lr=0.5),
                      callbacks=[ExportForInferenceCallback(fmt, path) for fmt, path in paths.items()])
    trainer.fit()
    final = {name: np.asarray(v) for name, v in trainer.state.train_state.params.items()}
    assert set(final) == {"1.weight", "1.bias", "3.weight", "3.bias"}
    assert not np.allclose(final["3.weight"], initial["3.weight"].numpy())

    for fmt, loaded in (("state_dict", torch.load(paths["state_dict"])),
                        ("safetensors", load_file(str(paths["safetensors"])))):
        assert set(loaded) == set(final), fmt
        for name, value in final.items():
            np.testing.assert_array_equal(loaded[name].numpy(), value, err_msg=f"{fmt}: {name}")

    scripted = torch.jit.load(str(paths["torchscript"]))
    for name, value in final.items():
        np.testing.assert_array_equal(scripted.state_dict()[name].numpy(), value, err_msg=name)
    x = torch.from_numpy(digits("test", n=5)["input"])
    with torch.no_grad():
        np.testing.assert_allclose(scripted(x).numpy(), module(x).numpy(), rtol=1e-6)  # module: synced after fit


def test_torch_composer_classifier_wrapper_is_exported_whole(tmp_path):
    """``state.model`` is Composer's torch ComposerClassifier: its state dict names the run's weights
    ``module.<name>``, and the callback maps them there."""
    import torch

    wrapper = ComposerClassifier(_torch_mlp(), num_classes=10)
    assert isinstance(wrapper, torch.nn.Module)
    path = tmp_path / "wrapper.pt"
    train, _ = loaders(batch_size=32, n_train=128)
    trainer = Trainer(model=wrapper, train_dataloader=train, max_duration="2ba", seed=0, progress_bar=False,
                      optimizers=DecoupledSGDW(lr=0.5), callbacks=[ExportForInferenceCallback("state_dict", path)])
    trainer.fit()
    loaded = torch.load(path)
    final = trainer.state.train_state.params
    assert set(loaded) == {f"module.{name}" for name in final}
    for name, value in final.items():
        np.testing.assert_array_equal(loaded[f"module.{name}"].numpy(), np.asarray(value), err_msg=name)


@pytest.mark.skipif(importlib.util.find_spec("onnx") is not None, reason="onnx is installed")
def test_onnx_without_the_onnx_package_is_refused_before_training(tmp_path):
    train, _ = loaders(batch_size=32, n_train=64)
    with pytest.raises(ImportError, match="'onnx' package"):
        Trainer(model=_torch_mlp(), train_dataloader=train, max_duration="1ba", progress_bar=False,
                callbacks=[ExportForInferenceCallback("onnx", tmp_path / "m.onnx")])


# ------------------------------------------------------------------------------------------ ImageVisualizer
def _png(path) -> np.ndarray:
    from PIL import Image
    return np.asarray(Image.open(path))


def test_train_grid_pixels_are_the_batch_images(tmp_path):
    """RGB images (N, 3, 4, 4) with values k/255: the PNG holds k, laid out 8 to a row with 2 black pixels around
    each image."""
    rng = np.random.default_rng(0)
    n = 40
    images = rng.integers(0, 256, (n, 3, 4, 4)).astype(np.float32) / 255.0
    loader = ArrayLoader({"input": images, "target": rng.integers(0, 10, n).astype(np.int32)}, 10, shuffle=False)
    batches = {}

    class Record(Callback):
        def batch_end(self, state, logger):
            batches[state.timestamp.batch] = np.asarray(state.batch["input"])

    task = ComposerClassifier(MLP(48, hidden=(8,), num_classes=10, rngs=nnx.Rngs(0)), num_classes=10)
    viz = ImageVisualizer(interval="2ba", num_images=9)
    Trainer(model=task, train_dataloader=loader, max_duration="4ba", run_dir=tmp_path / "run", progress_bar=False,
            callbacks=[viz, Record()]).fit()

    written = sorted(p.name for p in (tmp_path / "run" / "images").iterdir())
    assert written == ["train-ba1.png", "train-ba3.png"]  # Composer's batches 0, 2 (counted before the forward)
    for batch in (1, 3):
        grid = _png(tmp_path / "run" / "images" / f"train-ba{batch}.png")
        assert grid.shape == (2 * 6 + 2, 8 * 6 + 2, 3) and grid.dtype == np.uint8
        expected_pixels = np.rint(batches[batch][:9].transpose(0, 2, 3, 1) * 255).astype(np.uint8)
        mask = np.ones(grid.shape[:2], bool)
        for k in range(9):
            top, left = (k // 8) * 6 + 2, (k % 8) * 6 + 2
            np.testing.assert_array_equal(grid[top:top + 4, left:left + 4], expected_pixels[k], err_msg=f"image {k}")
            mask[top:top + 4, left:left + 4] = False
        assert (grid[mask] == 0).all()  # padding and the empty cells are black
    assert viz.last_image_path == tmp_path / "run" / "images" / "train-ba3.png"


def test_grayscale_channels_last_normalized_images_are_rescaled_per_image(tmp_path):
    """The digits (N, 8, 8, 1), normalized (negative values): each image min-max scaled to 0..255."""
    train, _ = loaders(batch_size=32, n_train=64)
    first = {}

    class Record(Callback):
        def batch_end(self, state, logger):
            first.setdefault("x", np.asarray(state.batch["input"]))

    Trainer(model=mlp_task(), train_dataloader=train, max_duration="1ba", run_dir=tmp_path, progress_bar=False,
            callbacks=[ImageVisualizer(interval=1, num_images=2, channels_last=True), Record()]).fit()
    grid = _png(tmp_path / "images" / "train-ba1.png")
    assert grid.shape == (12, 22)  # mode L: one row of two 8x8 images
    for k in range(2):
        image = first["x"][k, ..., 0].astype(np.float64)
        expected = np.rint((image - image.min()) / (image.max() - image.min()) * 255).astype(np.uint8)
        np.testing.assert_array_equal(grid[2:10, 2 + 10 * k:10 + 10 * k], expected)


def test_to_uint8_follows_wandb_image_rule():
    np.testing.assert_array_equal(to_uint8(np.array([[0.0, 0.5, 1.0]])), [[0, 128, 255]])
    np.testing.assert_array_equal(to_uint8(np.array([[-1.0, 0.0, 1.0]])), [[0, 128, 255]])
    np.testing.assert_array_equal(to_uint8(np.array([[0.0, 100.0, 300.0]])), [[0, 100, 255]])
    raw = np.array([[7, 200]], np.uint8)
    assert to_uint8(raw) is raw


def test_eval_grid_and_log_images_when_the_state_and_logger_provide_them(tmp_path):
    """Eval images come from ``state.batch`` at EVAL_BATCH_END when it holds the eval batch (Composer's State),
    only the first batch of each evaluation; ``logger.log_images`` gets uint8 HWC images when it exists."""
    calls = []

    class ImageLogger:
        def log_images(self, **kwargs):
            calls.append(kwargs)

    train_batch = {"input": np.zeros((2, 1, 3, 3), np.float32), "target": np.zeros(2, np.int32)}
    eval_batch = {"input": np.full((2, 1, 3, 3), 1.0, np.float32), "target": np.zeros(2, np.int32)}
    state = RunState(run_name="r", run_dir=tmp_path, plan=RunPlan(), timestamp=Timestamp(batch=5), batch=train_batch)
    viz, logger = ImageVisualizer(), ImageLogger()
    viz.run_event(Event.EVAL_START, state, logger)
    viz.run_event(Event.EVAL_BATCH_END, state, logger)  # still the train batch: nothing to show
    assert calls == [] and not (tmp_path / "images").exists()
    viz.run_event(Event.EVAL_START, state, logger)
    state.batch = eval_batch
    viz.run_event(Event.EVAL_BATCH_END, state, logger)
    state.batch = {"input": np.full((2, 1, 3, 3), 0.5, np.float32), "target": np.zeros(2, np.int32)}
    viz.run_event(Event.EVAL_BATCH_END, state, logger)  # a later eval batch: not logged
    assert len(calls) == 1 and calls[0]["name"] == "Images/Eval" and calls[0]["step"] == 5
    assert calls[0]["channels_last"] is True
    assert [img.shape for img in calls[0]["images"]] == [(3, 3, 1)] * 2
    assert all((img == 255).all() for img in calls[0]["images"])
    grid = _png(tmp_path / "images" / "eval-ba5.png")
    assert (grid[2:5, 2:5] == 255).all() and (grid[2:5, 7:10] == 255).all()


def test_image_visualizer_refusals():
    with pytest.raises(NotImplementedError, match="state.outputs"):
        ImageVisualizer(mode="segmentation")
    with pytest.raises(ValueError, match="mode must be"):
        ImageVisualizer(mode="masks")
    with pytest.raises(ValueError, match="interval"):
        ImageVisualizer(interval="10tok")
    viz = ImageVisualizer()
    state = RunState(run_name="r", run_dir=None, plan=RunPlan(), timestamp=Timestamp(batch=1),
                     batch={"input": np.zeros((2, 8, 8, 1), np.float32), "target": np.zeros(2, np.int32)})
    with pytest.raises(ValueError, match="8 channels with channels_last=False.*channels_last=True"):
        viz.batch_end(state, None)


def test_torchscript_traces_a_module_that_cannot_be_scripted(tmp_path):
    import torch

    class Unscriptable(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.linear = torch.nn.Linear(64, 10)
            self.flatten = lambda t: t.reshape(t.shape[0], -1)  # TorchScript cannot compile a lambda attribute

        def forward(self, x):
            return self.linear(self.flatten(x))

    torch.manual_seed(0)
    module, path = Unscriptable(), tmp_path / "traced.pt"
    with pytest.raises(Exception):
        torch.jit.script(module)
    train, _ = loaders(batch_size=32, n_train=64)
    trainer = Trainer(model=module, train_dataloader=train, max_duration="2ba", seed=0, progress_bar=False,
                      optimizers=DecoupledSGDW(lr=0.5), callbacks=[ExportForInferenceCallback("torchscript", path)])
    trainer.fit()
    traced = torch.jit.load(str(path))
    np.testing.assert_array_equal(traced.state_dict()["linear.weight"].numpy(),
                                  np.asarray(trainer.state.train_state.params["linear.weight"]))
    x = torch.from_numpy(digits("test", n=32)["input"])  # traced with the batch's shape
    with torch.no_grad():
        np.testing.assert_allclose(traced(x).numpy(), module(x).numpy(), rtol=1e-6)
