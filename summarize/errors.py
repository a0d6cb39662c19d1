"""The one domain exception: the CLI turns it into a one-line message and an exit code."""


class SummarizeError(Exception):
    """A problem the user can act on (bad input, missing model, ...). Its message is one line."""


class ModelNotAvailable(SummarizeError):
    """The model could not be found locally nor downloaded (the CLI then writes an extractive summary)."""
