"""Composer's ``composer.trainer``: ``from jaxcomposer.trainer import Trainer``. Loaded on first use (PEP 562), so
the step and checkpoint submodules import without the Trainer."""


def __getattr__(name: str):
    if name == "Trainer":
        from jaxcomposer.trainer.trainer import Trainer
        return Trainer
    raise AttributeError(f"module 'jaxcomposer.trainer' has no attribute {name!r}")


__all__ = ["Trainer"]
