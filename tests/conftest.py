"""Shared fixtures: PDFs generated into tmp_path (fpdf2 + pypdf), good and bad.

    pdf_factory(path, pages, *, password=None, font=None) -> Path   a text PDF, one string a page
    encrypted_pdf      -> Path   user password PDF_PASSWORD ("secret"); also the fixture pdf_password
    image_only_pdf     -> Path   two pages of pictures of text, no text layer (a "scanned" PDF)
    truncated_pdf      -> Path   the first half of the bytes of a valid three-page PDF
"""

from __future__ import annotations

import io
from collections.abc import Callable, Sequence
from pathlib import Path

import pytest

PDF_PASSWORD = "secret"
OWNER_PASSWORD = "owner-only"  # lets the empty user password open a "protected" PDF

PROSE = (
    "Long documents are read one chunk at a time. Each chunk starts from the state the shared "
    "instruction left behind, so the model reads every part of the document afresh.",
    "A recurrent model keeps a fixed-size state per layer, which is why memory stays flat "
    "however long the document grows. The summary of each chunk is merged at the end.",
    "Nothing here needs a network connection: the model, the tokenizer and the text all live "
    "on the local disk, and the summary is written to standard output.",
)

PdfFactory = Callable[..., Path]


def _text_pdf(pages: Sequence[str], font: str | Path | None) -> bytes:
    from fpdf import FPDF

    pdf = FPDF(format="A4", unit="mm")
    if font is not None:  # a Unicode TrueType font, e.g. for ligature characters
        pdf.add_font("body", "", str(font))
        family = "body"
    else:
        family = "Helvetica"
    for text in pages:
        pdf.add_page()
        pdf.set_font(family, size=11)
        for paragraph in text.split("\n\n"):
            pdf.multi_cell(0, 5.5, paragraph)
            pdf.ln(3)  # a paragraph gap, as word processors leave one
    return bytes(pdf.output())


def _encrypt(data: bytes, password: str) -> bytes:
    from pypdf import PdfReader, PdfWriter

    writer = PdfWriter(clone_from=PdfReader(io.BytesIO(data)))
    # RC4-128, pypdf's default, needs no crypto library, unlike AES.
    writer.encrypt(user_password=password, owner_password=OWNER_PASSWORD)
    out = io.BytesIO()
    writer.write(out)
    return out.getvalue()


@pytest.fixture
def pdf_factory() -> PdfFactory:
    """Return make(path, pages, *, password=None, font=None) -> path.

    Each string of `pages` becomes one page; blank lines in it separate paragraphs. With a
    `password` the PDF is encrypted with it as the user password ("" gives a PDF that is
    encrypted but opens without one). `font` is the path of a TrueType font for non-Latin-1 text.
    """

    def make(
        path: Path, pages: Sequence[str], *, password: str | None = None, font: str | Path | None = None
    ) -> Path:
        data = _text_pdf(pages, font)
        if password is not None:
            data = _encrypt(data, password)
        path = Path(path)
        path.write_bytes(data)
        return path

    return make


@pytest.fixture
def pdf_password() -> str:
    return PDF_PASSWORD


@pytest.fixture
def encrypted_pdf(tmp_path: Path, pdf_factory: PdfFactory) -> Path:
    return pdf_factory(tmp_path / "encrypted.pdf", PROSE, password=PDF_PASSWORD)


@pytest.fixture
def truncated_pdf(tmp_path: Path, pdf_factory: PdfFactory) -> Path:
    whole = pdf_factory(tmp_path / "whole.pdf", PROSE).read_bytes()
    path = tmp_path / "truncated.pdf"
    path.write_bytes(whole[: len(whole) // 2])
    (tmp_path / "whole.pdf").unlink()  # leave only the broken file, e.g. for folder inputs
    return path


@pytest.fixture
def image_only_pdf(tmp_path: Path) -> Path:
    from fpdf import FPDF
    from PIL import Image, ImageDraw

    pdf = FPDF(format="A4", unit="mm")
    for page in range(2):
        picture = Image.new("L", (600, 300), color=255)
        draw = ImageDraw.Draw(picture)
        for row in range(8):  # grey bars standing in for scanned lines of text
            draw.rectangle((20, 20 + 34 * row, 560 - 40 * ((row + page) % 3), 36 + 34 * row), fill=60)
        pdf.add_page()
        pdf.image(picture, x=20, y=20, w=170)
    path = tmp_path / "scanned.pdf"
    pdf.output(str(path))
    return path


@pytest.fixture(scope="session", autouse=True)
def _offline_and_portable():
    """For the whole session, module-scoped fixtures included (they run before any test's own): no
    model hub (a hub id resolves from the local cache or not at all), and loading times no kernels,
    so every test sees the portable policy whatever this machine is (tests/test_calibration.py
    turns timing on for its own tests)."""
    with pytest.MonkeyPatch.context() as session:
        session.setenv("HF_HUB_OFFLINE", "1")
        session.setenv("SUMMARIZE_CALIBRATE", "0")
        yield


@pytest.fixture(autouse=True)
def read_cache_dir(monkeypatch, tmp_path_factory) -> Path:
    """Each test keeps what its models read in a folder of its own, never in the user's cache
    (a subprocess given a fresh environment must pass SUMMARIZE_CACHE_DIR on)."""
    folder = tmp_path_factory.mktemp("read-cache")
    monkeypatch.setenv("SUMMARIZE_CACHE_DIR", str(folder))
    return folder


@pytest.fixture
def run_cli():
    """Return run(*args, input=None, env=None) -> click's Result: the typer app run in this
    process on `args`, with `input` as stdin and `env` added to the environment; stdout and stderr
    apart (result.stdout, result.stderr; result.output has both), exceptions caught (result.exception)."""
    from typer.testing import CliRunner

    from summarize import cli

    def run(*args: str, input: str | bytes | None = None, env: dict | None = None):
        return CliRunner().invoke(cli.app, list(args), input=input, env=env)

    return run


@pytest.fixture(scope="module")
def one_torch_thread():
    """torch on one thread for a module's tests (tiny models gain nothing from more, and threads
    waiting on a busy machine slow them), restored after."""
    import torch

    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)
