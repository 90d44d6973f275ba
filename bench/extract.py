"""Extraction speed over the real test pages (tests/data/pages) and the real PDF, on one core.

Run: `.venv/bin/python bench/extract.py [--rounds N] [--bombs]`. Prints a table per page, the speed of plain
`trafilatura.extract` on the same pages for comparison, and ends with one `key=value` line. With
`--bombs`, it first sends a PDF bomb and a 20 MiB HTML table through the supervised CPU pool with the
default limits and prints what each cost (seconds, the pool child's peak resident memory).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import resource
import sys
import time
from pathlib import Path

import trafilatura

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from research.cpu import CpuTaskError, cpu_pool, run_cpu  # noqa: E402
from research.extract import extract_document  # noqa: E402

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


def bomb_costs() -> str:
    """Send each content bomb through a fresh one-process pool with the default limits; the `key=value` figures."""
    from tests.integration.test_extraction_isolation import pdf_bomb, table_page

    bombs = {
        "pdf_bomb": (pdf_bomb(200 * 1024 * 1024), "application/pdf"),
        "html_table": (table_page(20 * 1024 * 1024), "text/html"),
    }
    figures = []
    for name, (body, content_type) in bombs.items():
        pool = cpu_pool(1)
        started = time.perf_counter()
        try:
            document = asyncio.run(run_cpu(extract_document, f"https://example.org/{name}", body, content_type, pool=pool))
            outcome = f"{len(document.text)} characters" if document else "no document"
        except (CpuTaskError, MemoryError) as error:
            outcome = type(error).__name__
        seconds = time.perf_counter() - started
        pool.shutdown(wait=True)
        # The pool's child has exited and been waited for, so its peak counts among this process's children.
        peak_mib = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / 1024
        print(f"{name}: {len(body) / 1024:.0f} KB sent, {outcome} in {seconds:.2f} s; children's peak so far {peak_mib:.0f} MiB")
        figures.append(f"{name}_s={seconds:.2f} {name}_children_peak_mib={peak_mib:.0f}")
    return " ".join(figures)


def main() -> None:
    """Time extraction of each page, then of all pages, and print the figures."""
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--rounds", type=int, default=5, help="timed rounds; the fastest counts")
    parser.add_argument("--bombs", action="store_true", help="also measure content bombs through the CPU pool")
    arguments = parser.parse_args()
    bomb_figures = bomb_costs() if arguments.bombs else ""
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
        + (f" {bomb_figures}" if bomb_figures else "")
    )


if __name__ == "__main__":
    main()
