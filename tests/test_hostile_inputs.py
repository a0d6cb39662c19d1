"""Hostile inputs, outputs and options: nothing a user has is lost, nothing grows without bound,
and every refusal is one line with the documented exit code."""

from __future__ import annotations

import io
import json
import os
import random
import resource
import subprocess
import sys
import threading
from pathlib import Path

import pytest
from typer.testing import CliRunner

from summarize import cli
from summarize.run.output import HEADER
from summarize.settings import Settings

TEXT = ("Bees visit flowers to collect nectar and pollen. Pollen sticks to their bodies and travels "
        "to the next flower. Many crops depend on this service for a good harvest. Rivers carry water "
        "from the hills to the sea, and towns grew beside them for trade and for fields.\n")


def invoke(*args: str, **kwargs):
    return CliRunner().invoke(cli.app, list(args), **kwargs)


def error_lines(stderr: str) -> list[str]:
    return [line for line in stderr.splitlines() if line.startswith("error: ")]


# --- 1. only a file summarize wrote is replaced ----------------------------------------------

FOREIGN = {
    "notes": "my own notes, not a summary\n",
    "markdown": "# Title\n\nSome text.\n",
    "almost-a-header": "<!-- summarize by hand -->\nmine\n",
    "binary": "\x00\x01\x02 not text",
}


@pytest.fixture
def tree(tmp_path: Path, monkeypatch) -> Path:
    monkeypatch.chdir(tmp_path)
    for name in ("a.txt", "b.md", "sub/c.txt"):
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_text(TEXT)
    return tmp_path


@pytest.mark.parametrize("content", FOREIGN.values(), ids=FOREIGN.keys())
@pytest.mark.parametrize("victim", ["a.summary.md", "sub/c.summary.md"])
def test_a_foreign_output_in_the_output_folder_is_kept_and_the_rest_goes_on(tree: Path, victim: str,
                                                                              content: str):
    (tree / victim).write_text(content)
    result = invoke(".", "-o", ".", "--extractive", "-n", "20")
    assert result.exit_code == 1, result.output
    (line,) = error_lines(result.stderr)
    assert victim in line and "--force" in line
    assert (tree / victim).read_text() == content
    others = {"a.summary.md", "b.summary.md", "sub/c.summary.md"} - {victim}
    for name in others:
        assert (tree / name).read_text().startswith("<!-- summarize ")


@pytest.mark.parametrize("name", ["out.md", "notes.markdown", "deep/x.summary.md"])
def test_an_explicit_output_file_summarize_did_not_write_is_kept(tree: Path, name: str):
    (tree / name).parent.mkdir(parents=True, exist_ok=True)
    (tree / name).write_text("keep me\n")
    result = invoke("a.txt", "-o", name, "--extractive", "-n", "20")
    assert result.exit_code == 1, result.output
    assert name in error_lines(result.stderr)[0]
    assert (tree / name).read_text() == "keep me\n"
    forced = invoke("a.txt", "-o", name, "--extractive", "-n", "20", "--force")
    assert forced.exit_code == 0, forced.output
    assert (tree / name).read_text().startswith("<!-- summarize ")


@pytest.mark.parametrize("make", ["dangling-link", "fifo", "folder"])
def test_an_output_that_is_not_a_file_is_refused(tree: Path, make: str):
    target = tree / "a.summary.md"
    if make == "dangling-link":
        os.symlink(tree / "nowhere" / "x.md", target)
    elif make == "fifo":
        os.mkfifo(target)
    else:
        target.mkdir()
    result = invoke("a.txt", "b.md", "-o", ".", "--extractive", "-n", "20")
    assert result.exit_code == 1, result.output
    assert "a.summary.md" in error_lines(result.stderr)[0]
    assert (tree / "b.summary.md").is_file()
    assert target.is_symlink() or not target.is_file()


