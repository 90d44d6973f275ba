"""A shared file's text, read as a research source: its type judged by its bytes, its text extracted, refusals named.

`read_file_source` runs in the supervised CPU pool (`run_cpu(read_file_source, name, data, max_pdf_pages=…,
pool=pool)`): it is top-level, takes and returns picklable data, and imports its readers (`research.extract`,
python-docx) where it runs, so the process that only hands files over never loads them.

A file is hostile until read, like a fetched page. A Word document is a ZIP: its declared sizes, compression ratios
and entry count are checked before anything is inflated, and python-docx is then handed a copy of its entries
inflated under a budget (the declared sizes are the sender's word, and python-docx would inflate each entry whole).
A PDF's first pages are checked for content streams that inflate too far before pdfium parses them. The pool's memory
and time limits stand behind both: a task they stop ends in a `research.cpu.CpuTaskError` rather than a
`FileRefused`, and the caller reports that file as refused (it was too large or too slow to read).
"""

from __future__ import annotations

import codecs
import csv
import hashlib
import io
import re
import unicodedata
import zipfile
from collections.abc import Iterator
from typing import TYPE_CHECKING, NamedTuple

from research.files import FileDocument, FileKind, FileRefused

if TYPE_CHECKING:
    from docx.blkcntnr import BlockItemContainer
    from docx.document import Document as WordDocument
    from docx.table import Table

# `research.extract.DEFAULT_MAX_TEXT_CHARACTERS` (a test holds them equal): importing it here would load the readers
# in every process that hands files to the pool.
DEFAULT_MAX_CHARACTERS = 300_000
# What a Word document's entries may inflate to, together.
DEFAULT_MAX_INFLATED_BYTES = 64 * 1024 * 1024
# A Word document has a few dozen entries, a few hundred with many images.
MAX_ZIP_ENTRIES = 2_000
# Word's XML deflates about ten to one and images hardly at all; a large entry that deflates past this is a bomb.
MAX_COMPRESSION_RATIO = 200
_RATIO_CHECKED_FROM_BYTES = 4 * 1024 * 1024
_INFLATE_CHUNK_BYTES = 1024 * 1024
_MIB = 1024 * 1024

READ_KINDS = "PDF, Word, Markdown, HTML, text or CSV"
_MARKDOWN_SUFFIXES = frozenset({".md", ".markdown"})
_MARKDOWN_HEADING_MARKERS = re.compile(r"^ {0,3}#{1,6}[ \t]+", re.MULTILINE)
_CSV_DELIMITERS = {".csv": None, ".tsv": "\t"}  # None: sniffed from the first lines
_SNIFFED_DELIMITERS = ",;\t|"
_WORD_ENTRIES = frozenset({"word/document.xml", "[Content_Types].xml"})
_ZIP_SIGNATURES = (b"PK\x03\x04", b"PK\x05\x06")
# Text in UTF-16 or UTF-32 has NUL bytes, which the byte-level text check takes for a binary.
_WIDE_BOMS = (codecs.BOM_UTF16_LE, codecs.BOM_UTF16_BE, codecs.BOM_UTF32_BE)
# Control characters (but tab, line breaks and form feed) and the replacement character left by undecodable bytes.
_NOT_TEXT = re.compile(r"[\x00-\x08\x0e-\x1f\x7f\ufffd]")
_TEXT_SAMPLE_CHARACTERS = 65_536
# Only a file that begins as HTML is read as HTML: a Markdown or text file may hold tags further in.
# Comments matched without backtracking into each other (a lazy `.*?` inside a repeated group is exponential on
# `<!---->` repeated).
_HTML_PREAMBLE = r"\A\s*(?:<\?xml[^>]*>\s*)?(?>(?:<!--(?:(?!-->).)*-->\s*)*)"
_HTML_DOCUMENT_START = re.compile(_HTML_PREAMBLE + r"<(?:!doctype\s+html|html)[\s>]", re.IGNORECASE | re.DOTALL)
_HTML_FRAGMENT_START = re.compile(_HTML_PREAMBLE + r"<(?:head|body|title|meta|div|p)[\s>]", re.IGNORECASE | re.DOTALL)
_HTML_SNIFF_CHARACTERS = 4096
_LEADING_BLANK_LINES = re.compile(r"\A(?:[ \t]*\n)+")

