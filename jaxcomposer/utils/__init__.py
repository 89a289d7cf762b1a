"""Composer's ``composer.utils`` names that scripts import: ``reproducibility``."""
from jaxcomposer.utils import reproducibility

__all__ = ["reproducibility"]
