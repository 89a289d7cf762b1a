"""Composer's ``composer.utils`` names that scripts import: ``reproducibility``, and the object stores
(``S3ObjectStore``, ``GCSObjectStore``)."""
from jaxcomposer.utils import reproducibility
from jaxcomposer.utils.object_store import GCSObjectStore, ObjectStore, S3ObjectStore

__all__ = ["reproducibility", "ObjectStore", "S3ObjectStore", "GCSObjectStore"]
