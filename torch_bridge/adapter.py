"""torch_bridge's :class:`jaxcomposer.core.adapters.Adapter`: how the Trainer meets torch objects.

Declared in ``pyproject.toml`` under the entry point group ``jaxcomposer.adapters`` with the name ``torch``, so
jaxcomposer loads it the first time it meets an object whose class comes from torch, and never imports torch
otherwise. It converts ``nn.Module``s (exported from example inputs taken from the first batch), wraps
``DataLoader``s, holds the torch-level surgery of the ``model``-slot methods, keyed by method name, and carries
tensors to and from ``jaxcomposer.functional`` (``torch_bridge.functional``), whose torch arrays are NCHW as in
Composer.
"""
from __future__ import annotations

import numpy as np
import torch

from jaxcomposer.algorithms import blurpool as nnx_blurpool, squeeze_excite as nnx_squeeze_excite
from jaxcomposer.core.adapters import Adapter
from jaxcomposer.errors import ConfigurationError

from .composer_model import ComposerModel, HuggingFaceModel, TorchComposerTask, is_composer_model
from . import activations, algorithm_capture, callbacks, classifier, functional, kernels, methods, models
from .data import from_dataloader
from .kernels import autotune
from .module import from_torch
from .trainer_optim import SurgeryFollower, TrainerOptimizer, TrainerScheduler
from .surgery import BlurConv2d, BlurMaxPool2d, apply_blurpool_torch, blurmax_pool2d, count_module_instances


def _to_pure_model(module: torch.nn.Module, example_inputs):
    inputs = example_inputs if isinstance(example_inputs, tuple) else (example_inputs,)
    inputs = tuple(torch.from_numpy(np.array(x)) for x in inputs)
    return from_torch(module, inputs, dynamic_batch=True).as_pure_model()


def _to_loader(loader, name: str):
    if isinstance(loader, torch.utils.data.DataLoader):
        return from_dataloader(loader)
    if isinstance(loader, torch.utils.data.Dataset):
        raise ConfigurationError(f"{name}: got a torch Dataset, which has no batch size; pass "
                                 f"torch_bridge.data.from_dataset(dataset, batch_size=...) or a torch DataLoader")
    return None


def _blurpool(module: torch.nn.Module, *, replace_convs: bool, replace_maxpools: bool, blur_first: bool,
              min_channels: int):
    """BlurPool on a torch module, in place as Composer's: ``(the module, blur max-pools in it, blur convs in it)``."""
    new, _ = apply_blurpool_torch(module, replace_convs=replace_convs, replace_maxpools=replace_maxpools,
                                  blur_first=blur_first, min_channels=min_channels)
    return new, count_module_instances(new, BlurMaxPool2d), count_module_instances(new, BlurConv2d)


def _to_task(module):
    """Composer's ``ComposerModel`` protocol (a ``loss`` method next to ``forward(batch)``) becomes its own task;
    a ``ComposerClassifier`` with Composer's default loss and metrics trains them inside the compiled steps."""
    if isinstance(module, classifier.ComposerClassifier):
        task = classifier.as_task(module)
        if task is not None:
            return task
    return TorchComposerTask(module) if is_composer_model(module) else None


def _seed(seed: int) -> None:
    """What Composer's ``seed_all`` seeds of torch: the CPU generator and every CUDA device's."""
    torch.manual_seed(seed)


def _draw_seed() -> int:
    """One draw from torch's global generator: a functional form's key, so ``torch.manual_seed`` governs it."""
    return int(torch.randint(0, 2**31 - 1, ()).item())


ADAPTER = Adapter(is_model=lambda obj: isinstance(obj, torch.nn.Module), to_pure_model=_to_pure_model,
                  to_loader=_to_loader, surgery={"BlurPool": _blurpool, **methods.SURGERY}, to_task=_to_task,
                  is_array=lambda obj: isinstance(obj, torch.Tensor), to_array=functional.to_array,
                  from_array=functional.from_array, data_format="NCHW", no_grad=torch.no_grad,
                  functional={"compute_ema": functional.compute_ema, "freeze_layers": functional.freeze_layers,
                              "apply_gradient_clipping": functional.apply_gradient_clipping,
                              "export_for_inference": callbacks.export_for_inference,
                              "generate": callbacks.generate, "surgery_follower": SurgeryFollower,
                              "module_activations": activations.module_activations,
                              "capture_algorithm": algorithm_capture.capture,
                              "rng_state": torch.get_rng_state, "set_rng_state": torch.set_rng_state},
                  kernels={"conv_general_dilated": kernels.conv_general_dilated,
                           "conv_general_dilated_auto": autotune.conv_general_dilated,
                           "conv_autotune": autotune.default_tuner},
                  classes={"ComposerModel": ComposerModel, "HuggingFaceModel": HuggingFaceModel,
                           "ComposerClassifier": classifier.ComposerClassifier,
                           # Composer's torch layers, importable from the method's jaxcomposer module
                           "BlurConv2d": BlurConv2d, "blurmax_pool2d": blurmax_pool2d,
                           "SqueezeExciteConv2d": methods.squeeze_excite.SqueezeExciteConv2d,
                           # Composer's model zoo for torch users (jaxcomposer.models.<name>)
                           "mnist_model": models.mnist_model, "composer_resnet_cifar": models.composer_resnet_cifar},
                  seed=_seed, draw_seed=_draw_seed,
                  to_optimizer=lambda opt, model: TrainerOptimizer(opt, model)
                  if isinstance(opt, torch.optim.Optimizer) else None,
                  to_scheduler=lambda sched, opt, where: TrainerScheduler(sched, opt, where)
                  if isinstance(sched, torch.optim.lr_scheduler.LRScheduler) else None)

# Where Composer's torch layer and jaxcomposer's NNX layer share a name in the method's module
# (``from jaxcomposer.algorithms.blurpool import BlurMaxPool2d``), the torch layer is a virtual subclass of the NNX
# one (both are ABCs), so a Composer script's ``isinstance(m, BlurMaxPool2d)`` holds for the torch layers surgery made
for _native, _torch in ((nnx_blurpool.BlurMaxPool2d, BlurMaxPool2d),
                        (nnx_squeeze_excite.SqueezeExcite2d, methods.squeeze_excite.SqueezeExcite2d)):
    _native.register(_torch)
