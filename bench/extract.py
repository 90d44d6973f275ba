"""Extraction speed over the real test pages (tests/data/pages) and the real PDF, on one core.

Run: `.venv/bin/python bench/extract.py [--rounds N]`. Prints a table per page, the speed of plain
`trafilatura.extract` on the same pages for comparison, and ends with one `key=value` line.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import trafilatura

from research.extract import extract_document

DATA = Path(__file__).resolve().parent.parent / "tests" / "data"


def _load_pages() -> list[tuple[str, str, bytes]]:
    """(file name, URL, body) of every test page listed in expected.json."""
    expected = json.loads((DATA / "pages" / "expected.json").read_text(encoding="utf-8"))
    return [(name, entry["url"], (DATA / "pages" / name).read_bytes()) for name, entry in sorted(expected.items())]


def _seconds_per_round(function: object, rounds: int) -> float:
    """The fastest of `rounds` timings of a no-argument callable."""
    timings = []
    for _ in range(rounds):
        started = time.perf_counter()
        function()  # type: ignore[operator]
        timings.append(time.perf_counter() - started)
    return min(timings)


def main() -> None:
    """Time extraction of each page, then of all pages, and print the figures."""
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--rounds", type=int, default=5, help="timed rounds; the fastest counts")
    arguments = parser.parse_args()
    pages = _load_pages()
    # Warm-up: first calls load trafilatura's and htmldate's lazy state.
    for _, url, body in pages:
        extract_document(url, body, "text/html")

    print(f"{'page':40} {'KB':>7} {'ms':>8} {'chars out':>10}")
    for name, url, body in pages:
        seconds = _seconds_per_round(lambda: extract_document(url, body, "text/html"), arguments.rounds)
        document = extract_document(url, body, "text/html")
        print(f"{name:40} {len(body) / 1024:7.1f} {seconds * 1000:8.1f} {len(document.text) if document else 0:10}")

    total_bytes = sum(len(body) for _, _, body in pages)
    ours = _seconds_per_round(lambda: [extract_document(url, body, "text/html") for _, url, body in pages], arguments.rounds)
    plain = _seconds_per_round(lambda: [trafilatura.extract(body) for _, _, body in pages], arguments.rounds)
    pdf = (DATA / "pdf" / "debian-faq.pdf").read_bytes()
    pdf_seconds = _seconds_per_round(lambda: extract_document("https://example.org/faq.pdf", pdf, "application/pdf"), arguments.rounds)
    pdf_pages = 50  # the default page cap; the file has 73 pages

    pages_per_second = len(pages) / ours
    megabytes_per_second = total_bytes / ours / 1_000_000
    print()
    print(f"HTML: {len(pages)} pages, {total_bytes / 1_000_000:.2f} MB in {ours:.3f} s (fastest of {arguments.rounds} rounds)")
    print(f"plain trafilatura.extract on the same pages: {len(pages) / plain:.1f} pages/s, {total_bytes / plain / 1_000_000:.2f} MB/s")
    print(f"PDF: {pdf_pages} pages ({len(pdf) / 1_000_000:.2f} MB file) in {pdf_seconds:.3f} s: {pdf_pages / pdf_seconds:.0f} PDF pages/s")
    print(
        f"pages={len(pages)} pages_per_s={pages_per_second:.1f} mb_per_s={megabytes_per_second:.2f} "
        f"plain_trafilatura_pages_per_s={len(pages) / plain:.1f} pdf_pages_per_s={pdf_pages / pdf_seconds:.0f}"
    )


if __name__ == "__main__":
    main()
