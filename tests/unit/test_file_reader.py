"""Reading a shared file as a source: each type read by its bytes whatever its name, PDF pages located, and every
refusal (other types, bombs, damaged, locked and scanned files) naming the file."""

from __future__ import annotations

import hashlib
import io
import pickle
import subprocess
import sys
import time
import tracemalloc
import zipfile
from pathlib import Path

import pypdf
import pypdfium2
import pytest

from research.extract import DEFAULT_MAX_TEXT_CHARACTERS
from research.file_reader import DEFAULT_MAX_CHARACTERS, MAX_ZIP_ENTRIES, read_file_source
from research.files import FileDocument, FileRefused
from tests.fakes.bombs import pdf_bomb
from tests.fakes.shared_files import (
    WORD_CONTENT_TYPES,
    lying_word_zip,
    pdf_of_pages,
    word_document,
    word_zip_bomb,
    zip_of,
)
from tests.fakes.web import article_html, minimal_pdf

FAQ_PDF = Path(__file__).resolve().parent.parent / "data" / "pdf" / "debian-faq.pdf"
MIB = 1024 * 1024
PNG = b"\x89PNG\r\n\x1a\n\x00\x00\x00\rIHDR\x00\x00\x00\x10\x00\x00\x00\x10\x08\x06\x00\x00\x00\x1f\xf3\xffa"
FRENCH = ("Le château se dresse au-dessus de la rivière. À l'intérieur, les pièces sont décorées de fresques "
          "élégantes et de meubles anciens; le côté nord donne sur un jardin où l'on cultive des légumes.")
REPORT_BLOCKS: list[str | list[list[str]]] = [
    "Quarterly findings",
    "Revenue grew in every region we sell in.",
    [["Region", "Growth"], ["North", "12%"], ["South", "9%"]],
    "The south grew least, held back by supply.",
]


def read(name: str, data: bytes, **options: int) -> FileDocument:
    return read_file_source(name, data, max_pdf_pages=options.pop("max_pdf_pages", 10), **options)


def refusal(name: str, data: bytes, **options: int) -> str:
    """What a person reads about a refused file."""
    with pytest.raises(FileRefused) as refused:
        read(name, data, **options)
    assert refused.value.name == name
    return refused.value.plain_reason


def test_pdf_pages_locate_each_passage_and_a_page_without_text_keeps_its_place() -> None:
    data = pdf_of_pages([["Apples ripen in autumn."], [], ["Cherries ripen in early summer."]])

    document = read("fruit.pdf", data)

    assert document.kind == "pdf"
    assert document.text == "Apples ripen in autumn.\n\nCherries ripen in early summer."
    assert document.page_of(document.text.index("Apples")) == 1
    assert document.page_of(document.text.index("Cherries")) == 3
    assert document.page_of(document.text.index("summer")) == 3


def test_only_the_first_pages_of_a_pdf_are_read() -> None:
    data = pdf_of_pages([["Page one words."], ["Page two words."], ["Page three words."]])

    document = read("three.pdf", data, max_pdf_pages=2)

    assert document.text == "Page one words.\n\nPage two words."
    assert document.page_starts == [0, len("Page one words.\n\n")]


def test_a_real_pdf_maps_its_lines_to_the_pages_pdfium_finds_them_on() -> None:
    data = FAQ_PDF.read_bytes()
    pdfium = pypdfium2.PdfDocument(data)
    raw_pages = [pdfium[index].get_textpage().get_text_bounded() for index in range(10)]
    pdfium.close()

    document = read("debian-faq.pdf", data, max_pdf_pages=10)

    assert document.title == "The Debian GNU/Linux FAQ"
    assert len(document.page_starts) == 10 and document.page_starts == sorted(document.page_starts)
    assert raw_pages[7] == "" and document.page_starts[7] == document.page_starts[8]  # page 8 is blank
    for page in (1, 2, 7, 9, 10):
        # pdfium marks a word hyphenated across lines with \x02, which the reader joins up again.
        longest_line = max((line for line in raw_pages[page - 1].splitlines() if "\x02" not in line), key=len)
        assert document.page_of(document.text.index(" ".join(longest_line.split()))) == page


