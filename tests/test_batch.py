"""Folders, output files, up-to-date checks and atomic writes."""

from __future__ import annotations

import io
import json
import os
import shutil
from pathlib import Path

import pytest

from summarize import files
from summarize.files import write_atomic
from summarize.inputs.words import count_words
from summarize.records import Job
from summarize.run import local, output
from summarize.run.output import HEADER
from summarize.run.plan import Plan, plan_jobs
from summarize.settings import Settings
from summarize.summarizers.extractive import ExtractiveSummarizer

GOOD = """Bees visit flowers to collect nectar and pollen. While they feed, pollen sticks to their
bodies and travels to the next flower. Many crops depend on this service for a good harvest.

Wild bees are declining in many regions. Pesticides, disease and the loss of flowering meadows
all play a part. Farmers can help by leaving strips of wild flowers between their fields.

Cities can help too. Parks with native plants and fewer mown lawns give bees food from spring
to autumn. Even a balcony planted with herbs feeds a surprising number of insects.
"""

OTHER = """The first lighthouses were simple fires on hills near dangerous coasts. Later towers
carried oil lamps behind polished mirrors. A lens invented in France bent the light into a
narrow beam that ships could see from far away.

Keepers lived at the lights and trimmed the wicks through the night. Storms often cut them off
from the mainland for weeks. Today most lights run on their own and are checked by visiting
crews, and satellite navigation guides most ships.
"""


class RecordingUI:
    """Collects the events the batch reports, for assertions."""

    def __init__(self):
        self.events: list[tuple] = []

    def note(self, msg):
        self.events.append(("note", msg))

    def error(self, msg, *, exc=None):
        self.events.append(("error", msg))

    def file_started(self, name, i, n):
        self.events.append(("started", name, i, n))

    def file_finished(self, result):
        self.events.append(("finished", result.input, result.status))

    def results_table(self, results):
        self.events.append(("table", [r.status for r in results]))

    def waiting(self, what):
        self.events.append(("waiting", what))

    def close(self):
        pass

    def of(self, kind):
        return [e[1:] for e in self.events if e[0] == kind]


def documents(root: Path, truncated_pdf: Path) -> Path:
    """root/bees.txt, root/sub/lights.md and a truncated root/broken.pdf."""
    (root / "sub").mkdir(parents=True)
    (root / "bees.txt").write_text(GOOD, encoding="utf-8")
    (root / "sub" / "lights.md").write_text(OTHER, encoding="utf-8")
    shutil.copy(truncated_pdf, root / "broken.pdf")
    return root


@pytest.fixture
def docs(tmp_path: Path, truncated_pdf: Path) -> Path:
    """docs/bees.txt, docs/sub/lights.md and a truncated docs/broken.pdf, plus files to skip."""
    root = documents(tmp_path / "docs", truncated_pdf)
    (root / ".hidden.txt").write_text(GOOD)
    (root / ".git").mkdir()
    (root / ".git" / "notes.txt").write_text(GOOD)
    (root / "old.summary.md").write_text("an earlier output\n")
    (root / "image.png").write_bytes(b"\x89PNG")
    return root


def temp_files(folder: Path) -> list[Path]:
    return [p for p in folder.rglob("*") if ".tmp" in p.name]


# --- planning ------------------------------------------------------------------------------


def test_folder_scan_is_sorted_and_skips_hidden_and_outputs(docs: Path):
    p = plan_jobs([str(docs)])
    assert [j.input for j in p.jobs] == [
        str(docs / "bees.txt"), str(docs / "broken.pdf"), str(docs / "sub" / "lights.md")]
    assert p.headers and all(j.output is None for j in p.jobs)


def test_outputs_mirror_the_folder(docs: Path, tmp_path: Path):
    out = tmp_path / "out"
    p = plan_jobs([str(docs), "-"], out)
    assert [j.output for j in p.jobs] == [
        out / "bees.summary.md", out / "broken.summary.md", out / "sub" / "lights.summary.md",
        out / "stdin.summary.md"]
    assert not p.headers


def test_one_file_one_output_file(tmp_path: Path):
    src = tmp_path / "a.txt"
    assert plan_jobs([str(src)], tmp_path / "a.md").jobs == [Job(str(src), tmp_path / "a.md")]
    (tmp_path / "into").mkdir()
    assert plan_jobs([str(src)], tmp_path / "into").jobs[0].output == tmp_path / "into" / "a.summary.md"
    assert plan_jobs([str(src)], f"{tmp_path}/new/").jobs[0].output == tmp_path / "new" / "a.summary.md"
    assert not plan_jobs([str(src)]).headers


