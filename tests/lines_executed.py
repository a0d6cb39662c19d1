"""How much work a call does, counted in lines of Python that ran in the modules named: a measure
that does not depend on the machine's speed or on what else runs on it."""

from __future__ import annotations

import sys
from collections.abc import Callable
from types import ModuleType
from typing import TypeVar

T = TypeVar("T")


def lines_executed(call: Callable[[], T], *modules: ModuleType) -> tuple[T, int]:
    """call()'s result, and how many lines of `modules` ran to make it."""
    files = {module.__file__ for module in modules}
    lines = 0

    def local(frame, event, arg):
        nonlocal lines
        lines += event == "line"
        return local

    def calls(frame, event, arg):
        return local if frame.f_code.co_filename in files else None

    previous = sys.gettrace()
    sys.settrace(calls)
    try:
        result = call()
    finally:
        sys.settrace(previous)
    return result, lines
