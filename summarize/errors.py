"""The one domain exception: the CLI turns it into a one-line message and an exit code."""


class SummarizeError(Exception):
    """A problem the user can act on (bad input, missing model, ...). Its message is one line."""


class ModelNotAvailable(SummarizeError):
    """The model could not be found locally nor downloaded (the CLI then writes an extractive summary)."""


def first_line(exc: BaseException) -> str:
    """The first non-blank line of `exc`'s message, or its type's name when it has none: what a
    one-line error says of a library's exception (their messages run to many lines)."""
    lines = [line.strip() for line in str(exc).splitlines() if line.strip()]
    return lines[0] if lines else type(exc).__name__