def test_a_word_document_reads_its_heading_paragraphs_and_table_rows_in_order_with_its_title() -> None:
    data = word_document(REPORT_BLOCKS, title="Q3 report", heading_levels={"Quarterly findings": 1})

    document = read("report.docx", data)

    assert document.kind == "docx"
    assert document.title == "Q3 report"
    assert document.text == (
        "Quarterly findings\n"
        "Revenue grew in every region we sell in.\n"
        "Region | Growth\nNorth | 12%\nSouth | 9%\n"
        "The south grew least, held back by supply."
    )
    assert document.page_starts == [] and document.page_of(0) is None


def test_a_merged_table_cell_is_read_once_a_row() -> None:
    import docx

    word = docx.Document()
    table = word.add_table(rows=2, cols=3)
    table.cell(0, 0).merge(table.cell(0, 2)).text = "Spanning heading"
    for cell, text in zip(table.rows[1].cells, ["a", "b", "c"], strict=True):
        cell.text = text
    output = io.BytesIO()
    word.save(output)

    assert read("merged.docx", output.getvalue()).text == "Spanning heading\na | b | c"


def test_markdown_is_kept_as_written_but_for_heading_markers_even_when_it_begins_with_a_tag() -> None:
    data = b"<p align=\"center\">A logo</p>\r\n\r\n# Setup\r\n\r\n    pip install thing\r\nwrapped line\r\nof prose\r\n"

    document = read("README.md", data)

    assert document.kind == "markdown"
    assert document.text == '<p align="center">A logo</p>\n\nSetup\n\n    pip install thing\nwrapped line\nof prose'


@pytest.mark.parametrize(("name", "data", "text"), [
    ("notes.txt", "Ünïcode notes\nsecond line".encode(), "Ünïcode notes\nsecond line"),
    ("NOTES", b"no extension at all", "no extension at all"),
    ("windows.txt", "Bericht über Köln\r\nZeile zwei".encode("utf-16"), "Bericht über Köln\nZeile zwei"),
    ("latin.txt", FRENCH.encode("cp1252"), FRENCH),
    ("report.pdf", b"A text file someone named .pdf", "A text file someone named .pdf"),
])
def test_text_is_read_as_text_whatever_its_name_or_encoding(name: str, data: bytes, text: str) -> None:
    document = read(name, data)

    assert document.kind == "text"
    assert document.text == text


def test_html_is_read_by_its_signature_as_a_page_is() -> None:
    page = article_html("Tide tables", ["High tide reaches the harbour wall twice a day, about twelve hours apart."] * 3)

    document = read("saved.txt", page.encode())

    assert document.kind == "html"
    assert document.title is not None and document.title.startswith("Tide tables")
    assert "High tide reaches the harbour wall" in document.text
    assert "cookies" not in document.text


def test_a_csv_is_read_a_row_a_line_with_its_delimiter_found() -> None:
    data = b'city;note;population\r\nOslo;"cold\r\nand dark";700000\r\n;;\r\nLima;mild;10000000\r\n'

    document = read("cities.csv", data)

    assert document.kind == "csv"
    assert document.text == "city;note;population\nOslo;cold and dark;700000\nLima;mild;10000000"


def test_a_csv_stops_at_the_last_row_within_the_character_cap() -> None:
    data = b"".join(b"row %d,value %d\n" % (number, number) for number in range(1000))

    document = read("rows.csv", data, max_characters=100)

    assert document.text.splitlines() == [f"row {number},value {number}" for number in range(7)]


def test_text_is_capped_at_the_character_cap() -> None:
    document = read("long.txt", b"word " * 10_000, max_characters=1000)

    assert 900 < len(document.text) <= 1000