def test_its_own_outputs_and_empty_files_are_replaced(tree: Path):
    (tree / "a.summary.md").write_text(HEADER.format(fingerprint="0123abcd", method="extractive") + "\nold\n")
    (tree / "b.summary.md").write_text("")
    result = invoke("a.txt", "b.md", "-o", ".", "--extractive", "-n", "20")
    assert result.exit_code == 0, result.output
    assert "old" not in (tree / "a.summary.md").read_text()
    assert (tree / "b.summary.md").read_text().startswith("<!-- summarize ")


def test_a_users_own_summary_md_among_the_inputs_is_neither_read_nor_replaced(tree: Path):
    (tree / "a.summary.md").write_text("my summary, by hand\n")
    result = invoke(".", "-o", ".", "--extractive", "-n", "20")
    assert result.exit_code == 1
    assert (tree / "a.summary.md").read_text() == "my summary, by hand\n"
    assert not (tree / "a.summary.summary.md").exists()  # not taken for a document either
    rerun = invoke(".", "-o", ".", "--extractive", "-n", "20")  # its own outputs are skipped as inputs
    assert rerun.exit_code == 1 and len(error_lines(rerun.stderr)) == 1


def _varied_text(sentences: int, seed: int = 0) -> str:
    """Sentences of different words, so that an extractive summary has many to pick from."""
    rng = random.Random(seed)
    vocabulary = ("bees rivers lights harbour pollen nectar towns fields trade ships keepers storms "
                  "crops valleys bridges markets winter summer stone timber").split()
    return " ".join(" ".join(rng.choice(vocabulary) for _ in range(rng.randint(6, 14))).capitalize() + "."
                    for _ in range(sentences))


# --- 2. every byte of stdout lands, or the run fails ------------------------------------------


class _ShortWrites:
    """A text stream without a file descriptor that takes at most `most` characters a write
    (0: none at all, as a full device would)."""

    def __init__(self, most: int) -> None:
        self.most, self.taken = most, []

    def write(self, text: str) -> int:
        self.taken.append(text[: self.most])
        return len(self.taken[-1])

    def flush(self) -> None:
        pass

    def fileno(self) -> int:
        raise io.UnsupportedOperation("fileno")


def _run_to(stdout, *inputs: Path, json_lines: bool = False):
    from summarize.run import local
    from summarize.run.plan import plan_jobs
    from summarize.settings import Settings
    from summarize.ui.terminal import QuietUI

    plan = plan_jobs([str(p) for p in inputs])
    return local.run(plan, Settings(words=30, extractive=True), ui=QuietUI(), json_lines=json_lines, stdout=stdout)


@pytest.mark.parametrize("most", [1, 7, 4096])
@pytest.mark.parametrize("json_lines", [False, True])
def test_short_writes_to_a_stream_are_completed(tmp_path: Path, most: int, json_lines: bool):
    paths = []
    for i, scale in enumerate((1, 5, 20)):
        paths.append(tmp_path / f"doc{i}.txt")
        paths[-1].write_text(TEXT * scale)
    full, short = io.StringIO(), _ShortWrites(most)
    _run_to(full, *paths, json_lines=json_lines)
    _run_to(short, *paths, json_lines=json_lines)
    if json_lines:  # the seconds differ between the runs
        assert [json.loads(line)["summary"] for line in "".join(short.taken).splitlines()] == \
               [json.loads(line)["summary"] for line in full.getvalue().splitlines()]
    else:
        assert "".join(short.taken) == full.getvalue()


def test_a_stream_that_takes_nothing_fails_the_run(tmp_path: Path):
    from summarize.run.local import StdoutError

    (tmp_path / "a.txt").write_text(TEXT)
    with pytest.raises(StdoutError):
        _run_to(_ShortWrites(0), tmp_path / "a.txt")


def _limited_run(tmp_path: Path, limit: int, args: list[str], env: dict[str, str]) -> tuple[int, str, bytes]:
    """summarize with stdout on a regular file that may not grow past `limit` bytes (RLIMIT_FSIZE:
    the first write across it is cut short, the next fails with EFBIG, as on a nearly full disk)."""
    out = tmp_path / f"stdout-{limit}-{len(env)}-{len(args)}"

    def limit_file_size() -> None:
        resource.setrlimit(resource.RLIMIT_FSIZE, (limit, limit))

    with open(out, "wb") as stdout:
        proc = subprocess.run([sys.executable, "-m", "summarize", *args], stdout=stdout, stderr=subprocess.PIPE,
                              env={**os.environ, **env}, preexec_fn=limit_file_size, timeout=120)
    return proc.returncode, proc.stderr.decode(), out.read_bytes()


