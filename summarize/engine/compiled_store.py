"""Compiled step graphs kept on disk, so that a later process loads them rather than tracing them.

torch.compile traces every graph again in each process (dynamo's Python tracing: seconds a job),
even where inductor's kernels come from its cache. `torch.compile(...).aot_compile()` (torch
2.13, experimental) captures a graph once, guards included, and saves it whole; a later process
loads it in milliseconds. `StoredGraph` stands where `torch.compile(call)` stood (`compiled.Graphs`
and the head) and keeps captured graphs per variant of a call: the layer's class and method, its
weights' forms, its rows (and x's whole shape for a static graph), its flags and the batch
generating. A file's name hashes that with what a graph is built from beyond its inputs: torch's
version, the engine's source, the machine policy and the CPU. A graph whose guards refuse a call
leaves it to the variant's next graph (a dynamic graph holds for a range of lengths); where a graph
cannot be captured, or past `MAX_CAPTURED` of them, torch.compile traces as before: never a wrong
graph, at worst a trace. The folder keeps only the files of this torch and this source.
"""

from __future__ import annotations

import hashlib
import io
import weakref
from collections.abc import Callable
from functools import cache
from pathlib import Path
from types import FunctionType

import torch
from torch import nn

from summarize.engine.ops import linear, machine
from summarize.files import replacing, user_cache_folder

FOLDER = "compiled-steps"  # under the user's cache folder
FORMAT = 1  # of the files' names and contents; a new one leaves older files unread (and removed)
GUARD_MISS = "GuardManager check failed"  # how a captured graph refuses a call it was not built for
MAX_CAPTURED = 4  # graphs captured per variant; past them, torch.compile traces (and keeps its own)


def call(fn, *args):
    return fn(*args)


def own_call() -> Callable:
    """`call` with code of its own: dynamo keeps its graphs, and its options, per code object."""
    return FunctionType(call.__code__.replace(), call.__globals__, call.__name__)


@cache
def generation() -> str:
    """What every stored graph of this process was built from: torch, the engine's source, the CPU."""
    digest = hashlib.sha256(f"{FORMAT} {torch.__version__} {_cpu()}".encode())
    engine = Path(__file__).parent
    for source in sorted(engine.rglob("*.py")):
        digest.update(str(source.relative_to(engine)).encode() + b"\0" + source.read_bytes())
    return digest.hexdigest()[:16]


def _cpu() -> str:
    """The CPU's model name and flags (inductor's kernels are built for its vector instructions)."""
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as f:
            lines = [line for line in f if line.lower().startswith(("model name", "flags", "features"))]
        return "".join(sorted(set(lines)))
    except OSError:
        return torch.backends.cpu.get_cpu_capability()


def serializable_guards(entries) -> list[bool]:
    """aot_compile's own rule (no guard on globals or of a kind it cannot save), and none on a
    oneDNN-prepacked weight, which has no metadata to save (its form is in the variant's key)."""
    from torch._dynamo.guards import CheckFunctionManager

    unsupported = CheckFunctionManager.UNSUPPORTED_SERIALIZATION_GUARD_TYPES
    return [not (g.is_global or g.guard_type in unsupported or (isinstance(g.value, torch.Tensor) and g.value.is_mkldnn))
            for g in entries]


