"""`--ray`: a folder summarized on a Ray cluster keeps every promise of the single-machine run.

One local cluster of 2 CPUs serves every test of this module (starting one takes seconds); the
CLI runs in this process and finds it with `--ray auto`, or in a child that is given its address.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest
from typer.testing import CliRunner

from summarize import cli
from summarize.cluster import pool as ray_pool
from summarize.cluster import run as ray_batch
from summarize.cluster import worker as ray_worker
from test_batch import documents, temp_files
from test_cli_signals import ROOT, child_env, wait_for
from tiny_models import tiny_released_layout

ray = pytest.importorskip("ray")

# The CLI in a child whose first write stalls at fsync (after touching `ready`) until a signal
# ends it: the signal lands while a temporary file exists, however long it takes to arrive.
WRITE_STALLING_CHILD = """
import os, sys, time
from pathlib import Path
from summarize import cli

ready = Path(sys.argv[1])

def stalled_fsync(fd):
    ready.touch()
    while True:  # short sleeps: a signal that another thread received is raised here within one
        time.sleep(0.1)

os.fsync = stalled_fsync
sys.argv = ["summarize", *sys.argv[2:]]
cli.main()
"""

# The CLI in a child whose workers never finish a document; `ready` is touched when the first
# document is sent, so that a signal lands while the driver waits on the cluster.
BUSY_WORKERS_CHILD = """
import sys, threading
from pathlib import Path
from summarize import cli
from summarize.cluster import pool as ray_pool, worker as ray_worker

ready = Path(sys.argv[1])

class Busy(ray_worker.DocumentWorker):
    def summarize(self, data, source, label):
        threading.Event().wait()  # until the driver kills this worker

real_submit = ray_pool.WorkerPool.submit

def submit(self, *args):
    ready.touch()
    return real_submit(self, *args)

ray_pool.DocumentWorker = Busy
ray_pool.WorkerPool.submit = submit
sys.argv = ["summarize", *sys.argv[2:]]
cli.main()
"""

# Only against a hang: under load, a child that starts Ray workers may take minutes to get there.
HANG_SECONDS = 600

THIRD = """Rivers carry sand and stones from the mountains to the sea. Where the water slows down, the
sand settles and builds wide deltas. Farmers have grown rice on such land for thousands of years.
"""


@pytest.fixture(scope="module")
def cluster():
    """A local cluster with 2 CPUs, shut down when the module's tests are done."""
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False,
             runtime_env={"env_vars": {"HF_HUB_OFFLINE": "1"}})
    yield ray.get_runtime_context().gcs_address
    ray.shutdown()


@pytest.fixture
def folder(tmp_path: Path, truncated_pdf: Path) -> Path:
    """Three documents of different sizes and a broken PDF."""
    root = documents(tmp_path / "docs", truncated_pdf)
    (root / "rivers.txt").write_text(THIRD, encoding="utf-8")
    return root


def summarize(*args: str):
    return CliRunner().invoke(cli.app, list(args))


def written(out: Path) -> dict[str, bytes]:
    return {p.relative_to(out).as_posix(): p.read_bytes() for p in sorted(out.rglob("*")) if p.is_file()}


def test_extractive_summaries_are_byte_identical_to_the_single_machine_run(cluster, folder: Path, tmp_path: Path):
    on_cluster = summarize(str(folder), "-o", str(tmp_path / "cluster"), "-n", "30", "--extractive", "--ray", "auto")
    alone = summarize(str(folder), "-o", str(tmp_path / "alone"), "-n", "30", "--extractive")
    assert on_cluster.exit_code == alone.exit_code == 1
    assert written(tmp_path / "cluster") == written(tmp_path / "alone")
    assert sorted(written(tmp_path / "cluster")) == ["bees.summary.md", "rivers.summary.md", "sub/lights.summary.md"]


def test_a_bad_file_fails_alone_with_its_line_and_the_table_names_it(cluster, folder: Path, tmp_path: Path):
    result = summarize(str(folder), "-o", str(tmp_path / "out"), "-n", "30", "--extractive", "--ray", "auto")
    assert result.exit_code == 1
    errors = [line for line in result.stderr.splitlines() if line.startswith("error:")]
    assert len(errors) == 1 and "broken.pdf: not a readable PDF" in errors[0]
    table = result.stderr.split(errors[0], 1)[1]
    for name, status in (("bees.txt", "ok"), ("broken.pdf", "failed"), ("rivers.txt", "ok"), ("lights.md", "ok")):
        assert any(name in line and status in line for line in table.splitlines())
    assert "documents on the cluster" in result.stderr  # the throughput line
    assert "Traceback" not in result.stderr


