"""One base class for every error jaxcomposer raises about its input, so callers can catch them all.

Each subclass also derives from the builtin a Python user would expect (``ValueError`` for bad values), so
existing ``except ValueError`` code keeps working. Every exception class of the package lives here, and its
warning classes too.
"""
import signal


class JaxComposerError(Exception):
    """Base of jaxcomposer's errors: bad config or arguments, bad data, unusable checkpoints, non-finite losses."""


class DataError(JaxComposerError, ValueError):
    """A dataset or loader that cannot feed training (empty, batch larger than the data, mismatched arrays)."""


class DatasetNotFoundError(JaxComposerError, FileNotFoundError):
    """A dataset's files are not on this machine; the message says where we looked and how to install them."""


class ConfigurationError(JaxComposerError, ValueError):
    """A bad Trainer argument or config value, reported before anything is compiled or written."""


class ConfigError(JaxComposerError, ValueError):
    """Every problem found in a config, one per line: ``dotted.path: message``."""

    def __init__(self, problems: list[tuple[str, str]]):
        self.problems = problems
        lines = "\n".join(f"  {loc or '<root>'}: {msg}" for loc, msg in problems)
        super().__init__(f"{len(problems)} problem(s) in the config:\n{lines}")


class MissingKeyError(JaxComposerError, ValueError):
    """A functional form that must draw random numbers was called without ``key=`` (a JAX PRNG key).

    Composer's functional forms draw from numpy's and torch's global generators; ours never read global state, so
    the randomness has to come in as an argument. The message names the function and what it draws.
    """


class TimeInputError(JaxComposerError, RuntimeError):
    """What ``Time.from_input`` raises where Composer raises ``RuntimeError`` (a bare number without
    ``default_int_unit``, a value of an unsupported type). The concrete classes are also the ``ValueError`` /
    ``TypeError`` a Python user would expect, so callers catching those keep working."""


class MissingTimeUnitError(TimeInputError, ValueError):
    """A bare number given as a time without a unit to read it in."""


class TimeInputTypeError(TimeInputError, TypeError):
    """A value of a type that cannot be a time (``None``, a list, ...)."""


class MethodConflictError(JaxComposerError, ValueError):
    """Methods that cannot share a recipe (listed twice, declared conflicts, one exclusive capability claimed twice)."""


class CheckpointError(JaxComposerError, ValueError):
    """A checkpoint that cannot be saved or restored as asked (missing, shapes differ, folder already used)."""


class CorruptCheckpointError(CheckpointError):
    """A saved file no longer matches the checksum written when its step was committed (bit rot, truncation)."""


class ObjectStoreError(CheckpointError, OSError):
    """An object store (``s3://``, ``gs://``) refused or failed a request after its retries: the message names the
    URI and the cause (a missing bucket, bad credentials, a server that stays down), never a credential."""


class NonFiniteLossError(JaxComposerError, RuntimeError):
    """The training loss or gradient became NaN or infinite."""


class UnsupportedOpError(JaxComposerError, NotImplementedError):
    """A torch op or module the bridge cannot lower: raised at conversion time naming each op, module path, line."""

    def __init__(self, ops: dict[str, list[str]]):
        self.ops = ops  # each missing op's name -> the places (module path, class, source line) that use it
        lines = ["torch_bridge: no JAX lowering for these ops:"]
        for name, where in ops.items():
            lines.append(f"  {name}")
            lines.extend(f"      used by {w}" for w in where)
        lines.append("What you can do: replace the modules that use them with ones built from supported ops "
                     "(torch_bridge.ops.registry.supported(op) says whether one is), or report the missing ops to "
                     "the jaxcomposer maintainers with this message.")
        super().__init__("\n".join(lines))


class Preempted(KeyboardInterrupt):
    """Training stopped on SIGTERM or SIGINT after finishing a step and saving it. A KeyboardInterrupt (not an
    error, so not a JaxComposerError), so a notebook cell stops cleanly; ``jaxcomposer fit`` turns it into exit
    code ``128 + signal`` (143 for SIGTERM, 130 for SIGINT), and ``autoresume=True`` continues from the saved
    step."""

    def __init__(self, signum: int, batch: int, folder):
        self.signum, self.batch, self.folder = signum, batch, folder
        where = f"saved batch {batch} to {folder}" if folder else "nothing saved (no save_folder)"
        super().__init__(f"{signal.Signals(signum).name} received: stopped after batch {batch}; {where}")

    @property
    def exit_code(self) -> int:
        return 128 + self.signum


class NoEffectWarning(UserWarning):
    """A method found nothing to change in the model (Composer's ``NoEffectWarning``)."""
