"""Every method's pure function, for use in anyone's own JAX loop (Composer's ``composer.functional``).

Random ones take an explicit ``key``; images are NHWC unless ``data_format='NCHW'`` is passed. The set is each
method file's ``ENTRY.functional`` (see ``jaxcomposer.algorithms``).
"""
from jaxcomposer.algorithms import FUNCTIONAL

globals().update(FUNCTIONAL)
__all__ = sorted(FUNCTIONAL)
