"""A plain install (`pip install torch==2.13.0 .`, no extras) has no numpy: torch does not require
it and neither do we. Loading a model must work there, and nothing in summarize/ may import a
package that pyproject.toml does not declare. (.ci/run also runs the CLI from such an install.)
"""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from tiny_models import dense_reference, save_checkpoint

REPO = Path(__file__).resolve().parents[1]
PACKAGE = REPO / "summarize"
# Distribution name -> the module it installs, where they differ
IMPORT_NAMES = {"fla-core": "fla"}

WITHOUT_NUMPY = """
import sys
sys.modules["numpy"] = None  # `import numpy` fails, as on a plain install; torch then has no numpy either
import torch
from summarize.engine import load_model

folder, ids_path, out = sys.argv[1:]
model = load_model(folder, device="cpu", dtype=torch.float32)
ids = torch.load(ids_path)
torch.save(model.forward(ids, model.new_state(ids.shape[0])), out)
"""


def test_weights_load_without_numpy(tmp_path):
    reference = dense_reference()
    folder = save_checkpoint(reference, tmp_path / "model")
    ids = torch.randint(0, 384, (1, 9), generator=torch.Generator().manual_seed(0))
    torch.save(ids, tmp_path / "ids.pt")
    proc = subprocess.run([sys.executable, "-c", WITHOUT_NUMPY, str(folder), str(tmp_path / "ids.pt"), str(tmp_path / "out.pt")],
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    with torch.no_grad():
        want = reference(input_ids=ids).logits
    got = torch.load(tmp_path / "out.pt")
    assert (got - want).abs().max().item() <= 1e-4 * want.abs().max().item()


STATE_WITHOUT_NUMPY = """
import sys
sys.modules["numpy"] = None
import torch
from summarize.engine import load_model

folder, path = sys.argv[1:]
model = load_model(folder, device="cpu", dtype=torch.float32)
state = model.new_state(1)
model.prefill(torch.arange(1, 12)[None], state)
state.save(path)
loaded = model.new_state(1)
loaded.load(path)
same = all(torch.equal(a, b) for x, y in zip(state.layers, loaded.layers) for a, b in zip(x.tensors().values(), y.tensors().values()))
print(same and loaded.position == state.position == 11)
"""


def test_a_state_saves_and_loads_without_numpy(tmp_path):
    folder = save_checkpoint(dense_reference(), tmp_path / "model")
    proc = subprocess.run([sys.executable, "-c", STATE_WITHOUT_NUMPY, str(folder), str(tmp_path / "state.safetensors")],
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert proc.stdout.split()[-1] == "True"


def _dependencies() -> tuple[set[str], set[str]]:
    """Module names of pyproject's dependencies, and of its optional extras other than `test`."""
    tomllib = pytest.importorskip("tomllib")
    project = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]

    def module(requirement: str) -> str:
        name = requirement.split(";")[0]
        for mark in "<>=!~[ ":
            name = name.split(mark)[0]
        return IMPORT_NAMES.get(name, name.replace("-", "_"))

    extras = {module(r) for extra, reqs in project["optional-dependencies"].items() if extra != "test" for r in reqs}
    return {module(r) for r in project["dependencies"]}, extras


def test_summarize_imports_only_declared_packages():
    """Module-level imports: the standard library, summarize, or a dependency; an optional extra's
    package (fla) only inside a function, where its absence is handled."""
    required, optional = _dependencies()
    known = set(sys.stdlib_module_names) | {"summarize"} | required
    wrong = []
    for path in sorted(PACKAGE.rglob("*.py")):
        tree = ast.parse(path.read_text(), str(path))
        top = {id(node) for node in tree.body}
        for node in ast.walk(tree):
            if isinstance(node, ast.Import):
                names = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom) and node.level == 0:
                names = [node.module]
            else:
                continue
            allowed = known if id(node) in top else known | optional
            wrong += [f"{path.relative_to(REPO)}:{node.lineno} imports {n}" for n in names if n.split(".")[0] not in allowed]
    assert not wrong, wrong


def test_no_tensor_goes_through_numpy():
    """`.numpy()` / `torch.from_numpy` need numpy at run time, which a plain install lacks."""
    calls = []
    for path in sorted(PACKAGE.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.Attribute) and node.attr in ("numpy", "from_numpy"):
                calls.append(f"{path.relative_to(REPO)}:{node.lineno}")
    assert not calls, calls