@pytest.fixture(scope="module")
def tiny_model(tmp_path_factory) -> Path:
    return tiny_released_layout(tmp_path_factory.mktemp("tiny-qwen3.5"))


def test_model_summaries_at_temperature_0_are_byte_identical(cluster, tiny_model: Path, folder: Path, tmp_path: Path):
    (folder / "broken.pdf").unlink()
    options = ["-m", str(tiny_model), "--dtype", "float32", "--temperature", "0", "-n", "20"]
    on_cluster = summarize(str(folder), "-o", str(tmp_path / "cluster"), *options, "--ray", "auto")
    alone = summarize(str(folder), "-o", str(tmp_path / "alone"), *options)
    assert on_cluster.exit_code == alone.exit_code == 0, on_cluster.stderr
    assert written(tmp_path / "cluster") == written(tmp_path / "alone")
    assert all(b"summarize" in text.splitlines()[0] for text in written(tmp_path / "cluster").values())


def test_json_lines_are_the_single_machine_runs(cluster, folder: Path):
    def records(*extra: str) -> list[dict]:
        result = summarize(str(folder), "--json", "-n", "30", "--extractive", *extra)
        assert result.exit_code == 1
        return [{k: v for k, v in json.loads(line).items() if k != "seconds"} for line in result.stdout.splitlines()]

    assert records("--ray", "auto") == records()


def test_a_model_that_fails_to_load_is_said_once_and_each_input_points_at_it(cluster, folder: Path, tmp_path: Path):
    (folder / "broken.pdf").unlink()
    model = tmp_path / "model"
    model.mkdir()
    (model / "config.json").write_text("{not json")
    result = summarize(str(folder), "-o", str(tmp_path / "out"), "-m", str(model), "--ray", "auto")
    assert result.exit_code == 1
    errors = [line for line in result.stderr.splitlines() if line.startswith("error:")]
    assert errors[0].startswith(f"error: the model could not be loaded: {model / 'config.json'}: not valid JSON")
    assert sorted(errors[1:]) == sorted(f"error: {folder / name}: the model could not be loaded (see above)"
                                        for name in ("bees.txt", "rivers.txt", "sub/lights.md"))


@pytest.fixture
def kill_on_submit(monkeypatch):
    """Make the pool kill (ray.kill) the worker a chosen document is sent to, just before it
    gets there: `killing(lambda label, n: ...)` chooses by the document's name and how many
    documents were sent before it. Returns the labels whose worker was killed."""
    killed: list[str] = []
    real_submit = ray_pool.WorkerPool.submit

    def killing(choose):
        sent = []

        def submit(self, worker, data, source, label):
            if choose(label, len(sent)):
                ray.kill(worker.actor)
                killed.append(label)
            sent.append(label)
            return real_submit(self, worker, data, source, label)

        monkeypatch.setattr(ray_pool.WorkerPool, "submit", submit)
        return killed

    return killing


def test_a_killed_worker_s_document_is_retried_and_every_summary_is_written(
        cluster, kill_on_submit, folder: Path, tmp_path: Path):
    killed = kill_on_submit(lambda label, sent: sent == 1)  # the second document sent
    on_cluster = summarize(str(folder), "-o", str(tmp_path / "cluster"), "-n", "30", "--extractive", "--ray", "auto")
    summarize(str(folder), "-o", str(tmp_path / "alone"), "-n", "30", "--extractive")
    assert len(killed) == 1
    assert on_cluster.exit_code == 1  # the broken PDF, alone
    assert written(tmp_path / "cluster") == written(tmp_path / "alone")
    assert on_cluster.stderr.count("error:") == 1


