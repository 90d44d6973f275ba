"""Hostile bodies built in memory: a PDF whose content stream inflates far beyond its size, and a huge HTML table."""

from __future__ import annotations

import zlib
from functools import cache

PAGE_TEXT = "bomb text bomb text"
_MIB = 1024 * 1024


def flate_pdf(inflated_bytes: int) -> bytes:
    """A one-page PDF whose FlateDecode content stream inflates to about `inflated_bytes` of text operators
    showing `PAGE_TEXT` (compressed a mebibyte at a time, so a huge bomb costs the test little memory)."""
    operators = f"BT /F1 12 Tf 72 712 Td ({PAGE_TEXT}) Tj ET\n".encode()
    chunk = operators * max(1, min(inflated_bytes, _MIB) // len(operators))
    compressor = zlib.compressobj(9)
    stream = b"".join(compressor.compress(chunk) for _ in range(max(1, inflated_bytes // len(chunk)))) + compressor.flush()
    objects = [
        b"<< /Type /Catalog /Pages 2 0 R >>",
        b"<< /Type /Pages /Kids [3 0 R] /Count 1 >>",
        b"<< /Type /Page /Parent 2 0 R /MediaBox [0 0 612 792] /Contents 4 0 R /Resources << /Font << /F1 5 0 R >> >> >>",
        b"<< /Length %d /Filter /FlateDecode >>\nstream\n" % len(stream) + stream + b"\nendstream",
        b"<< /Type /Font /Subtype /Type1 /BaseFont /Helvetica >>",
    ]
    document = bytearray(b"%PDF-1.4\n")
    offsets = []
    for number, body in enumerate(objects, start=1):
        offsets.append(len(document))
        document += b"%d 0 obj\n" % number + body + b"\nendobj\n"
    cross_reference = len(document)
    document += b"xref\n0 %d\n0000000000 65535 f \n" % (len(objects) + 1)
    document += b"".join(b"%010d 00000 n \n" % offset for offset in offsets)
    document += b"trailer\n<< /Size %d /Root 1 0 R >>\nstartxref\n%d\n%%%%EOF\n" % (len(objects) + 1, cross_reference)
    return bytes(document)


@cache
def pdf_bomb(inflated_bytes: int) -> bytes:
    """`flate_pdf`, built once per size (a 200 MiB bomb takes a while to compress)."""
    return flate_pdf(inflated_bytes)


@cache
def table_page(decoded_bytes: int) -> bytes:
    """An HTML page that is one table of ten cells a row, `decoded_bytes` long."""
    row = "<tr>" + "<td>cell</td>" * 10 + "</tr>\n"
    return ("<html><body><table>" + row * (decoded_bytes // len(row)) + "</table></body></html>").encode()