@pytest.mark.parametrize("env", [{"PYTHONUNBUFFERED": "1"}, {}], ids=["unbuffered", "buffered"])
@pytest.mark.parametrize("json_flag", [[], ["--json"]], ids=["text", "json"])
def test_a_full_disk_under_stdout_fails_with_one_line(tmp_path: Path, env: dict, json_flag: list[str]):
    doc = tmp_path / "long.txt"
    doc.write_text(_varied_text(800))
    args = [str(doc), "--extractive", "-n", "1500", "--no-cache", *json_flag]
    code, stderr, written = _limited_run(tmp_path, 10**7, args, env)
    assert code == 0 and len(written) > 8192, stderr
    timed = written.find(b'"seconds"')  # a record's seconds differ from run to run: cut before them
    for limit in (len(written) // 2 if timed < 0 else min(len(written) // 2, timed), 4096):
        code, stderr, cut = _limited_run(tmp_path, limit, args, env)
        assert code == 1, (limit, stderr)
        (line,) = error_lines(stderr)
        assert "standard output" in line
        assert written.startswith(cut) and len(cut) <= limit


# --- 10. outputs that cannot be written are found before any work ----------------------------


@pytest.fixture
def nothing_read(monkeypatch):
    """Fails the test if any input is read."""
    from summarize.run import local

    def refuse(*args, **kwargs):
        raise AssertionError("an input was read")

    monkeypatch.setattr(local, "extract_document", refuse)


@pytest.mark.parametrize("names", [("a/r.txt", "b/r.txt"), ("x/notes.md", "y/notes.md", "z/other.pdf"),
                                   ("one/deep/p.pdf", "two/deep/p.pdf")])
def test_two_inputs_with_one_output_are_a_usage_error(tree: Path, names, nothing_read):
    for name in names:
        (tree / name).parent.mkdir(parents=True, exist_ok=True)
        (tree / name).write_text(TEXT)
    args = [str(Path(name).parent) if "deep" in name else name for name in names]
    result = invoke(*args, "-o", "out", "--extractive")
    assert result.exit_code == 2, result.output
    (line,) = error_lines(result.stderr)
    assert "would both be" in line
    assert not (tree / "out").exists()


@pytest.mark.parametrize("output", ["a.txt/x.md", "a.txt/deeper/", "b.md/"])
def test_an_output_under_a_file_is_a_usage_error(tree: Path, output: str, nothing_read):
    result = invoke("a.txt", "sub", "-o", output, "--extractive")
    assert result.exit_code == 2, result.output
    (line,) = error_lines(result.stderr)
    assert "folder" in line and output.split("/")[0] in line


@pytest.mark.parametrize("read_only", [True, False], ids=["read-only", "no-permission"])
@pytest.mark.parametrize("output", ["locked/x.md", "locked/new/deeper/", "locked/"])
def test_an_unwritable_output_folder_is_a_usage_error(tree: Path, monkeypatch, output: str, read_only: bool,
                                                      nothing_read):
    from summarize.run import plan

    (tree / "locked").mkdir()
    locked = tree / "locked"
    real_access, real_statvfs = os.access, os.statvfs
    monkeypatch.setattr(plan.os, "access", lambda p, mode: Path(p).absolute() != locked and real_access(p, mode))

    class _Flags:
        def __init__(self, p):
            self.f_flag = real_statvfs(p).f_flag | (os.ST_RDONLY if read_only and Path(p).absolute() == locked else 0)

    monkeypatch.setattr(plan.os, "statvfs", _Flags)
    result = invoke("a.txt", "-o", output, "--extractive")
    assert result.exit_code == 2, result.output
    (line,) = error_lines(result.stderr)
    assert ("read-only file system" if read_only else "permission denied") in line
    assert list(locked.iterdir()) == []


# --- 11. a model the user named must be found --------------------------------------------------


@pytest.mark.parametrize("model", ["/no/such/model", "./missing-folder", "~/nowhere/tiny.gguf", "weights.pth",
                                   "no_slash_name", "nobody/no-such-model", "nobody/no-such-model:Q4_K_M"])
@pytest.mark.parametrize("how", ["option", "env"])
def test_a_named_model_that_cannot_be_had_is_a_usage_error(tree: Path, monkeypatch, model: str, how: str):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    args, env = (["-m", model], {}) if how == "option" else ([], {"SUMMARIZE_MODEL": model})
    result = invoke("a.txt", "b.md", "-n", "20", *args, env=env)
    assert result.exit_code == 2, result.output
    (line,) = error_lines(result.stderr)
    assert model.split(":")[0] in line
    assert result.stdout == ""


def test_only_the_default_model_falls_back(tree: Path, monkeypatch):
    from summarize.summarizers import session

    def unavailable(*args):
        from summarize.errors import ModelNotAvailable

        raise ModelNotAvailable("model Qwen/Qwen3.5-0.8B is not available (offline and not in the local cache)")

    monkeypatch.setattr(session, "load_session", unavailable)
    result = invoke("a.txt", "-n", "20")
    assert result.exit_code == 0, result.output
    assert "extractive summary instead" in result.stderr and result.stdout.strip()


# --- 6. options are checked before any work ------------------------------------------------------

BAD_OPTIONS = [
    ("--seed", str(2**64)), ("--seed", str(10**40)), ("--seed", "-1"),
    ("--temperature", "inf"), ("--temperature", "nan"), ("--temperature", "-0.5"), ("--temperature", "1e999"),
    ("--top-p", "nan"), ("--top-p", "0"), ("--top-p", "1.5"),
    ("--top-k", "0"), ("-n", "0"), ("-n", str(10**12)),
    ("--chunk-tokens", "1"), ("--chunk-tokens", str(2**40)), ("--overlap", "-1"),
    ("--speculate", "-1"), ("--speculate", "1000"),
    ("--device", "cpu:99"), ("--device", "cpu:1"), ("--device", "tpu"),
    ("--batch-memory", "0"), ("--cache-size", "lots"),
    ("--ray-cpus", "inf"), ("--ray-gpus", "nan"),
]


@pytest.mark.parametrize(("option", "value"), BAD_OPTIONS, ids=[f"{o}={v}" for o, v in BAD_OPTIONS])
def test_an_option_out_of_range_is_a_usage_error_before_any_work(tree: Path, option: str, value: str, nothing_read):
    result = invoke("a.txt", option, value)
    assert result.exit_code == 2, result.output
    (line,) = error_lines(result.stderr)
    assert option in line and "unexpected" not in line
    assert result.stdout == ""


def test_the_largest_seed_is_one_torch_takes():
    import torch

    from summarize.settings import MAX_SEED

    torch.Generator().manual_seed(MAX_SEED)
    with pytest.raises((RuntimeError, ValueError, OverflowError)):
        torch.Generator().manual_seed(MAX_SEED + 1)


# --- 3 and 9. inputs are read within a limit, as streams where they are streams ---------------


def _feed_fifo(path: Path, data_blocks) -> threading.Thread:
    """A named pipe at `path`, written from a thread until the reader goes away."""
    os.mkfifo(path)

    def write() -> None:
        try:
            with open(path, "wb") as f:
                for block in data_blocks:
                    f.write(block)
        except (BrokenPipeError, OSError):
            pass

    thread = threading.Thread(target=write, daemon=True)
    thread.start()
    return thread


def _endless(block: bytes, total: int):
    for _ in range(total // len(block)):
        yield block


@pytest.mark.parametrize(("size", "limit"), [(2 * 2**20, "1M"), (300 * 2**20, "256M"), (20 * 2**30, "1G"),
                                             (5000, "4K")])
@pytest.mark.parametrize("name", ["big.txt", "notes.md", "book.pdf", "data"])
def test_a_file_over_the_size_limit_fails_alone_without_being_read(tree: Path, size: int, limit: str, name: str):
    with open(tree / name, "wb") as f:  # sparse: nothing is on disk, and reading it all would take long
        f.truncate(size)
    result = invoke(name, "a.txt", "--extractive", "-n", "20", "--max-input-size", limit)
    assert result.exit_code == 1, result.output
    (line,) = error_lines(result.stderr)
    assert name in line and "--max-input-size" in line and limit in line
    assert result.stdout.strip()  # a.txt was summarized


@pytest.mark.parametrize("limit", ["64K", "1M"])
def test_a_stream_over_the_limit_stops_at_the_limit(tree: Path, limit: str):
    line = b"All work and no play makes a dull day, says the text that never ends.\n"
    thread = _feed_fifo(tree / "pipe", _endless(line * 1000, 64 * 2**20))
    result = invoke("pipe", "--extractive", "--max-input-size", limit)
    assert result.exit_code == 1 and "--max-input-size" in error_lines(result.stderr)[0]
    stdin = invoke("-", "--extractive", "--max-input-size", limit, input=line * 40000)
    assert stdin.exit_code == 1 and "--max-input-size" in error_lines(stdin.stderr)[0]
    thread.join(5)


@pytest.mark.parametrize("head", [b"\x7fELF\x02\x01\x01\x00" + bytes(56), b"\x89PNG\r\n\x1a\n\x00\x00\x00\rIHDR",
                                  b"\x1f\x8b\x08\x00\x00\x00\x00\x00", bytes(range(256)) * 4])
def test_binary_is_refused_from_its_first_kib_before_the_rest_is_read(tree: Path, head: bytes):
    thread = _feed_fifo(tree / "stream.txt", [head, *_endless(b"x" * 2**16, 64 * 2**20)])
    result = invoke("stream.txt", "--extractive", "--max-input-size", "8M")
    assert result.exit_code == 1
    assert "binary data" in error_lines(result.stderr)[0]
    thread.join(5)


def test_pipes_fifos_and_dev_stdin_are_read_as_streams(tree: Path):
    _feed_fifo(tree / "named-pipe", [TEXT.encode()])
    assert invoke("named-pipe", "--extractive", "-n", "20").stdout.strip()
    script = f"{sys.executable} -m summarize <(cat a.txt) --extractive -n 20 && " \
             f"cat b.md | {sys.executable} -m summarize /dev/stdin --extractive -n 20"
    proc = subprocess.run(["bash", "-c", script], capture_output=True, text=True, timeout=120,
                          env={**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)})
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.count("Bees") == 2 and "empty" not in proc.stderr


def test_sockets_and_devices_say_what_they_are(tree: Path):
    import socket

    with socket.socket(socket.AF_UNIX) as sock:
        sock.bind(str(tree / "sock.txt"))
        result = invoke("sock.txt", "/dev/null", "/dev/zero", "a.txt", "--extractive", "-n", "20")
    assert result.exit_code == 1
    lines = error_lines(result.stderr)
    assert len(lines) == 3 and "a socket" in lines[0]
    assert all("character device" in line for line in lines[1:])


@pytest.mark.parametrize("codec", ["utf-16-le", "utf-16-be"])
@pytest.mark.parametrize("name", ["u.txt", "u.md", "u"])
def test_utf16_without_a_bom_is_text(tree: Path, codec: str, name: str):
    (tree / name).write_bytes(TEXT.encode(codec))
    result = invoke(name, "--extractive", "-n", "20")
    assert result.exit_code == 0, result.output
    assert "Bees" in result.stdout or "Rivers" in result.stdout


def test_links_that_lead_nowhere_say_so(tree: Path):
    os.symlink("loop-b", tree / "loop-a.txt")
    os.symlink("loop-a.txt", tree / "loop-b")
    os.symlink("gone/away.pdf", tree / "dangling.pdf")
    result = invoke("loop-a.txt", "dangling.pdf", "--extractive")
    lines = error_lines(result.stderr)
    assert "symbolic link loop" in lines[0]
    assert "gone/away.pdf" in lines[1] and "does not exist" in lines[1]


@pytest.mark.parametrize(("head", "kind"), [(b"\x89PNG\r\n\x1a\n" + bytes(40), "PNG image"),
                                            (b"\xff\xd8\xff\xe0" + bytes(40), "JPEG image"),
                                            (b"PK\x03\x04" + bytes(40), "ZIP archive")])
@pytest.mark.parametrize("name", ["report.pdf", "SCAN.PDF"])
def test_another_format_named_pdf_says_what_it_is(tree: Path, head: bytes, kind: str, name: str):
    (tree / name).write_bytes(head)
    result = invoke(name, "--extractive")
    (line,) = error_lines(result.stderr)
    assert kind in line and "not a PDF" in line


# --- 5. PDF extraction is bounded by work, per page and per document --------------------------


def _pdf_with_heavy_pages(pdf_factory, folder: Path, heavy: dict[int, int], shared: bool) -> bytes:
    """A PDF of five pages of text, where page i (1-based) in `heavy` draws that many bytes of text
    operators instead (flate-compressed: small on disk); `shared`: the heavy pages share one stream."""
    from pypdf import PdfWriter
    from pypdf.generic import DecodedStreamObject, NameObject

    texts = [f"Page {i} tells its story. " + _varied_text(12, seed=i) for i in range(1, 6)]
    writer = PdfWriter(clone_from=pdf_factory(folder / "plain.pdf", texts))
    made = {}
    for number, size in heavy.items():
        key = size if shared else number
        if key not in made:
            ops = b"BT /F1 1 Tf 1 0 0 1 10 10 Tm (a) Tj ET\n"
            stream = DecodedStreamObject()
            stream.set_data(ops * (size // len(ops) + 1))
            made[key] = writer._add_object(stream.flate_encode())
        writer.pages[number - 1][NameObject("/Contents")] = made[key]
    out = io.BytesIO()
    writer.write(out)
    return out.getvalue()


@pytest.mark.parametrize(("heavy", "shared"), [({2: 3 << 20}, False), ({1: 2 << 20, 4: 2 << 20}, True),
                                               ({5: 8 << 20}, False), ({2: 3 << 20, 3: 3 << 20, 4: 3 << 20}, True)])
def test_a_page_over_the_work_bound_is_skipped_and_named(tree: Path, pdf_factory, heavy, shared):
    from summarize.inputs.extract import extract_text

    (tree / "heavy.pdf").write_bytes(_pdf_with_heavy_pages(pdf_factory, tree, heavy, shared))
    notes: list[str] = []
    text = _within_seconds(60, lambda: extract_text(tree / "heavy.pdf", notify=notes.append))
    assert [int(note.split("page ")[1].split()[0]) for note in notes] == sorted(heavy)
    assert all("skipped" in note and "content" in note for note in notes)
    for page in set(range(1, 6)) - set(heavy):
        assert f"Page {page} tells" in text


def test_the_document_bound_skips_what_is_past_it(tree: Path, pdf_factory, monkeypatch):
    from summarize.inputs import extract

    monkeypatch.setattr(extract, "MAX_PAGE_CONTENT", 400_000)
    monkeypatch.setattr(extract, "MAX_DOCUMENT_CONTENT", 700_000)
    (tree / "many.pdf").write_bytes(_pdf_with_heavy_pages(pdf_factory, tree, {1: 300_000, 2: 300_000, 3: 300_000}, False))
    notes: list[str] = []
    text = extract.extract_text(tree / "many.pdf", notify=notes.append)
    assert len(notes) == 1 and "page 3 skipped" in notes[0] and "document" in notes[0]
    assert "Page 4 tells" in text and "Page 5 tells" in text


def _within_seconds(seconds: float, call):
    box: list = []
    thread = threading.Thread(target=lambda: box.append(call()), daemon=True)
    thread.start()
    thread.join(seconds)
    assert box, f"took over {seconds} s"
    return box[0]


# --- 8. furniture removal never empties a page that holds nothing else -----------------------


@pytest.mark.parametrize("template", ["Page {n}. Tiny fact {n}.", "Chapter {n}: the river bends here.",
                                      "{n}. Bees visit flowers in the morning.", "Notice {n} of the council."])
@pytest.mark.parametrize("pages", [2, 5, 12])
def test_pages_of_one_templated_line_keep_their_text(tree: Path, pdf_factory, template: str, pages: int):
    from summarize.inputs.extract import extract_text

    path = pdf_factory(tree / "t.pdf", [template.format(n=n) for n in range(1, pages + 1)])
    text = extract_text(path)
    for n in range(1, pages + 1):
        assert template.format(n=n).rstrip(".") in text


# --- 7. AES-encrypted PDFs read from the documented install ---------------------------------


@pytest.mark.parametrize("algorithm", ["AES-128", "AES-256", "AES-256-R5"])
@pytest.mark.parametrize("user_password", ["", "s3cret"], ids=["permission-only", "password"])
def test_aes_encrypted_pdfs_read_with_their_password(tree: Path, pdf_factory, algorithm: str, user_password: str):
    from pypdf import PdfWriter

    from summarize.inputs.extract import extract_text

    writer = PdfWriter(clone_from=pdf_factory(tree / "plain.pdf", [TEXT]))
    writer.encrypt(user_password=user_password, owner_password="owner-" + algorithm, algorithm=algorithm)
    writer.write(tree / "locked.pdf")
    assert "Bees visit flowers" in extract_text(tree / "locked.pdf", password=user_password or None)


def test_the_install_brings_what_reads_aes():
    import tomllib

    project = tomllib.loads((Path(__file__).parents[1] / "pyproject.toml").read_text())
    pypdf = [dep for dep in project["project"]["dependencies"] if dep.startswith("pypdf")]
    assert pypdf and "crypto" in pypdf[0].split(">")[0]  # pypdf's extra that brings cryptography


# --- 12. the word cap holds for every script -----------------------------------------------------

UNSPACED = {
    "thai": "ภาษาไทยเป็นภาษาที่ไม่มีการเว้นวรรคระหว่างคำ" * 500,
    "khmer": "ភាសាខ្មែរមិនដកឃ្លារវាងពាក្យទេ" * 500,
    "emoji": "😀🐝🌊👍🏽👨‍👩‍👧" * 3000,
    "one-word": "a" * 2_000_000,
    "decomposed": "e\u0301" * 50_000,
}


@pytest.mark.parametrize("words", [3, 20, 150])
@pytest.mark.parametrize("text", UNSPACED.values(), ids=UNSPACED.keys())
def test_text_without_spaces_comes_back_within_the_cap(text: str, words: int):
    import unicodedata

    from summarize.summarizers.extractive import MAX_CHARS_PER_WORD, ExtractiveSummarizer

    summary = ExtractiveSummarizer(Settings(words=words, extractive=True)).summarize(text, name="x")
    assert len(summary.text) <= words * MAX_CHARS_PER_WORD
    assert summary.text.rstrip("…") and text.startswith(summary.text.rstrip("…"))
    end = summary.text.rstrip("…")
    assert not (len(end) < len(text) and unicodedata.combining(text[len(end)]))


@pytest.mark.parametrize("name", ["diag.jsonl", "sub/d.json", "x"])
def test_diagnostics_with_an_extractive_summary_says_nothing_is_written(tree: Path, name: str):
    (tree / "sub").mkdir(exist_ok=True)
    result = invoke("a.txt", "--extractive", "-n", "20", "--diagnostics-file", name)
    assert result.exit_code == 0, result.output
    assert "--diagnostics-file" in result.stderr and "nothing is written" in result.stderr
    assert not (tree / name).exists()


def test_help_is_grouped_and_flags_show_no_type():
    result = invoke("--help", env={"COLUMNS": "80"})
    panels = [line for line in result.stdout.splitlines() if line.startswith("╭─ ")]
    assert len(panels) >= 6
    for flag in ("--extractive", "--json", "--force", "--no-cache", "--quiet"):
        (line,) = [line for line in result.stdout.splitlines() if f"{flag} " in line][:1]
        assert "<bool>" not in line