def test_colliding_outputs_keep_their_suffix(tmp_path: Path):
    root = tmp_path / "d"
    root.mkdir()
    for name in ("x.pdf", "x.txt", "y.txt"):
        (root / name).write_text("text")
    outs = [j.output.name for j in plan_jobs([str(root)], tmp_path / "o").jobs]
    assert outs == ["x.pdf.summary.md", "x.txt.summary.md", "y.summary.md"]


def test_same_name_from_two_folders_fails_the_second(tmp_path: Path):
    a, b = tmp_path / "a" / "r.txt", tmp_path / "b" / "r.txt"
    jobs = plan_jobs([str(a), str(b)], tmp_path / "o").jobs
    assert jobs[0].output == tmp_path / "o" / "r.summary.md" and not jobs[0].problem
    assert jobs[1].problem and jobs[1].output is None


def test_duplicates_are_read_once(tmp_path: Path):
    src = tmp_path / "a.txt"
    src.write_text(GOOD)
    assert len(plan_jobs([str(src), str(tmp_path / "." / "a.txt")]).jobs) == 1


def test_empty_folder_is_a_failed_input(tmp_path: Path):
    (tmp_path / "empty").mkdir()
    (job,) = plan_jobs([str(tmp_path / "empty")]).jobs
    assert "no .pdf, .txt, .md, .epub, .docx, .html, .htm files" in job.problem


@pytest.mark.parametrize("inputs", [[], ["-", "-"]])
def test_unworkable_command_lines(inputs):
    with pytest.raises(local.SummarizeError):
        plan_jobs(inputs)


def test_output_file_for_several_inputs(tmp_path: Path):
    out = tmp_path / "out.md"
    out.write_text("")
    with pytest.raises(local.SummarizeError, match="is a file"):
        plan_jobs(["a.txt", "b.txt"], out)


# --- running -------------------------------------------------------------------------------


def test_folder_to_output_dir_end_to_end(docs: Path, tmp_path: Path, run_cli):
    out = tmp_path / "out"
    result = run_cli(str(docs), "-o", str(out), "-n", "40", "--extractive")
    assert result.exit_code == 1
    assert result.stdout == ""
    written = sorted(p.relative_to(out).as_posix() for p in out.rglob("*") if p.is_file())
    assert written == ["bees.summary.md", "sub/lights.summary.md"]
    for path in out.rglob("*.summary.md"):
        header, body = path.read_text(encoding="utf-8").split("\n", 1)
        assert header.startswith("<!-- summarize ") and header.endswith(" -->")
        assert 0 < count_words(body) <= 40
    assert not temp_files(out)
    # one error line for the bad file, then the table naming every input
    errors = [line for line in result.stderr.splitlines() if line.startswith("error:")]
    assert len(errors) == 1 and "broken.pdf" in errors[0]
    table = result.stderr.split(errors[0], 1)[1]
    assert "broken.pdf" in table and "failed" in table and "bees.txt" in table
    assert "Traceback" not in result.stderr


def test_rerun_skips_force_and_new_settings_rewrite(docs: Path, tmp_path: Path, run_cli):
    out = tmp_path / "out"
    (docs / "broken.pdf").unlink()
    target = out / "bees.summary.md"
    assert run_cli(str(docs), "-o", str(out), "-n", "40", "--extractive").exit_code == 0
    first = target.stat().st_mtime_ns

    again = run_cli(str(docs), "-o", str(out), "-n", "40", "--extractive")
    assert again.exit_code == 0
    assert target.stat().st_mtime_ns == first
    assert again.stderr.count("skipped") == 2

    forced = run_cli(str(docs), "-o", str(out), "-n", "40", "--extractive", "--force")
    assert forced.exit_code == 0 and "skipped" not in forced.stderr
    assert target.stat().st_mtime_ns > first

    header = target.read_text().splitlines()[0]
    assert run_cli(str(docs), "-o", str(out), "-n", "30", "--extractive").exit_code == 0
    assert target.read_text().splitlines()[0] != header
    assert count_words(target.read_text().split("\n", 1)[1]) <= 30


def test_touched_input_is_rewritten(tmp_path: Path):
    src = tmp_path / "bees.txt"
    src.write_text(GOOD)
    out = tmp_path / "bees.summary.md"
    settings = Settings(words=40, extractive=True)
    job = Job(str(src), out)
    local.run(Plan([job], False), settings, ui=RecordingUI())
    assert output.is_up_to_date(job, settings.fingerprint())
    os.utime(src, ns=(out.stat().st_mtime_ns + 10**9,) * 2)
    assert not output.is_up_to_date(job, settings.fingerprint())


