"""Extraction speed over the real test pages (tests/data/pages) and the real PDF, on one core.

Run: `.venv/bin/python bench/extract.py [--rounds N] [--bombs]`. Times our extractor and plain
`trafilatura.extract` on the same pages in the same rounds, taking turns page by page, in CPU seconds
of this process (other work on the machine weighs on wall-clock times, and on both the same way);
prints a table per page with the word-level F1 of our text against plain trafilatura's, and ends with
two `key=value` lines, the speed ratio and the lowest F1 on the last. With `--bombs`, it first sends
a PDF bomb and a 20 MiB HTML table through the supervised CPU pool with the default limits and prints
what each cost (seconds, the pool child's peak resident memory).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import re
import resource
import statistics
import sys
import time
from collections import Counter
from collections.abc import Callable
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


def _seconds_per_round(function: Callable[[], object], rounds: int) -> float:
    """The fastest of `rounds` timings of a no-argument callable, in CPU seconds of this process."""
    timings = []
    for _ in range(rounds):
        started = time.process_time()
        function()
        timings.append(time.process_time() - started)
    return min(timings)


def _fastest_per_page_taking_turns(
    pages: list[tuple[str, str, bytes]], extractors: dict[str, Callable[[str, bytes], object]], rounds: int
) -> dict[str, list[float]]:
    """Each extractor's fastest CPU seconds on each page over `rounds` rounds, the extractors taking turns on every page.

    Taking turns page by page (and changing who goes first each round) puts both under the same load
    from other processes; the fastest of the rounds drops a page's timing that such a load inflated.
    """
    fastest = {name: [float("inf")] * len(pages) for name in extractors}
    for round_number in range(rounds):
        order = list(extractors.items()) if round_number % 2 == 0 else list(reversed(extractors.items()))
        for index, (_, url, body) in enumerate(pages):
            for name, extract in order:
                started = time.process_time()
                extract(url, body)
                fastest[name][index] = min(fastest[name][index], time.process_time() - started)
    return fastest


def word_f1(text: str, reference: str) -> float:
    """Word-level F1 of a text against a reference: the harmonic mean of the shares of each one's words found in the other, counted with multiplicity."""
    words, reference_words = Counter(re.findall(r"\w+", text)), Counter(re.findall(r"\w+", reference))
    if not words or not reference_words:
        return float(words == reference_words)
    common = sum((words & reference_words).values())
    if common == 0:
        return 0.0
    precision, recall = common / sum(words.values()), common / sum(reference_words.values())
    return 2 * precision * recall / (precision + recall)


def bomb_costs() -> str:
    """Send each content bomb through a fresh one-process pool with the default limits; the `key=value` figures."""
    from tests.fakes.bombs import pdf_bomb, table_page

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
    parser.add_argument("--rounds", type=int, default=9, help="timed rounds; the fastest counts")
    parser.add_argument("--bombs", action="store_true", help="also measure content bombs through the CPU pool")
    arguments = parser.parse_args()
    bomb_figures = bomb_costs() if arguments.bombs else ""
    pages = _load_pages()
    # Warm-up: first calls load trafilatura's and htmldate's lazy state.
    for _, url, body in pages:
        extract_document(url, body, "text/html")
        trafilatura.extract(body)

    fastest = _fastest_per_page_taking_turns(
        pages,
        {"ours": lambda url, body: extract_document(url, body, "text/html"), "plain": lambda url, body: trafilatura.extract(body)},
        arguments.rounds,
    )
    print(f"{'page':36} {'KB':>6} {'ours ms':>8} {'plain ms':>9} {'chars out':>10} {'F1 vs plain':>12}")
    f1_by_page = []
    for index, (name, url, body) in enumerate(pages):
        document = extract_document(url, body, "text/html")
        f1_by_page.append(word_f1(document.text if document else "", trafilatura.extract(body) or ""))
        print(f"{name:36} {len(body) / 1024:6.1f} {fastest['ours'][index] * 1000:8.1f} {fastest['plain'][index] * 1000:9.1f} "
              f"{len(document.text) if document else 0:10} {f1_by_page[-1]:12.4f}")

    total_bytes = sum(len(body) for _, _, body in pages)
    ours, plain = sum(fastest["ours"]), sum(fastest["plain"])
    pdf = (DATA / "pdf" / "debian-faq.pdf").read_bytes()
    pdf_seconds = _seconds_per_round(lambda: extract_document("https://example.org/faq.pdf", pdf, "application/pdf"), arguments.rounds)
    pdf_pages = 50  # the default page cap; the file has 73 pages

    pages_per_second, plain_pages_per_second = len(pages) / ours, len(pages) / plain
    megabytes_per_second = total_bytes / ours / 1_000_000
    print()
    print(f"HTML: {len(pages)} pages, {total_bytes / 1_000_000:.2f} MB in {ours:.3f} CPU s (each page's fastest of {arguments.rounds} rounds)")
    print(f"plain trafilatura.extract on the same pages, taking turns with ours: {plain:.3f} CPU s, {plain_pages_per_second:.1f} pages/s, "
          f"{total_bytes / plain / 1_000_000:.2f} MB/s")
    print(f"word-level F1 of our text against plain trafilatura's: lowest {min(f1_by_page):.4f}, mean {statistics.mean(f1_by_page):.4f}")
    print(f"PDF: {pdf_pages} pages ({len(pdf) / 1_000_000:.2f} MB file) in {pdf_seconds:.3f} s: {pdf_pages / pdf_seconds:.0f} PDF pages/s")
    print(
        f"pages={len(pages)} mb_per_s={megabytes_per_second:.2f} pdf_pages_per_s={pdf_pages / pdf_seconds:.0f} "
        f"f1_vs_plain_mean={statistics.mean(f1_by_page):.4f}"
        + (f" {bomb_figures}" if bomb_figures else "")
    )
    print(
        f"pages_per_s={pages_per_second:.1f} plain_trafilatura_pages_per_s={plain_pages_per_second:.1f} "
        f"speed_ratio={pages_per_second / plain_pages_per_second:.2f} f1_vs_plain={min(f1_by_page):.4f}"
    )


if __name__ == "__main__":
    main()