@pytest.mark.parametrize(("name", "data", "kind"), [
    ("notes.txt", minimal_pdf(["A PDF named as text."]), "pdf"),
    ("scan.docx", minimal_pdf(["A PDF named as a Word document."]), "pdf"),
    ("minutes.pdf", word_document(["A Word document named as a PDF."]), "docx"),
])
def test_type_is_judged_by_content_not_by_name(name: str, data: bytes, kind: str) -> None:
    document = read(name, data)

    assert document.kind == kind
    assert document.text.startswith("A ")


def test_size_and_digest_are_of_the_bytes_shared() -> None:
    data = b"Some notes."

    document = read("notes.txt", data)

    assert (document.size, document.sha256) == (len(data), hashlib.sha256(data).hexdigest())


TYPE_REFUSED = "its type is not one deepthread reads (PDF, Word, Markdown, HTML, text or CSV)."


@pytest.mark.parametrize(("name", "data", "reason"), [
    ("diagram.png", PNG, TYPE_REFUSED),
    ("archive.tar.gz", b"\x1f\x8b\x08\x00\x00\x00\x00\x00\x00\x03" + bytes(200), TYPE_REFUSED),
    ("binary.txt", bytes(range(256)) * 8, TYPE_REFUSED),
    ("photos.docx", zip_of({"photo.jpg": b"\xff\xd8\xff\xe0 not really"}),
     "it is a ZIP archive, not a Word document (deepthread reads PDF, Word, Markdown, HTML, text or CSV)."),
    ("broken.docx", b"PK\x03\x04 the rest of a ZIP went missing",
     "it could not be read as a Word document (it may be damaged)."),
    ("hollow.docx", zip_of({"[Content_Types].xml": WORD_CONTENT_TYPES, "word/document.xml": b"<not a document"}),
     "it could not be read as a Word document (it may be damaged)."),
    ("scan.pdf", pdf_of_pages([[], []]),
     "it has no text layer (a scanned PDF?); deepthread cannot read images."),
    ("broken.pdf", b"%PDF-1.4\n% the rest went missing\n", "it could not be read as a PDF (it may be damaged)."),
    ("empty.txt", b"", "it has no readable text."),
    ("blank.md", b" \r\n\t\n", "it has no readable text."),
    ("bare.html", b"<!doctype html><html><body><script>go()</script></body></html>", "it has no readable text."),
    ("blank.docx", word_document(["", ""]), "it has no readable text."),
])
def test_refusals_name_the_file_and_say_why(name: str, data: bytes, reason: str) -> None:
    assert refusal(name, data) == f"{name} was not used: {reason}"


def test_a_pdf_behind_a_password_is_refused_as_locked() -> None:
    writer = pypdf.PdfWriter(clone_from=io.BytesIO(minimal_pdf(["Secret plans."])))
    writer.encrypt("correct horse", algorithm="AES-128")
    locked = io.BytesIO()
    writer.write(locked)

    assert refusal("plans.pdf", locked.getvalue()) == "plans.pdf was not used: it is protected by a password."


def test_a_pdf_bomb_is_refused_before_its_page_is_parsed() -> None:
    started = time.monotonic()

    reason = refusal("bomb.pdf", pdf_bomb(32 * MIB))

    assert reason == ("bomb.pdf was not used: a page of it inflates to more than 16 MB, more than deepthread reads "
                      "(a PDF bomb?).")
    assert time.monotonic() - started < 5


def refusal_and_peak_memory(name: str, data: bytes) -> tuple[str, int]:
    """The refusal of `data`, and the most memory Python allocated while reading it."""
    tracemalloc.start()
    try:
        reason = refusal(name, data)
        return reason, tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()


def test_a_zip_bomb_named_docx_is_refused_by_its_declared_size_before_anything_inflates() -> None:
    reason, peak = refusal_and_peak_memory("plans.docx", word_zip_bomb(300 * MIB))

    assert reason == "plans.docx was not used: it unpacks to more than 64 MB, more than deepthread reads (a ZIP bomb?)."
    assert peak < 4 * MIB


def test_a_zip_bomb_within_the_size_cap_is_refused_by_its_compression_ratio() -> None:
    reason = refusal("dense.docx", word_zip_bomb(40 * MIB, level=9))

    assert reason == "dense.docx was not used: it is compressed far more than a Word document can be (a ZIP bomb?)."


