"""How a name is shown on a terminal: control characters and undecodable bytes escaped, so that no
name can move the cursor or retitle the window.
"""

from __future__ import annotations


def printable(name: str) -> str:
    """`name` safe to print on a terminal: control characters (C0, DEL, C1) and the bytes of an
    undecodable file name shown as `\\xNN`, so that no name can move the cursor or retitle the window."""
    return "".join(_escaped(char) for char in name)


def _escaped(char: str) -> str:
    code = ord(char)
    if code < 0x20 or 0x7F <= code <= 0x9F:
        return f"\\x{code:02x}"
    if 0xDC80 <= code <= 0xDCFF:  # os.fsdecode's stand-in for an undecodable byte (surrogateescape)
        return f"\\x{code - 0xDC00:02x}"
    if 0xD800 <= code <= 0xDFFF:  # any other lone surrogate cannot be encoded for the terminal
        return f"\\u{code:04x}"
    return char
