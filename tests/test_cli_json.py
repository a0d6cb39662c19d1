"""--json: one JSON object per input, in the inputs' order, whatever became of each: a summary
(`"ok": true` with its fields), a failure (`{"input", "error", "ok": false}`) or an up-to-date
output left alone (`{"input", "skipped", "output", "ok": true}`)."""

from __future__ import annotations

import json
from pathlib import Path

from summarize.run import local
from summarize.summarizers.extractive import ExtractiveSummarizer

TEXT = ("Bees visit flowers to collect nectar and pollen. Pollen sticks to their bodies and travels "
        "to the next flower. Many crops depend on this service for a good harvest.\n")


def json_run(run_cli, *args: str) -> tuple[int, list[dict]]:
    result = run_cli(*args, "--json", "--extractive", "-n", "40")
    return result.exit_code, [json.loads(line) for line in result.stdout.splitlines()]


def test_a_failed_input_gets_a_record_too(tmp_path: Path, run_cli):
    good, gone = tmp_path / "good.txt", tmp_path / "gone.txt"
    good.write_text(TEXT)
    code, records = json_run(run_cli, str(good), str(gone))
    assert code == 1
    assert [r["input"] for r in records] == [str(good), str(gone)]
    assert records[0]["ok"] is True and records[0]["method"] == "extractive"
    assert records[1] == {"input": str(gone), "error": "no such file", "ok": False}


def test_an_up_to_date_output_gets_a_skipped_record(tmp_path: Path, run_cli):
    (tmp_path / "good.txt").write_text(TEXT)
    out = tmp_path / "out"
    json_run(run_cli, str(tmp_path), "-o", str(out))
    code, records = json_run(run_cli, str(tmp_path), "-o", str(out))
    assert code == 0
    assert records == [{"input": str(tmp_path / "good.txt"), "skipped": "up to date",
                        "output": str(out / "good.summary.md"), "ok": True}]


def test_records_keep_the_inputs_order_when_documents_wait_to_be_batched(monkeypatch, tmp_path: Path, run_cli):
    class Batching(ExtractiveSummarizer):  # holds documents back, as map-reduce does for 8
        documents_per_batch = 8

    monkeypatch.setattr(local, "make_summarizer", lambda settings, ui: Batching(settings))
    names = ["a.txt", "b-gone.txt", "c.txt"]
    (tmp_path / "a.txt").write_text(TEXT)
    (tmp_path / "c.txt").write_text(TEXT)
    code, records = json_run(run_cli, *(str(tmp_path / name) for name in names))
    assert code == 1
    assert [Path(r["input"]).name for r in records] == names
    assert [r["ok"] for r in records] == [True, False, True]