def test_a_document_that_kills_every_worker_fails_alone_after_three_tries(monkeypatch, cluster, folder: Path,
                                                                          tmp_path: Path):
    class DiesOnRivers(ray_worker.DocumentWorker):  # defined here, so Ray ships the class itself to the workers
        def summarize(self, data, source, label):
            if source.endswith("rivers.txt"):
                os._exit(1)  # the worker's process ends mid-document, as when it runs out of memory
            return super().summarize(data, source, label)

    monkeypatch.setattr(ray_pool, "DocumentWorker", DiesOnRivers)
    result = summarize(str(folder), "-o", str(tmp_path / "out"), "-n", "30", "--extractive", "--ray", "auto")
    assert result.exit_code == 1
    errors = [line for line in result.stderr.splitlines() if line.startswith("error:")]
    assert len(errors) == 2 and any("rivers.txt: its worker died 3 times" in line for line in errors), result.stderr
    assert sorted(written(tmp_path / "out")) == ["bees.summary.md", "sub/lights.summary.md"]


def test_a_rerun_skips_what_is_up_to_date_without_reaching_the_cluster(cluster, monkeypatch, folder: Path,
                                                                        tmp_path: Path):
    (folder / "broken.pdf").unlink()
    out = tmp_path / "out"
    assert summarize(str(folder), "-o", str(out), "-n", "30", "--extractive", "--ray", "auto").exit_code == 0

    def no_cluster(*args):
        raise AssertionError("nothing is left to do: no cluster is needed")

    monkeypatch.setattr(ray_batch, "connected", no_cluster)
    rerun = summarize(str(folder), "-o", str(out), "-n", "30", "--extractive", "--ray", "auto")
    assert rerun.exit_code == 0, rerun.stderr
    assert rerun.stderr.count("skipped") == 3


def test_a_cluster_that_cannot_be_reached_is_one_line_and_exit_2(monkeypatch, folder: Path, tmp_path: Path):
    def refused(**options):
        raise ConnectionError("Could not find any running Ray instance.\nPlease specify the one to connect to.")

    monkeypatch.setattr(ray, "is_initialized", lambda: False)
    monkeypatch.setattr(ray, "init", refused)
    result = summarize(str(folder), "-o", str(tmp_path / "out"), "--extractive", "--ray", "auto")
    assert result.exit_code == 2
    assert result.stderr.strip().splitlines() == [
        "error: --ray auto: cannot connect (Could not find any running Ray instance.)"]
    assert not (tmp_path / "out").exists()


def test_ctrl_c_while_writing_leaves_no_temporary_file_and_exits_130(cluster, folder: Path, tmp_path: Path):
    out, ready = tmp_path / "out", tmp_path / "ready"
    proc = subprocess.Popen(
        [sys.executable, "-c", WRITE_STALLING_CHILD, str(ready), str(folder), "-o", str(out), "--extractive",
         "--ray", "auto"], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        env=child_env() | {"RAY_ADDRESS": cluster}, cwd=ROOT)
    wait_for(ready, proc, seconds=HANG_SECONDS)
    assert temp_files(out), "the child's write stalled before its temporary file was made"  # caught mid-write
    proc.send_signal(signal.SIGINT)
    stdout, stderr = proc.communicate(timeout=HANG_SECONDS)
    assert proc.returncode == 130, stderr
    assert stderr.strip().splitlines()[-1] == "error: interrupted"
    assert not temp_files(out)
    assert "Traceback" not in stderr


@pytest.mark.parametrize(("signum", "code", "line"), [(signal.SIGINT, 130, "interrupted"), (signal.SIGTERM, 143, "terminated")])
def test_a_signal_while_the_workers_run_ends_them_and_writes_nothing(cluster, folder: Path, tmp_path: Path,
                                                                     signum, code, line):
    out, ready = tmp_path / "out", tmp_path / "ready"
    (folder / "broken.pdf").unlink()
    proc = subprocess.Popen(
        [sys.executable, "-c", BUSY_WORKERS_CHILD, str(ready), str(folder), "-o", str(out), "--extractive",
         "--ray", "auto"], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        env=child_env() | {"RAY_ADDRESS": cluster}, cwd=ROOT)
    wait_for(ready, proc, seconds=HANG_SECONDS)
    proc.send_signal(signum)
    stdout, stderr = proc.communicate(timeout=HANG_SECONDS)
    assert proc.returncode == code, stderr
    assert stderr.strip().splitlines() == [f"error: {line}"]
    assert not out.exists()
