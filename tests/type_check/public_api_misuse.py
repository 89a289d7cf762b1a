"""Misspelled public names and arguments: mypy must see each (tests/test_public_api.py)."""
import jaxcomposer
from jaxcomposer import functional as cf
from jaxcomposer.algorithms import MixUp

jaxcomposer.Trainer(modle=None)  # the keyword is model
MixUp(alpha=0.2).nonexistent_attribute
cf.mixup_batches
jaxcomposer.algorithms.MixUpp
