"""Composer's ``composer.models.huggingface`` path: ``from jaxcomposer.models.huggingface import HuggingFaceModel``
gives the torch bridge's ``HuggingFaceModel`` (a torch module), loaded through the torch adapter when asked for."""


def __getattr__(name: str):
    if name == "HuggingFaceModel":
        from jaxcomposer.core import adapters
        return adapters.framework_class("torch", name, wanted_by=f"{__name__}.{name}")
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
