"""Native Flax NNX models and the Composer-style task wrappers around them."""
from __future__ import annotations

from typing import Any

import jax
from flax import nnx

from jaxcomposer.core.model import PureModel
from jaxcomposer.models.bert import BERT, BERT_SIZES, bert
from jaxcomposer.models.convnet import ConvNet
from jaxcomposer.models.gpt import GPT, GPT2_SIZES, gpt2
from jaxcomposer.models.mlp import MLP
from jaxcomposer.models.resnet import ResNetCIFAR, resnet_cifar
from jaxcomposer.models.resnet_imagenet import (ResNetImageNet, resnet, resnet18, resnet34, resnet50, resnet101,
                                                resnet152)
from jaxcomposer.models.tasks import ComposerCausalLM, ComposerClassifier, ComposerMaskedLM
from jaxcomposer.models.vit import VIT_SIZES, ViT, vit


# A config's ``model.name`` -> the model's builder; its keywords (and, for a builder that passes ``**kwargs`` on, those
# of the class it returns) are the config keys.
BUILDERS: dict[str, Any] = {"mlp": MLP, "convnet": ConvNet, "resnet_cifar": ResNetCIFAR, "resnet": resnet,
                            "vit": vit, "gpt": GPT, "gpt2": gpt2, "bert": bert}
# ... and what it trains: "image" classification, "causal_lm" (next token), "masked_lm"
MODEL_KINDS: dict[str, str] = {"mlp": "image", "convnet": "image", "resnet_cifar": "image", "resnet": "image",
                               "vit": "image", "gpt": "causal_lm", "gpt2": "causal_lm", "bert": "masked_lm"}


def num_params(model: Any) -> int:
    """Trainable parameter count of an NNX module (its ``nnx.Param`` leaves), a PureModel, or any params pytree.

    BatchNorm running statistics are state, not params, so they are not counted (as in Composer's reports).
    """
    if isinstance(model, PureModel):
        model = model.params
    tree = nnx.state(model, nnx.Param) if isinstance(model, nnx.Module) else model
    return int(sum(leaf.size for leaf in jax.tree_util.tree_leaves(tree)))


__all__ = ["BUILDERS", "MODEL_KINDS", "ConvNet", "GPT", "GPT2_SIZES", "gpt2", "MLP", "ResNetCIFAR", "resnet_cifar", "ResNetImageNet", "resnet",
           "resnet18", "resnet34", "resnet50", "resnet101", "resnet152", "ComposerClassifier",
           "ComposerCausalLM", "num_params", "ViT", "VIT_SIZES", "vit", "BERT", "BERT_SIZES", "bert",
           "ComposerMaskedLM"]

# Composer's torch-side model classes and model zoo, for Composer scripts: ``from jaxcomposer.models import ComposerModel`` is
# torch_bridge's (a torch nn.Module), loaded through the torch adapter only when asked for
_TORCH_CLASSES = ("ComposerModel", "HuggingFaceModel", "mnist_model", "composer_resnet_cifar")


def __getattr__(name: str):
    if name in _TORCH_CLASSES:
        from jaxcomposer.core import adapters
        return adapters.framework_class("torch", name, wanted_by=f"jaxcomposer.models.{name}")
    raise AttributeError(f"module 'jaxcomposer.models' has no attribute {name!r}")
