"""Where summarize keeps what outlasts a run (the read cache, compiled kernels) for this user."""

from __future__ import annotations

import os
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import NoReturn


def user_cache_folder() -> Path:
    """`$XDG_CACHE_HOME/summarize`, else `~/.cache/summarize`."""
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "summarize"


def write_atomic(path: Path, text: str) -> None:
    """Write `text` to `path` so that readers see the old file or the whole new one, nothing
    else (see `replacing`)."""
    with replacing(path) as tmp:
        with open(tmp, "w", encoding="utf-8") as f:
            f.write(text)
            f.flush()
            os.fsync(f.fileno())
        os.chmod(tmp, _file_mode(path))


@contextmanager
def replacing(path: Path) -> Iterator[Path]:
    """A temporary file beside `path` for the caller to fill; it then replaces `path` in one
    rename. The temporary file is removed on any exception, KeyboardInterrupt included.

    An OSError names `path`: the temporary file is ours, not something the user can act on.
    """
    path.parent.mkdir(parents=True, exist_ok=True)
    try:
        fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f"{path.name}.tmp")
    except OSError as exc:
        _raise_naming(exc, path)
    os.close(fd)
    try:
        yield Path(tmp)
        os.replace(tmp, path)
    except BaseException as exc:
        try:
            os.unlink(tmp)
        except FileNotFoundError:
            pass
        if isinstance(exc, OSError):
            _raise_naming(exc, path)
        raise


def _raise_naming(exc: OSError, path: Path) -> NoReturn:
    """Raise `exc` again, told about `path` (OSError picks the subclass for the errno again)."""
    if exc.errno is None:
        raise exc
    raise OSError(exc.errno, exc.strerror, str(path)) from exc


def _file_mode(path: Path) -> int:
    """The mode a plain `open(path, "w")` would give (mkstemp's files are private, 0600)."""
    try:
        return path.stat().st_mode & 0o777
    except FileNotFoundError:
        umask = os.umask(0)
        os.umask(umask)
        return 0o666 & ~umask
