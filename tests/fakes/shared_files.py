"""Files a person might share, built in memory: Word documents, PDFs of several pages, and ZIP bombs named `.docx`."""

from __future__ import annotations

import io
import struct
import zipfile
import zlib
from collections.abc import Sequence
from functools import cache

import docx
import pypdf

from tests.fakes.web import minimal_pdf

_MIB = 1024 * 1024
# What makes a ZIP pass for a Word document to a reader that looks at its entry names.
WORD_CONTENT_TYPES = (
    b'<?xml version="1.0" encoding="UTF-8" standalone="yes"?>'
    b'<Types xmlns="http://schemas.openxmlformats.org/package/2006/content-types"/>'
)


def word_document(
    blocks: Sequence[str | list[list[str]]], *, title: str | None = None, heading_levels: dict[str, int] | None = None,
) -> bytes:
    """A .docx made by python-docx: each block a paragraph (a heading when `heading_levels` names its level) or a
    table given as rows of cell texts."""
    document = docx.Document()
    for block in blocks:
        if isinstance(block, str):
            level = (heading_levels or {}).get(block)
            if level is None:
                document.add_paragraph(block)
            else:
                document.add_heading(block, level=level)
        else:
            table = document.add_table(rows=len(block), cols=max(len(row) for row in block))
            for row, texts in zip(table.rows, block, strict=True):
                for cell, text in zip(row.cells, texts, strict=False):
                    cell.text = text
    if title is not None:
        document.core_properties.title = title
    output = io.BytesIO()
    document.save(output)
    return output.getvalue()


def pdf_of_pages(pages: Sequence[Sequence[str]]) -> bytes:
    """A PDF whose pages hold these lines (a page of no lines has no text), one `minimal_pdf` a page."""
    writer = pypdf.PdfWriter()
    for lines in pages:
        writer.append(io.BytesIO(minimal_pdf(lines)))
    output = io.BytesIO()
    writer.write(output)
    return output.getvalue()


def zip_of(entries: dict[str, bytes]) -> bytes:
    """A deflated ZIP holding these entries."""
    output = io.BytesIO()
    with zipfile.ZipFile(output, "w", zipfile.ZIP_DEFLATED) as archive:
        for name, content in entries.items():
            archive.writestr(name, content)
    return output.getvalue()


@cache
def word_zip_bomb(inflated_bytes: int, level: int = 1) -> bytes:
    """A ZIP named like a Word document whose `word/document.xml` honestly declares `inflated_bytes` of zeros,
    compressed a mebibyte at a time (level 1 compresses zeros about 230 times, level 9 about 1,000 times)."""
    output = io.BytesIO()
    with zipfile.ZipFile(output, "w", zipfile.ZIP_DEFLATED, compresslevel=level) as archive:
        archive.writestr("[Content_Types].xml", WORD_CONTENT_TYPES)
        with archive.open("word/document.xml", "w", force_zip64=True) as entry:
            for _ in range(inflated_bytes // _MIB):
                entry.write(bytes(_MIB))
    return output.getvalue()


@cache
def lying_word_zip(inflated_bytes: int, declared_bytes: int = 1000) -> bytes:
    """A Word document of python-docx's whose `word/document.xml` declares `declared_bytes` (with their CRC) but whose
    deflate stream goes on to `inflated_bytes` of zeros: a bomb only inflating can find, which a reader that takes
    the ZIP's word for its sizes inflates whole."""
    compressor = zlib.compressobj(1, zlib.DEFLATED, -zlib.MAX_WBITS)
    stream = b"".join(compressor.compress(bytes(_MIB)) for _ in range(inflated_bytes // _MIB)) + compressor.flush()
    with zipfile.ZipFile(io.BytesIO(word_document(["A real paragraph."]))) as real:
        entries = [(info.filename, real.read(info)) for info in real.infolist()]
    output = bytearray()
    central = bytearray()
    for name, content in entries:
        if name == "word/document.xml":
            data, method, crc, size = stream, zipfile.ZIP_DEFLATED, zlib.crc32(bytes(declared_bytes)), declared_bytes
        else:
            data, method, crc, size = content, zipfile.ZIP_STORED, zlib.crc32(content), len(content)
        encoded = name.encode()
        central += struct.pack("<IHHHHHHIIIHHHHHII", 0x02014B50, 20, 20, 0, method, 0, 0, crc, len(data), size,
                               len(encoded), 0, 0, 0, 0, 0, len(output)) + encoded
        output += struct.pack("<IHHHHHIIIHH", 0x04034B50, 20, 0, method, 0, 0, crc, len(data), size,
                              len(encoded), 0) + encoded + data
    central_at = len(output)
    output += central + struct.pack("<IHHHHIIH", 0x06054B50, 0, 0, len(entries), len(entries), len(central),
                                    central_at, 0)
    return bytes(output)


def survey_pdf() -> bytes:
    """The two-page survey the end-to-end tests share: its second page holds the figure a report cites."""
    return pdf_of_pages([["The Zorblax survey opens with its method and its divers."],
                         ["On page two the Zorblax survey counts 17 turbines in the strait of Orm."]])


def proposal_docx() -> bytes:
    """The vendor's proposal the end-to-end tests share, as a Word document with a heading."""
    return word_document(["Vendor proposal", "The vendor proposal offers 12 Zorblax turbines at a fixed price."],
                         heading_levels={"Vendor proposal": 1})
