"""Shared files read in a real, memory-limited process pool: each bomb is refused by name, and the good file beside it
is still read.

`read_file_source` refuses the bombs itself, before they inflate. Were a file to get past its checks, the pool's
limits would stop it instead, and the task would end in a `CpuTaskError` (the process killed or out of memory) rather
than a `FileRefused`: the caller reports that file as refused too. The last test shows that backstop holding.
"""

from __future__ import annotations

import asyncio
import io
from collections.abc import Iterator

import pytest

from research.cpu import CpuTaskError, SupervisedPool, run_cpu
from research.file_reader import read_file_source
from research.files import FileDocument, FileRefused
from tests.fakes.bombs import pdf_bomb
from tests.fakes.shared_files import lying_word_zip, pdf_of_pages, word_document, word_zip_bomb

pytestmark = pytest.mark.integration

MIB = 1024 * 1024
MEMORY_LIMIT_BYTES = 512 * MIB
# Inflated whole, as a reader that believes the ZIP's declared sizes would, this needs more than the limit.
LIAR_BYTES = 600 * MIB
REPORT = word_document(["Findings", "Tidal power output rose by a third after the barrage opened."],
                       heading_levels={"Findings": 1})


def parse_with_python_docx(data: bytes) -> int:
    """Run in a pool child: open a .docx with python-docx directly, as a reader without the guard would."""
    import docx

    return len(docx.Document(io.BytesIO(data)).paragraphs)


@pytest.fixture
def pool() -> Iterator[SupervisedPool]:
    supervised = SupervisedPool(2, task_timeout_seconds=60.0, memory_limit_bytes=MEMORY_LIMIT_BYTES)
    yield supervised
    supervised.shutdown(wait=True)


async def _read(pool: SupervisedPool, name: str, data: bytes) -> FileDocument:
    return await run_cpu(read_file_source, name, data, max_pdf_pages=20, pool=pool)


async def test_bombs_are_refused_by_name_and_the_good_files_beside_them_are_read(pool: SupervisedPool) -> None:
    files = {
        "plans.docx": word_zip_bomb(300 * MIB),
        "liar.docx": lying_word_zip(LIAR_BYTES),
        "figures.pdf": pdf_bomb(200 * MIB),
        "report.docx": REPORT,
        "tides.pdf": pdf_of_pages([["Tidal range at the barrage is eight metres."], ["Output peaks at spring tides."]]),
    }

    results = await asyncio.gather(*(_read(pool, name, data) for name, data in files.items()), return_exceptions=True)
    outcomes = dict(zip(files, results, strict=True))

    for name in ("plans.docx", "liar.docx", "figures.pdf"):
        refused = outcomes[name]
        assert isinstance(refused, FileRefused), (name, refused)
        assert refused.plain_reason.startswith(f"{name} was not used: ")
    assert "unpacks to more than 64 MB" in str(outcomes["plans.docx"])
    assert "inflates to more than 16 MB" in str(outcomes["figures.pdf"])
    report, tides = outcomes["report.docx"], outcomes["tides.pdf"]
    assert isinstance(report, FileDocument) and report.text == (
        "Findings\nTidal power output rose by a third after the barrage opened.")
    assert isinstance(tides, FileDocument) and tides.page_of(tides.text.index("Output peaks")) == 2


async def test_a_file_read_after_the_bombs_in_the_same_process_is_read() -> None:
    single = SupervisedPool(1, task_timeout_seconds=60.0, memory_limit_bytes=MEMORY_LIMIT_BYTES)
    try:
        for name, bomb in (("plans.docx", word_zip_bomb(300 * MIB)), ("liar.docx", lying_word_zip(LIAR_BYTES)),
                           ("figures.pdf", pdf_bomb(200 * MIB))):
            with pytest.raises(FileRefused, match=f"^{name}: "):
                await _read(single, name, bomb)
        document = await _read(single, "report.docx", REPORT)
    finally:
        single.shutdown(wait=True)
    assert document.kind == "docx" and "Tidal power output" in document.text


async def test_without_the_readers_checks_the_pools_memory_limit_stops_the_lying_zip(pool: SupervisedPool) -> None:
    with pytest.raises((MemoryError, CpuTaskError)):
        await run_cpu(parse_with_python_docx, lying_word_zip(LIAR_BYTES), pool=pool)
    assert (await _read(pool, "report.docx", REPORT)).kind == "docx"