def test_a_fallback_summary_is_up_to_date_for_the_settings_that_asked_for_it(tmp_path: Path):
    src = tmp_path / "bees.txt"
    src.write_text(GOOD)
    job = Job(str(src), tmp_path / "bees.summary.md")
    settings = Settings(words=40)  # asks for a model; gets the extractive fallback
    ui = RecordingUI()
    (result,) = local.run(Plan([job], False), settings, ui=ui)
    assert result.status == "ok" and result.summary.method == "extractive"
    assert len(ui.of("note")) == 1
    first_line = job.output.read_text().splitlines()[0]
    assert first_line == HEADER.format(fingerprint=settings.fingerprint(), method="extractive")
    assert output.is_up_to_date(job, settings.fingerprint())

    again = RecordingUI()  # the re-run skips it, and so never tries to load the model
    (rerun,) = local.run(Plan([job], False), settings, ui=again)
    assert rerun.status == "skipped" and not again.of("note")
    assert not output.is_up_to_date(job, Settings(words=40, extractive=True).fingerprint())
    (forced,) = local.run(Plan([job], False), settings, ui=RecordingUI(), force=True)
    assert forced.status == "ok"


def test_a_header_from_before_the_method_was_recorded_still_counts(tmp_path: Path):
    src = tmp_path / "bees.txt"
    src.write_text(GOOD)
    job = Job(str(src), tmp_path / "bees.summary.md")
    settings = Settings(words=40, extractive=True)
    job.output.write_text(f"<!-- summarize {settings.fingerprint()} -->\nAn earlier summary.\n")
    assert output.is_up_to_date(job, settings.fingerprint())
    assert not output.is_up_to_date(job, Settings(words=41, extractive=True).fingerprint())


def test_json_lines_for_a_folder(docs: Path, run_cli):
    result = run_cli(str(docs), "--json", "-n", "40", "--extractive")
    assert result.exit_code == 1
    records = [json.loads(line) for line in result.stdout.splitlines()]
    # one record per input (the "one JSON object per input"): the broken PDF's is a failure
    assert [r["input"] for r in records] == [
        str(docs / "bees.txt"), str(docs / "broken.pdf"), str(docs / "sub/lights.md")]
    summaries = [r for r in records if r["ok"]]
    assert [r["input"] for r in summaries] == [str(docs / "bees.txt"), str(docs / "sub/lights.md")]
    assert all(r["method"] == "extractive" and r["words"] <= 40 for r in summaries)


def test_events_and_stdout_layout(docs: Path):
    (docs / "broken.pdf").unlink()
    ui, stdout = RecordingUI(), io.StringIO()
    settings = Settings(words=40, extractive=True)
    results = local.run(plan_jobs([str(docs)]), settings, ui=ui, stdout=stdout)
    assert [r.status for r in results] == ["ok", "ok"]
    assert ui.of("started") == [(str(docs / "bees.txt"), 1, 2), (str(docs / "sub/lights.md"), 2, 2)]
    assert ui.of("table") == [(["ok", "ok"],)]
    text = stdout.getvalue()
    assert text.startswith(f"==> {docs / 'bees.txt'} <==\n")
    assert f"\n\n==> {docs / 'sub' / 'lights.md'} <==\n" in text
    assert not ui.of("note") and not ui.of("error")


def test_no_sentence_fits_is_a_failure(tmp_path: Path):
    src = tmp_path / "long.txt"
    src.write_text("This single sentence has far more than the three words allowed here.\n")
    ui = RecordingUI()
    settings = Settings(words=3, extractive=True)
    (result,) = local.run(plan_jobs([str(src)]), settings, ui=ui, stdout=io.StringIO())
    assert result.status == "failed"
    assert result.reason == "no sentence fits in 3 words"
    assert ui.of("error") == [(f"{src}: no sentence fits in 3 words",)]


def test_a_model_that_fails_to_load_is_tried_once_and_fails_every_input(monkeypatch, tmp_path: Path):
    from summarize.errors import SummarizeError

    loads = []

    def failing_load(settings, ui):
        loads.append(1)
        raise SummarizeError("model.safetensors: truncated file")

    monkeypatch.setattr(local, "make_summarizer", failing_load)
    for name in ("a.txt", "b.txt", "c.txt"):
        (tmp_path / name).write_text("Bees dance to tell each other where the flowers are. " * 3)
    ui = RecordingUI()
    results = local.run(plan_jobs([str(tmp_path)]), Settings(words=40), ui=ui, stdout=io.StringIO())
    assert len(loads) == 1
    assert [r.status for r in results] == ["failed"] * 3
    assert all("truncated file" in r.reason for r in results)