def test_a_zip_whose_entries_inflate_past_the_cap_is_refused_while_inflating() -> None:
    # Sizes within every declared check, the entries together past a lowered cap.
    data = zip_of({"[Content_Types].xml": WORD_CONTENT_TYPES, "word/document.xml": b"<w/>" * MIB,
                   "word/media/one.bin": bytes(2 * MIB)})

    reason = refusal("big.docx", data, max_inflated_bytes=5 * MIB)

    assert reason == "big.docx was not used: it unpacks to more than 5 MB, more than deepthread reads (a ZIP bomb?)."


def test_a_zip_that_lies_about_its_sizes_is_never_inflated_whole() -> None:
    # zipfile would inflate the whole 200 MiB stream before cutting it at the declared 1000 bytes.
    reason, peak = refusal_and_peak_memory("liar.docx", lying_word_zip(200 * MIB))

    assert reason == "liar.docx was not used: it could not be read as a Word document (it may be damaged)."
    assert peak < 16 * MIB


def test_a_zip_of_too_many_entries_is_refused() -> None:
    entries = {f"word/part{number}.xml": b"" for number in range(MAX_ZIP_ENTRIES)}
    data = zip_of({"[Content_Types].xml": WORD_CONTENT_TYPES, "word/document.xml": b"", **entries})

    assert refusal("parts.docx", data) == ("parts.docx was not used: it holds more than 2,000 parts, far more than a "
                                           "Word document has.")


def test_a_refusal_crosses_a_process_boundary_with_its_name_and_reason() -> None:
    crossed = pickle.loads(pickle.dumps(FileRefused("plans.docx", "it has no readable text")))

    assert (crossed.name, crossed.plain_reason) == ("plans.docx", "plans.docx was not used: it has no readable text.")


def test_the_reader_module_loads_no_readers_where_it_is_only_imported() -> None:
    probe = "import sys, research.file_reader; print(sorted({'research.extract', 'docx', 'pypdf'} & set(sys.modules)))"

    imported = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True).stdout

    assert imported.strip() == "[]"


def test_the_default_character_cap_is_the_extractors() -> None:
    assert DEFAULT_MAX_CHARACTERS == DEFAULT_MAX_TEXT_CHARACTERS


def test_a_word_document_is_a_zip_of_the_entries_the_reader_looks_for() -> None:
    # The Word check is by entry names: python-docx's own documents must pass it.
    with zipfile.ZipFile(io.BytesIO(word_document(["x"]))) as archive:
        names = set(archive.namelist())

    assert {"word/document.xml", "[Content_Types].xml"} <= names


def test_markdown_headings_lose_their_markers_and_a_long_line_reads_at_once() -> None:
    document = read("notes.md", b"# Field notes\n\n## Costs ##\nText with a #hashtag.\n# a #b\n")
    assert document.text == "Field notes\n\nCosts\nText with a #hashtag.\na #b"
    started = time.perf_counter()
    read("spaces.md", b"# a" + b" " * 40_000 + b"x")
    # A heading pattern with a lazy group before optional ones took 26 s here; a hang guard, not a timing bound.
    assert time.perf_counter() - started < 5


def test_a_text_of_many_empty_comments_is_sniffed_at_once() -> None:
    started = time.perf_counter()
    document = read("comments.txt", b"<!---->" * 40 + b"x")
    assert document.kind == "text"
    # The comment pattern backtracked exponentially (2 s at 22 comments, doubling with each); a hang guard.
    assert time.perf_counter() - started < 5


def test_a_word_document_whose_parts_are_not_deflated_is_refused_before_they_inflate() -> None:
    output = io.BytesIO()
    with zipfile.ZipFile(output, "w", zipfile.ZIP_BZIP2) as archive:
        archive.writestr("[Content_Types].xml", b"<Types/>")
        archive.writestr("word/document.xml", b"0" * 1000)
    with pytest.raises(FileRefused) as refused:
        read("bzip.docx", output.getvalue())
    assert refused.value.name == "bzip.docx"
