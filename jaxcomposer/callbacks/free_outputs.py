"""``FreeOutputs``: Composer's callback that frees ``state.outputs`` after the loss; nothing to free here."""
from __future__ import annotations

from jaxcomposer.core.events import Callback

__all__ = ["FreeOutputs"]


class FreeOutputs(Callback):
    """Composer's ``FreeOutputs()``: in Composer it replaces ``state.outputs`` with an empty tensor after the loss is
    computed, so the outputs' memory is released before the backward pass.

    Here the model's training outputs live only inside the compiled train step, where XLA frees each buffer after its
    last use anyway, and they are never kept on ``state`` (during training ``state.outputs`` raises
    ``AttributeError`` saying so). So this callback does nothing; it exists so that a Composer script passing
    ``callbacks=[FreeOutputs()]`` runs unchanged.
    """
