"""Every method's function, for use in anyone's own loop (Composer's ``composer.functional``).

Each takes Composer's positional arguments, so a Composer user's torch loop calls it unchanged; random ones take a
keyword-only ``key`` (a JAX PRNG key) and say so when it is missing. JAX, numpy or torch arrays come back as the
type they came in (PIL images too, where Composer takes them); images are NHWC for JAX and numpy arrays and NCHW
for torch tensors unless ``data_format`` says otherwise. ``compute_ema`` and ``freeze_layers`` act in place on
torch modules, as Composer's do. See :mod:`jaxcomposer.algorithms.functional_io`. The set is each method file's
``ENTRY.functional`` (see ``jaxcomposer.algorithms``).
"""
from jaxcomposer.algorithms import FUNCTIONAL

globals().update(FUNCTIONAL)
__all__ = sorted(FUNCTIONAL)
