"""The front door: `--version`, shell completion (also of `summarize plot`), and a README table that
names every environment variable the code reads, and no other."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

from summarize import __version__

ROOT = Path(__file__).resolve().parents[1]
# read on our behalf by a library, not by our code: rich drops colours when it is set
READ_BY_LIBRARIES = {"NO_COLOR"}


def summarize(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "summarize", *args], capture_output=True, text=True, timeout=120,
                          cwd=ROOT, env={**os.environ, "PYTHONPATH": str(ROOT), "NO_COLOR": "1", **(env or {})})


def test_version():
    proc = summarize("--version")
    assert (proc.returncode, proc.stdout) == (0, f"summarize {__version__}\n")


def complete(words: str) -> list[str]:
    """What bash completion offers after `words` (the last one being typed)."""
    proc = summarize(env={"_SUMMARIZE_COMPLETE": "complete_bash", "COMP_WORDS": words,
                          "COMP_CWORD": str(len(words.split()) - 1 + words.endswith(" "))})
    assert proc.returncode == 0, proc.stderr
    return proc.stdout.split()


def test_completion_offers_the_options_of_summarize_and_of_plot():
    assert complete("summarize --stra") == ["--strategy"]
    assert complete("summarize --strategy ") == ["map-reduce", "stream"]
    assert sorted(complete("summarize plot -")) == ["--help", "--output", "-h", "-o"]
    assert "--strategy" in complete("summarize ./plot --s")  # a file named plot is an input


def test_completion_is_shown_and_installed_for_a_named_shell(tmp_path: Path):
    named = {"_TYPER_COMPLETE_TEST_DISABLE_SHELL_DETECTION": "1", "HOME": str(tmp_path)}  # not the shell running pytest
    shown = summarize("--show-completion", "bash", env=named)
    assert shown.returncode == 0 and "_SUMMARIZE_COMPLETE=complete_bash" in shown.stdout
    installed = summarize("--install-completion", "bash", env=named)
    assert installed.returncode == 0, installed.stderr
    assert (tmp_path / ".bash_completions" / "summarize.sh").read_text().strip() == shown.stdout.strip()
    assert ".bash_completions/summarize.sh" in (tmp_path / ".bashrc").read_text()


# --- the README's table of environment variables ----------------------------------------------

ENVVAR_OPTION = re.compile(r'envvar="(\w+)"')
ENVIRON_READ = re.compile(r'(?:os\.environ(?:\.get|\.setdefault)?[\[(]|os\.getenv\()\s*("\w+"|\w+)')


def variables_the_code_reads() -> set[str]:
    """Every variable named by an option's envvar= or by an os.environ / os.getenv call in the
    package, where the call names it by a literal, by a constant of the module, or by the loop
    variable of a `for name in CONSTANT:` over a tuple of them."""
    found = set()
    for path in (ROOT / "summarize").rglob("*.py"):
        source = path.read_text(encoding="utf-8")
        found |= set(ENVVAR_OPTION.findall(source))
        for name in ENVIRON_READ.findall(source):
            found |= set(_strings_named(name, source, path))
    return found


def _strings_named(name: str, source: str, path: Path) -> list[str]:
    if name.startswith('"'):
        return [name.strip('"')]
    loop = re.search(rf"for {name} in (\w+)", source)
    constant = re.search(rf"^{loop[1] if loop else name} = (.*)$", source, re.MULTILINE)
    assert constant, f"{path.name}: which environment variable does {name} name? (a literal or a module constant)"
    return re.findall(r'"(\w+)"', constant[1].split("#")[0])  # the strings of its value, not of its comment


def variables_in_the_readme() -> set[str]:
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    section = readme.split("## Environment variables", 1)[1].split("\n## ", 1)[0]
    first_cells = [line.split("|")[1] for line in section.splitlines() if line.startswith("| `")]
    return {name for cell in first_cells for name in re.findall(r"`(\w+)`", cell)}


def test_the_readme_table_lists_every_environment_variable_the_code_reads():
    read = variables_the_code_reads()
    assert {"SUMMARIZE_MODEL", "SUMMARIZE_COMPILE", "HF_HUB_OFFLINE", "XDG_CACHE_HOME", "LRU_CACHE_CAPACITY"} <= read
    missing = read - variables_in_the_readme()
    assert not missing, f"README.md, Environment variables: add {sorted(missing)}"


def test_the_readme_table_lists_no_variable_that_nothing_reads():
    stale = variables_in_the_readme() - variables_the_code_reads() - READ_BY_LIBRARIES
    assert not stale, f"README.md, Environment variables: nothing reads {sorted(stale)}"


README_MOST_LINES = 150  # a front door: the lab record lives in docs/ and bench/README.md


def test_the_readme_stays_a_front_door():
    lines = (ROOT / "README.md").read_text(encoding="utf-8").splitlines()
    assert len(lines) <= README_MOST_LINES, f"README.md has {len(lines)} lines; move detail to docs/"