_PDF_PROBLEMS = {
    "oversized": "a page of it inflates to more than {cap} MB, more than deepthread reads (a PDF bomb?)",
    "encrypted": "it is protected by a password",
    "unreadable": "it could not be read as a PDF (it may be damaged)",
}
_NO_TEXT_LAYER = "it has no text layer (a scanned PDF?); deepthread cannot read images"
_NO_TEXT = "it has no readable text"
_NOT_READ = f"its type is not one deepthread reads ({READ_KINDS})"
_NOT_WORD = f"it is a ZIP archive, not a Word document (deepthread reads {READ_KINDS})"
_DAMAGED_ZIP = "it could not be read as a Word document (it may be damaged)"
_TOO_LARGE = "it needs more memory to read than deepthread allows"


class _Read(NamedTuple):
    """What one reader made of a file, before the checks every file shares."""

    kind: FileKind
    text: str
    title: str | None = None
    page_starts: tuple[int, ...] = ()


def read_file_source(
    name: str,
    data: bytes,
    *,
    max_pdf_pages: int,
    max_characters: int = DEFAULT_MAX_CHARACTERS,
    max_inflated_bytes: int = DEFAULT_MAX_INFLATED_BYTES,
) -> FileDocument:
    """A shared file's text, its type judged by its bytes: a PDF (its first `max_pdf_pages` pages, with where each
    begins), a Word document, HTML, or text (Markdown or CSV by the name's extension); at most `max_characters`.

    Raises `FileRefused`, naming the file, for any other type, a bomb, a damaged or locked file, and a file without
    text. `max_inflated_bytes` is what a Word document's entries may inflate to.
    """
    try:
        read = _read(name, data, max_pdf_pages=max_pdf_pages, max_characters=max_characters,
                     max_inflated_bytes=max_inflated_bytes)
    except MemoryError:  # the pool's address-space limit, met by an allocation that could fail cleanly
        raise FileRefused(name, _TOO_LARGE) from None
    if not read.text:
        raise FileRefused(name, _NO_TEXT)
    return FileDocument(
        name=name, kind=read.kind, text=read.text, title=read.title, size=len(data),
        sha256=hashlib.sha256(data).hexdigest(), page_starts=list(read.page_starts),
    )


def _read(name: str, data: bytes, *, max_pdf_pages: int, max_characters: int, max_inflated_bytes: int) -> _Read:
    """The file read by the reader its leading bytes call for."""
    from research.extract import detect_body_kind, looks_like_text

    if not data or data.isspace():
        raise FileRefused(name, _NO_TEXT)
    if detect_body_kind(data, None) == "pdf":
        return _read_pdf(name, data, max_pages=max_pdf_pages, max_characters=max_characters)
    if data.startswith(_ZIP_SIGNATURES):
        return _read_word(name, data, max_characters=max_characters, max_inflated_bytes=max_inflated_bytes)
    if not data.startswith(_WIDE_BOMS) and not looks_like_text(data[:2048]):
        raise FileRefused(name, _NOT_READ)
    text = _decoded_text(name, data)
    suffix = _suffix(name)
    head = text[:_HTML_SNIFF_CHARACTERS]
    if _HTML_DOCUMENT_START.match(head) or (suffix not in _MARKDOWN_SUFFIXES and _HTML_FRAGMENT_START.match(head)):
        return _read_html(name, data, max_characters=max_characters)
    if suffix in _CSV_DELIMITERS:
        return _Read("csv", _csv_text(text, _CSV_DELIMITERS[suffix], max_characters))
    if suffix in _MARKDOWN_SUFFIXES:
        # A heading's markers are markup, not words a passage should quote: the heading stays as its own line.
        return _Read("markdown", _plain_text(_without_heading_markers(text), max_characters))
    return _Read("text", _plain_text(text, max_characters))


def _without_heading_markers(text: str) -> str:
    """Markdown with each ATX heading's `#` markers (leading, and closing ones) taken off its line."""
    lines = text.split("\n")
    for index, line in enumerate(lines):
        opened = _MARKDOWN_HEADING_MARKERS.match(line)
        if opened is None:
            continue
        heading = line[opened.end():].rstrip(" \t\r")
        closed = heading.rstrip("#")
        if closed != heading and (not closed or closed[-1] in " \t"):
            heading = closed.rstrip(" \t")
        lines[index] = heading + ("\r" if line.endswith("\r") else "")
    return "\n".join(lines)


def _suffix(name: str) -> str:
    """A file name's extension in lower case with its dot ("" for none)."""
    stem, dot, extension = name.rpartition(".")
    return f".{extension.lower()}" if dot and stem else ""


