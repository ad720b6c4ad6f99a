"""The one error type of the bridge."""


class CheckpointError(ValueError):
    """A checkpoint on disk does not match what the decoder needs.

    The message always names the file and the tensor or field at fault, and what
    would have been valid. Subclasses ValueError so callers that validate input
    generically still catch it.
    """
