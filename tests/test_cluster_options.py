"""`--ray` without a cluster: the address and options, Ray missing, what a worker does with a
document, and the throughput lines. None of these needs Ray installed (test_ray.py runs a cluster).
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from summarize.cluster import worker as ray_worker
from summarize.cluster.address import ClusterAddress, ClusterError, parse_address
from summarize.cluster.progress import Throughput
from summarize.cluster.worker import DocumentWorker
from summarize.inputs.extract import ExtractionError
from summarize.run.outcomes import ModelNotLoaded
from summarize.settings import Settings
from test_batch import GOOD


@pytest.mark.parametrize(("text", "address"), [
    ("local", ClusterAddress("local")),
    ("local:3", ClusterAddress("local:3", local_workers=3)),
    ("ray://head:10001", ClusterAddress("ray://head:10001", ray_address="ray://head:10001")),
])
def test_addresses(text, address):
    assert parse_address(text) == address


def test_auto_is_the_running_cluster_or_ray_address(monkeypatch):
    monkeypatch.delenv("RAY_ADDRESS", raising=False)
    assert parse_address("auto").ray_address == "auto"
    monkeypatch.setenv("RAY_ADDRESS", "10.0.0.1:6379")
    assert parse_address("auto").ray_address == "10.0.0.1:6379"


@pytest.mark.parametrize("text", ["local:0", "local:x", "cluster", "ray://", "local2"])
def test_other_addresses_are_refused(text):
    with pytest.raises(ClusterError):
        parse_address(text)


@pytest.mark.parametrize(("args", "says"), [
    (["--ray", "nowhere"], "expected auto, local, local:N or ray://host:port"),
    (["--ray-cpus", "2"], "only with --ray"),
    (["--ray", "local:2", "--ray-cpus", "0"], "0 is not more than 0"),
    (["--ray", "local:2", "--diagnostics-file", "d.jsonl"], "not with --ray"),
])
def test_usage_errors_are_one_line_and_exit_2(tmp_path: Path, args, says, run_cli):
    result = run_cli(str(tmp_path), "-o", str(tmp_path / "out"), "--extractive", *args)
    assert result.exit_code == 2
    (line,) = result.stderr.strip().splitlines()
    assert line.startswith("error:") and says in line


def test_without_ray_installed_the_option_is_one_line_saying_how_to_install_it(monkeypatch, tmp_path: Path, run_cli):
    monkeypatch.setitem(sys.modules, "ray", None)  # `import ray` raises ImportError
    (tmp_path / "a.txt").write_text(GOOD)
    result = run_cli(str(tmp_path), "-o", str(tmp_path / "out"), "--extractive", "--ray", "local:2")
    assert result.exit_code == 2
    assert result.stderr == "error: --ray needs Ray, which is not installed: pip install 'summarize[ray]'\n"
    assert not (tmp_path / "out").exists()


# --- a worker ------------------------------------------------------------------------------


def test_a_worker_reads_the_bytes_it_is_sent_as_the_file_they_came_from():
    worker = DocumentWorker(Settings(words=30, extractive=True))
    outcome = worker.summarize(GOOD.encode(), "/nowhere/bees.txt", "/nowhere/bees.txt")
    assert outcome.error is None and outcome.summary.method == "extractive"
    assert 0 < outcome.summary.words <= 30
    assert outcome.worker.startswith(worker.name.split()[0])


def test_a_bad_document_is_sent_back_as_its_error_and_the_worker_goes_on():
    worker = DocumentWorker(Settings(words=30, extractive=True))
    bad = worker.summarize(b"%PDF-1.7 truncated", "/nowhere/bad.pdf", "/nowhere/bad.pdf")
    assert isinstance(bad.error, ExtractionError) and bad.summary is None
    assert str(bad.error).startswith("/nowhere/bad.pdf: ")
    assert worker.summarize(GOOD.encode(), "b.txt", "b.txt").summary is not None


def test_a_model_that_fails_to_load_is_tried_once_per_worker(monkeypatch):
    loads = []

    def failing(settings, reporter):
        loads.append(1)
        raise ExtractionError("config.json: not valid JSON")

    monkeypatch.setattr(ray_worker, "make_summarizer", failing)
    worker = DocumentWorker(Settings(words=30))
    outcomes = [worker.summarize(GOOD.encode(), name, name) for name in ("a.txt", "b.txt")]
    assert loads == [1]
    assert all(isinstance(o.error, ModelNotLoaded) for o in outcomes)
    assert str(outcomes[0].error) == "the model could not be loaded: config.json: not valid JSON"


def test_notes_come_back_with_the_document_they_were_said_for():
    worker = DocumentWorker(Settings(words=30, extractive=True))
    latin1 = "Caf\xe9 owners open early. Bees visit the flowers outside. The town wakes up slowly.".encode("cp1252")
    assert any("Windows-1252" in note for note in worker.summarize(latin1, "c.txt", "c.txt").notes)
    assert worker.summarize(GOOD.encode(), "d.txt", "d.txt").notes == []


# --- throughput ------------------------------------------------------------------------------


def test_throughput_is_said_every_so_often_per_worker():
    now = [0.0]
    notes: list[str] = []
    progress = Throughput(10, notes.append, every=60, clock=lambda: now[0])
    for worker in ("worker 1 (a)", "worker 2 (b)", "worker 1 (a)"):
        progress.finished(worker)
    now[0] = 30.0
    progress.tick()
    assert notes == []
    now[0] = 60.0
    progress.tick()
    assert notes == ["3/10 documents on the cluster; worker 1 (a): 2 (2.0/min), worker 2 (b): 1 (1.0/min)"]