def _decoded_text(name: str, data: bytes) -> str:
    """The bytes as text (`research.extract.decode_body`), refused as of an unread type when they decode to mostly
    control characters or undecodable bytes."""
    from research.extract import decode_body

    text = decode_body(data)
    sample = text[:_TEXT_SAMPLE_CHARACTERS]
    if len(_NOT_TEXT.findall(sample)) > 0.01 * len(sample):
        raise FileRefused(name, _NOT_READ)
    return text


def _read_pdf(name: str, data: bytes, *, max_pages: int, max_characters: int) -> _Read:
    """A PDF's first pages joined by blank lines, with the offset at which each page begins."""
    from research.extract import DEFAULT_MAX_PDF_PAGE_CONTENT_BYTES, capped_text, read_pdf_pages

    cap = DEFAULT_MAX_PDF_PAGE_CONTENT_BYTES
    pages = read_pdf_pages(data, max_pages=max_pages, max_text_characters=max_characters, max_page_content_bytes=cap,
                           described_as="a shared PDF")
    if isinstance(pages, str):
        raise FileRefused(name, _PDF_PROBLEMS[pages].format(cap=cap // _MIB))
    parts: list[str] = []
    page_starts: list[int] = []
    length = 0
    for page in pages.texts:
        separator = 2 if parts else 0  # the blank line before a page's text
        page_starts.append(length + separator)  # a page without text begins where the next text does
        if page:
            parts.append(page)
            length += separator + len(page)
    text = capped_text("\n\n".join(parts), max_characters)
    if not text:
        raise FileRefused(name, _NO_TEXT_LAYER)
    return _Read("pdf", text, pages.title, tuple(start for start in page_starts if start < len(text)))


def _read_word(name: str, data: bytes, *, max_characters: int, max_inflated_bytes: int) -> _Read:
    """A Word document's paragraphs and table rows in document order, one a line, and its title."""
    import docx

    from research.extract import capped_text, clean_text

    inflated = _inflated_word_archive(name, data, max_inflated_bytes)
    try:
        document = docx.Document(io.BytesIO(inflated))
    except Exception:  # python-docx raises KeyError, ValueError and lxml's errors on damaged packages
        raise FileRefused(name, _DAMAGED_ZIP) from None
    lines: list[str] = []
    length = 0
    for line in _block_lines(document):
        if line.strip():
            lines.append(line)
            length += len(line) + 1
            if length > max_characters:
                break
    title = " ".join((document.core_properties.title or "").split()) or None
    return _Read("docx", capped_text(clean_text("\n".join(lines)), max_characters), title)


def _inflated_word_archive(name: str, data: bytes, max_inflated_bytes: int) -> bytes:
    """A Word document's ZIP again, its entries inflated and stored, once its declared sizes pass the checks and its
    entries inflate within `max_inflated_bytes`; refused otherwise.

    zipfile stops each entry at its declared size (a lie then fails its CRC), but it inflates a whole entry at once
    before cutting it there, so a lying entry read whole can still take gigabytes; read here in chunks, it cannot.
    """
    try:
        with zipfile.ZipFile(io.BytesIO(data)) as archive:
            entries = archive.infolist()
            _check_declared_entries(name, entries, max_inflated_bytes)
            inflated = io.BytesIO()
            budget = max_inflated_bytes
            with zipfile.ZipFile(inflated, "w", zipfile.ZIP_STORED) as repacked:
                # The last of entries of one name, as zipfile reads it.
                for entry in {entry.filename: entry for entry in entries if not entry.is_dir()}.values():
                    content = _inflated_entry(archive, entry, budget)
                    if content is None:
                        raise FileRefused(name, _inflates_past(max_inflated_bytes))
                    budget -= len(content)
                    repacked.writestr(entry.filename, content)
    except (FileRefused, MemoryError):
        raise
    except Exception:  # zipfile raises BadZipFile, RuntimeError (encrypted), NotImplementedError, zlib and OS errors
        raise FileRefused(name, _DAMAGED_ZIP) from None
    return inflated.getvalue()


def _check_declared_entries(name: str, entries: list[zipfile.ZipInfo], max_inflated_bytes: int) -> None:
    """Refuse a ZIP that is not a Word document, or whose entries declare a bomb: too many of them, too large
    together, or one compressed far past what documents compress to."""
    if len(entries) > MAX_ZIP_ENTRIES:
        raise FileRefused(name, f"it holds more than {MAX_ZIP_ENTRIES:,} parts, far more than a Word document has")
    if not _WORD_ENTRIES.issubset(entry.filename for entry in entries):
        raise FileRefused(name, _NOT_WORD)
    if sum(entry.file_size for entry in entries) > max_inflated_bytes:
        raise FileRefused(name, _inflates_past(max_inflated_bytes))
    for entry in entries:
        if entry.compress_type not in (zipfile.ZIP_STORED, zipfile.ZIP_DEFLATED):
            # Word writes deflate; bzip2 and LZMA entries inflate a whole read at once, past the chunked budget.
            raise FileRefused(name, _NOT_WORD)
        if (entry.file_size > _RATIO_CHECKED_FROM_BYTES
                and entry.file_size > MAX_COMPRESSION_RATIO * max(entry.compress_size, 1)):
            raise FileRefused(name, "it is compressed far more than a Word document can be (a ZIP bomb?)")


def _inflated_entry(archive: zipfile.ZipFile, entry: zipfile.ZipInfo, budget: int) -> bytes | None:
    """One entry's bytes, inflated a chunk at a time; None once they pass `budget`."""
    chunks: list[bytes] = []
    with archive.open(entry) as source:
        while chunk := source.read(_INFLATE_CHUNK_BYTES):
            budget -= len(chunk)
            if budget < 0:
                return None
            chunks.append(chunk)
    return b"".join(chunks)


def _inflates_past(max_inflated_bytes: int) -> str:
    """Why a ZIP whose entries inflate past the cap is refused."""
    return f"it unpacks to more than {max_inflated_bytes // _MIB} MB, more than deepthread reads (a ZIP bomb?)"


def _block_lines(container: WordDocument | BlockItemContainer) -> Iterator[str]:
    """The text of a document's (or a table cell's) paragraphs and table rows, in order, one a line."""
    from docx.text.paragraph import Paragraph

    for block in container.iter_inner_content():
        if isinstance(block, Paragraph):
            yield block.text
        else:
            yield from _table_lines(block)


def _table_lines(table: Table) -> Iterator[str]:
    """Each row of a table as one line, its cells' text joined by " | "; a merged cell is read once a row."""
    for row in table.rows:
        cells: list[str] = []
        previous = None
        for cell in row.cells:
            if cell is previous:  # python-docx repeats a cell for each grid column it spans
                continue
            previous = cell
            cells.append(" ".join(" ".join(_block_lines(cell)).split()))
        if any(cells):
            yield " | ".join(cells)


def _read_html(name: str, data: bytes, *, max_characters: int) -> _Read:
    """An HTML file's main text and title, read as a fetched page is."""
    from research.extract import extract_html

    document = extract_html("", data, max_text_characters=max_characters)
    if document is None:
        raise FileRefused(name, _NO_TEXT)
    return _Read("html", document.text, document.title)


def _plain_text(text: str, max_characters: int) -> str:
    """Text or Markdown as written (lines not unwrapped, indentation kept), in NFC with Unix line ends."""
    from research.extract import capped_text

    normalized = unicodedata.normalize("NFC", text.replace("\r\n", "\n").replace("\r", "\n"))
    return capped_text(_LEADING_BLANK_LINES.sub("", normalized).rstrip(), max_characters)


def _csv_text(text: str, delimiter: str | None, max_characters: int) -> str:
    """A CSV file's rows, one a line with its cells' whitespace collapsed (a cell's line breaks too), blank rows left
    out, up to the last row within `max_characters`; the text as written when it does not parse as CSV."""
    from research.extract import capped_text

    text = text.replace("\r\n", "\n").replace("\r", "\n")
    if delimiter is None:
        try:
            delimiter = csv.Sniffer().sniff(text[:8192], delimiters=_SNIFFED_DELIMITERS).delimiter
        except csv.Error:
            delimiter = ","
    row_text = io.StringIO()
    writer = csv.writer(row_text, delimiter=delimiter, lineterminator="")
    lines: list[str] = []
    length = 0
    try:
        for row in csv.reader(io.StringIO(text), delimiter=delimiter):
            cells = [" ".join(cell.split()) for cell in row]
            if not any(cells):
                continue
            writer.writerow(cells)
            line = row_text.getvalue()
            row_text.seek(0)
            row_text.truncate()
            if length + len(line) > max_characters:
                if not lines:  # one row longer than the cap: its beginning
                    lines.append(capped_text(line, max_characters))
                break
            lines.append(line)
            length += len(line) + 1
    except csv.Error:  # a field past csv's size limit, a NUL
        return _plain_text(text, max_characters)
    return unicodedata.normalize("NFC", "\n".join(lines))
