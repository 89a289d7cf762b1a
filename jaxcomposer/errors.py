"""One base class for every error jaxcomposer raises about its input, so callers can catch them all.

Each subclass also derives from the builtin a Python user would expect (``ValueError`` for bad values), so
existing ``except ValueError`` code keeps working.
"""


class JaxComposerError(Exception):
    """Base of jaxcomposer's errors: bad config or arguments, bad data, unusable checkpoints, non-finite losses."""


class DataError(JaxComposerError, ValueError):
    """A dataset or loader that cannot feed training (empty, batch larger than the data, mismatched arrays)."""
