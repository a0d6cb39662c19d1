"""Where summarize keeps what outlasts a run (the read cache, compiled kernels) for this user."""

from __future__ import annotations

import os
from pathlib import Path


def user_cache_folder() -> Path:
    """`$XDG_CACHE_HOME/summarize`, else `~/.cache/summarize`."""
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "summarize"
