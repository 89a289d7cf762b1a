"""Composer's module name, ``composer.optim.scheduler``: the schedulers of :mod:`jaxcomposer.optim.schedulers`."""
from jaxcomposer.optim.schedulers import *  # noqa: F401,F403
from jaxcomposer.optim.schedulers import __all__  # noqa: F401