def test_a_model_load_error_is_said_once_and_each_input_points_at_it(monkeypatch, tmp_path: Path):
    from summarize.errors import SummarizeError

    def failing_load(settings, ui):
        raise SummarizeError("model.safetensors: truncated file")

    monkeypatch.setattr(local, "make_summarizer", failing_load)
    names = ("a.txt", "b.txt", "c.txt")
    for name in names:
        (tmp_path / name).write_text("Bees dance to tell each other where the flowers are. " * 3)
    ui = RecordingUI()
    local.run(plan_jobs([str(tmp_path)]), Settings(words=40), ui=ui, stdout=io.StringIO())
    assert ui.of("error") == [("the model could not be loaded: model.safetensors: truncated file",)] + [
        (f"{tmp_path / name}: the model could not be loaded (see above)",) for name in names]


def test_the_summarizer_is_closed_when_the_run_ends_and_when_it_is_interrupted(monkeypatch, tmp_path: Path):
    closed = []

    class Closing(ExtractiveSummarizer):
        def close(self):  # the model summarizer closes its diagnostics file here
            closed.append(True)

    monkeypatch.setattr(local, "make_summarizer", lambda settings, ui: Closing(settings))
    src = tmp_path / "bees.txt"
    src.write_text(GOOD)
    settings = Settings(words=40, extractive=True)
    local.run(plan_jobs([str(src)]), settings, ui=RecordingUI(), stdout=io.StringIO())
    assert closed == [True]

    def interrupted(*args):
        raise KeyboardInterrupt

    monkeypatch.setattr(files.os, "replace", interrupted)
    with pytest.raises(KeyboardInterrupt):
        local.run(plan_jobs([str(src)], tmp_path / "out.md"), settings, ui=RecordingUI())
    assert closed == [True, True]


# --- atomic writes -------------------------------------------------------------------------


def test_write_atomic_replaces_whole_file(tmp_path: Path):
    target = tmp_path / "deep" / "x.summary.md"
    write_atomic(target, "one\n")
    write_atomic(target, "two\n")
    assert target.read_text() == "two\n"
    assert not temp_files(tmp_path)
    assert target.stat().st_mode & 0o777 == 0o666 & ~_umask()


@pytest.mark.parametrize("exc", [KeyboardInterrupt, OSError])
def test_write_atomic_interrupted_keeps_old_file(monkeypatch, tmp_path: Path, exc):
    target = tmp_path / "x.summary.md"
    target.write_text("old\n")

    def fail(*args):
        raise exc

    monkeypatch.setattr(files.os, "replace", fail)
    with pytest.raises(exc):
        write_atomic(target, "new\n")
    assert target.read_text() == "old\n"
    assert not temp_files(tmp_path)


def test_interrupt_mid_batch_keeps_finished_outputs_only(monkeypatch, docs: Path, tmp_path: Path, run_cli):
    (docs / "broken.pdf").unlink()
    real_fsync = os.fsync
    calls = []

    def fsync_then_interrupt(fd):
        calls.append(fd)
        if len(calls) == 2:  # while writing the second summary
            raise KeyboardInterrupt
        real_fsync(fd)

    monkeypatch.setattr(files.os, "fsync", fsync_then_interrupt)
    out = tmp_path / "out"
    result = run_cli(str(docs), "-o", str(out), "--extractive")
    assert result.exit_code == 130
    assert [p.name for p in out.rglob("*") if p.is_file()] == ["bees.summary.md"]
    assert not temp_files(out)


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


# --- settings fingerprint ------------------------------------------------------------------


def test_fingerprint_covers_what_changes_the_text():
    base = Settings(words=100)
    assert base.fingerprint() == Settings(words=100).fingerprint()
    assert base.fingerprint() != Settings(words=101).fingerprint()
    assert base.fingerprint() != Settings(words=100, temperature=0.5).fingerprint()
    assert base.fingerprint() != Settings(words=100, extractive=True).fingerprint()
    for same in (dict(device="cuda"), dict(password="x"), dict(verbose=True)):
        assert Settings(words=100, **same).fingerprint() == base.fingerprint()
    extractive = Settings(words=100, extractive=True)
    other_model = Settings(words=100, extractive=True, model="x", seed=1)
    assert other_model.fingerprint() == extractive.fingerprint()
    assert base.fingerprint("extractive") == extractive.fingerprint()