class StepStore:
    """A folder of captured graphs (`default_store`)."""

    def __init__(self, folder: Path) -> None:
        self.folder = folder
        self.pruned = False

    def path(self, role: str, key: tuple) -> Path:
        digest = hashlib.sha256(repr((role, key, machine.POLICY)).encode()).hexdigest()[:24]
        return self.folder / f"{generation()}-{digest}.pt"

    def graph(self, role: str, key: tuple, fn: Callable, args: tuple, dynamic: bool) -> Callable | None:
        """The captured graph of this variant: read from the folder, else captured now and saved;
        None where it cannot be captured."""
        path = self.path(role, key)
        loaded = self.load(path)
        if loaded is not None:
            return loaded
        try:
            options = {"guard_filter_fn": serializable_guards}
            captured = torch.compile(own_call(), fullgraph=True, dynamic=dynamic, options=options).aot_compile(((fn, *args), {}))
        except Exception:  # noqa: BLE001 - a graph break, an unsupported construct: traced as before
            return None
        self.save(path, captured)
        return captured

    def load(self, path: Path) -> Callable | None:
        try:
            data = path.read_bytes()
        except OSError:
            return None
        try:
            return torch.compiler.load_compiled_function(io.BytesIO(data))
        except Exception:  # noqa: BLE001 - a truncated or foreign file: captured again
            path.unlink(missing_ok=True)
            return None

    def save(self, path: Path, captured) -> None:
        try:
            data = type(captured).serialize(captured).serialized_data
            with replacing(path) as tmp:
                tmp.write_bytes(data)
            self.prune()
        except Exception:  # noqa: BLE001 - unsaved, the graph still serves this process
            pass

    def prune(self) -> None:
        """Remove the files of other generations (another torch, another source), once a process."""
        if self.pruned:
            return
        self.pruned = True
        for old in self.folder.glob("*.pt"):
            if not old.name.startswith(generation() + "-"):
                old.unlink(missing_ok=True)


def default_store() -> StepStore:
    return StepStore(user_cache_folder() / FOLDER)


class StoredGraph:
    """`graph(fn, *args)` as `torch.compile(call)(fn, *args)` computes it, each variant's graph
    captured once and kept in `store`."""

    def __init__(self, store: StepStore, role: str, dynamic: bool) -> None:
        self.store, self.role, self.dynamic = store, role, dynamic
        self.graphs: dict[tuple, list[Callable]] = {}  # a variant's graphs, tried in turn
        self._traced: Callable | None = None
        self._forms: weakref.WeakKeyDictionary[nn.Module, str] = weakref.WeakKeyDictionary()

    def __call__(self, fn: Callable, *args):
        key = self.variant(fn, args)
        graphs = self.graphs.setdefault(key, [])
        for graph in graphs:
            try:
                return graph(fn, *args)
            except RuntimeError as e:  # its guards refused the call before it ran anything
                if graph is self._traced or not str(e).startswith(GUARD_MISS):
                    raise
        # a first call, or one no graph yet takes (a dynamic graph holds for a range of lengths):
        # the variant's next graph, read (it may be another call's) or captured for this one
        while self._traced not in graphs and len(graphs) < MAX_CAPTURED:
            graph = self.store.graph(self.role, (*key, len(graphs)), fn, args, self.dynamic)
            if graph is None:
                break
            graphs.append(graph)
            try:
                return graph(fn, *args)
            except RuntimeError as e:
                if not str(e).startswith(GUARD_MISS):
                    raise
        if self._traced not in graphs:
            graphs.append(self.traced())
        return self._traced(fn, *args)

    def traced(self) -> Callable:
        """This role's graphs as torch.compile traces them in every process."""
        if self._traced is None:
            self._traced = torch.compile(own_call(), dynamic=self.dynamic)
        return self._traced

    def variant(self, fn: Callable, args: tuple) -> tuple:
        # a layer; the layer of a bound method; or a function's first argument (the model for the head)
        module = fn if isinstance(fn, nn.Module) else getattr(fn, "__self__", args[0])
        method = getattr(fn, "__name__", "forward")
        x = next(a for a in args if isinstance(a, torch.Tensor))
        shape = (x.shape[0], x.is_contiguous()) if self.dynamic else (*x.shape, x.is_contiguous())
        flags = tuple(a for a in args if isinstance(a, bool))
        return type(module).__qualname__, method, self.forms(module), shape, str(x.dtype), flags, linear.generating_batch()

    def forms(self, module: nn.Module) -> str:
        """A digest of its tensors' names, dtypes, shapes and layouts: what tells layers of one class
        apart. Made once per module: the key is built at every call."""
        forms = self._forms.get(module)
        if forms is None:
            tensors = [*module.named_parameters(), *module.named_buffers()]
            listed = repr([(name, str(t.dtype), tuple(t.shape), t.is_mkldnn) for name, t in tensors])
            forms = self._forms[module] = hashlib.sha256(listed.encode()).hexdigest()[:16]
        return forms
