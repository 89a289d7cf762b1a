"""Where an image's axes are, for the methods that take ``data_format`` (CutOut, CutMix, ColOut,
ProgressiveResizing, SelectiveBackprop, RandAugment, AugMix): by default the model's layout. Not a method: it has no
``ENTRY``."""


def spatial_axes(ndim: int, data_format: str, where: str) -> tuple[int, int]:
    """(height axis, width axis) of an ``'NHWC'`` or ``'NCHW'`` array with ``ndim`` dims: a batch, or one image
    without its batch axis. Anything else raises naming ``where`` (the function or method checking it)."""
    if data_format == "NHWC":
        return ndim - 3, ndim - 2
    if data_format == "NCHW":
        return ndim - 2, ndim - 1
    raise ValueError(f"{where}: data_format must be 'NHWC' or 'NCHW', got {data_format!r}.")


def model_layout(data_format: str | None, ctx) -> str:
    """A method's image layout in the step: its ``data_format`` when given, else the model's (``ctx.model``'s
    ``param_layout``): NCHW for a bridged torch model, whose loaders yield torch's layout, NHWC for an NNX one."""
    if data_format is not None:
        return data_format
    return "NCHW" if ctx.model.param_layout == "torch" else "NHWC"
