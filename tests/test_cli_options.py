"""Options checked before any work: chunk sizes within sane bounds, a --device that this torch
has. Each bad value is one line and exit 2; torch is imported only to check a device."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from summarize import cli
from summarize.settings import DEFAULT_CHUNK_TOKENS, DEFAULT_OVERLAP, MAX_CHUNK_TOKENS, MIN_CHUNK_TOKENS

ROOT = Path(__file__).resolve().parents[1]
TEXT = ("Bees visit flowers to collect nectar and pollen. Pollen sticks to their bodies and travels "
        "to the next flower. Many crops depend on this service for a good harvest.\n")


def assert_usage_error(result, option: str) -> None:
    assert result.exit_code == 2, result.output
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: ") and option in lines[0], result.stderr
    assert result.stdout == ""


@pytest.fixture
def source(tmp_path: Path) -> Path:
    path = tmp_path / "a.txt"
    path.write_text(TEXT)
    return path


# --- chunk size and overlap ----------------------------------------------------------------


@pytest.mark.parametrize(("args", "option"), [
    (["--chunk-tokens", "1"], "--chunk-tokens"),
    (["--chunk-tokens", str(MIN_CHUNK_TOKENS - 1)], "--chunk-tokens"),
    (["--chunk-tokens", str(MAX_CHUNK_TOKENS + 1)], "--chunk-tokens"),
    (["--chunk-tokens", "256", "--overlap", "65"], "--overlap"),  # more than a quarter
    (["--overlap", str(DEFAULT_CHUNK_TOKENS // 4 + 1)], "--overlap"),  # of the default chunk
])
def test_chunk_sizes_outside_their_bounds_are_usage_errors(source: Path, args: list[str], option: str, run_cli):
    assert_usage_error(run_cli(str(source), *args, "--extractive"), option)


@pytest.mark.parametrize("args", [
    ["--chunk-tokens", str(MIN_CHUNK_TOKENS), "--overlap", str(MIN_CHUNK_TOKENS // 4)],
    ["--chunk-tokens", str(MAX_CHUNK_TOKENS), "--overlap", "0"],
    ["--overlap", str(DEFAULT_CHUNK_TOKENS // 4)],
])
def test_chunk_sizes_at_their_bounds_are_accepted(source: Path, args: list[str], run_cli):
    result = run_cli(str(source), *args, "--extractive", "-n", "40")
    assert result.exit_code == 0, result.output


def test_help_states_the_bounds(run_cli):
    text = " ".join(run_cli("--help").stdout.replace("│", " ").split())  # unwrapped, out of rich's panel
    assert f"{MIN_CHUNK_TOKENS} to {MAX_CHUNK_TOKENS}" in text
    assert "at most a quarter of --chunk-tokens" in text


def test_the_cli_defaults_agree_with_the_model_summarizer():
    from summarize.summarizers import model as model_summarizer

    assert (model_summarizer.DEFAULT_CHUNK_TOKENS, model_summarizer.DEFAULT_OVERLAP) == (
        DEFAULT_CHUNK_TOKENS, DEFAULT_OVERLAP)



def test_help_shows_the_sampling_defaults_the_model_samples_with(run_cli):
    from summarize.summarizers.session import DEFAULT_SAMPLING

    shown = " ".join(run_cli("--help", env={"COLUMNS": "200"}).stdout.split())
    for option, default in (("--temperature", DEFAULT_SAMPLING.temperature), ("--top-k", DEFAULT_SAMPLING.top_k),
                            ("--top-p", DEFAULT_SAMPLING.top_p), ("--seed", DEFAULT_SAMPLING.seed)):
        assert option in shown
        assert f"(default {default})" in shown.split(option, 1)[1].split("--", 1)[0], option

# --- the batch memory ----------------------------------------------------------------------


@pytest.mark.parametrize("size", ["lots", "0", "-1G"])
def test_a_batch_memory_that_is_not_a_size_is_a_usage_error(source: Path, size: str, run_cli):
    assert_usage_error(run_cli(str(source), "--batch-memory", size, "--extractive"), "--batch-memory")


def test_the_batch_memory_reaches_the_settings(monkeypatch, source: Path, run_cli):
    seen = []
    monkeypatch.setattr(cli.local, "run", lambda plan, settings, **kwargs: seen.append(settings.batch_memory) or [])
    monkeypatch.setenv("SUMMARIZE_BATCH_MEMORY", "256M")
    run_cli(str(source), "--extractive")
    run_cli(str(source), "--extractive", "--batch-memory", "2G")
    assert seen == [256 * 2**20, 2 * 2**30]


# --- the device ----------------------------------------------------------------------------


@pytest.mark.parametrize("device", ["bogus", "cuda:x", "tpu"])
def test_a_device_torch_does_not_know_is_a_usage_error(source: Path, device: str, run_cli):
    assert_usage_error(run_cli(str(source), "--device", device), "--device")


def test_cuda_without_cuda_is_a_usage_error(monkeypatch, source: Path, run_cli):
    import torch

    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert_usage_error(run_cli(str(source), "--device", "cuda"), "--device")


def test_a_cuda_index_past_the_last_device_is_a_usage_error(monkeypatch, source: Path, run_cli):
    import torch

    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)
    assert_usage_error(run_cli(str(source), "--device", "cuda:2"), "--device")


def test_the_device_comes_from_the_environment_too(source: Path, run_cli):
    result = run_cli(str(source), env={"SUMMARIZE_DEVICE": "bogus"})
    assert_usage_error(result, "--device")


TORCH_IMPORTED = """
import sys
from typer.testing import CliRunner
from summarize import cli
result = CliRunner().invoke(cli.app, sys.argv[1:])
print(result.exit_code, "torch" in sys.modules)
"""


@pytest.mark.parametrize(("args", "code"), [
    (["--help"], 0),
    (["--device", "bogus", "--extractive"], 0),  # no model: the device is moot, and not checked
])
def test_torch_is_not_imported_without_a_device_to_check(source: Path, args: list[str], code: int):
    env = {**os.environ, "PYTHONPATH": str(ROOT), "HF_HUB_OFFLINE": "1"}
    proc = subprocess.run([sys.executable, "-c", TORCH_IMPORTED, str(source), *args], capture_output=True,
                          text=True, env=env, cwd=ROOT, timeout=120)
    assert proc.stdout.split() == [str(code), "False"], proc.stderr


# --- the weights' form --------------------------------------------------------------------


@pytest.mark.parametrize(("value", "loads_as"), [(None, "auto"), ("auto", "auto"), ("none", None), ("int8", "int8"), ("int4", "int4")])
def test_quantize_reaches_the_loader_as_the_engine_names_it(source: Path, value, loads_as, run_cli, monkeypatch):
    """No --quantize is auto (what the calibration finds fastest); none is the weights as loaded."""
    from summarize.errors import SummarizeError
    from summarize.summarizers import session

    seen = []

    def load_nothing(*args, quantize, **kwargs):
        seen.append(quantize)
        raise SummarizeError("no model in this test")

    monkeypatch.setattr(session, "load_model", load_nothing)
    result = run_cli(str(source), *(["--quantize", value] if value else []), "-m", str(source.parent), "-n", "40")
    assert seen == [loads_as], result.output


def test_an_unknown_quantize_is_a_usage_error(source: Path, run_cli):
    assert_usage_error(run_cli(str(source), "--quantize", "int2", "--extractive"), "--quantize")
