"""Files shared in the conversation: downloaded and read from the moment the run starts, then sources like the web's.

Each file is downloaded by the platform's `FileDownloader` (its own file hosts only) and read in the CPU pool
(`research.file_reader.read_file_source`, with the pool's memory and time limits); it becomes a source `sN` whose
passages are ranked and cited with the pages'. A file that cannot be used is named in a warning and in the report's
notes, and the run goes on with the other sources.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Sequence
from concurrent.futures import Executor
from dataclasses import dataclass

from research.cpu import CpuTaskError, run_cpu
from research.files import (
    FILE_KIND_NAMES,
    FILE_PROVIDER,
    MIB,
    FileDocument,
    FileDownloader,
    FileRef,
    FileRefused,
    too_large,
)
from research.models import Document, DocumentKind, Passage, SearchResult
from research.report import ReportSource, SourceFile
from research.sources import SourceRegistry
from research.untrusted import defuse_injections

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class FileLimits:
    """The caps on shared files: bytes a file may have, PDF pages read, files one run reads."""

    max_bytes: int = 20 * MIB
    max_pdf_pages: int = 200
    max_files: int = 10


def read_file(ref: FileRef, data: bytes, limits: FileLimits) -> FileDocument:
    """`research.file_reader.read_file_source`, imported in the process that runs it (a CPU pool's)."""
    from research.file_reader import read_file_source

    return read_file_source(ref.name, data, max_pdf_pages=limits.max_pdf_pages)


class SharedFiles:
    """The run's shared files, each downloaded and read in a task of its own as soon as the run starts."""

    def __init__(self, refs: Sequence[FileRef], *, downloader: FileDownloader | None, limits: FileLimits,
                 cpu_pool: Executor | None) -> None:
        # The newest `max_files` (refs come oldest first); the run's inputs hold one more when there are older ones.
        self.refs = list(refs)[-limits.max_files:]
        self.skipped = len(refs) - len(self.refs)
        self._downloader = downloader
        self._limits = limits
        self._cpu_pool = cpu_pool
        self._tasks = [asyncio.create_task(self._read(ref), name=f"shared file {index}")
                       for index, ref in enumerate(self.refs, start=1)]

    async def _read(self, ref: FileRef) -> FileDocument | FileRefused:
        if self._downloader is None:
            return FileRefused(ref.name, "files cannot be read where this run works")
        if ref.size is not None and ref.size > self._limits.max_bytes:  # as the platform declared it: not fetched
            return too_large(ref.name, self._limits.max_bytes)
        try:
            data = await self._downloader.download(ref, max_bytes=self._limits.max_bytes)
            if len(data) > self._limits.max_bytes:
                raise too_large(ref.name, self._limits.max_bytes)
            return await run_cpu(read_file, ref, data, self._limits, pool=self._cpu_pool)
        except FileRefused as refused:
            return refused
        except CpuTaskError:
            # Killed past the pool's memory or time limit: a bomb, or a file too large to read here.
            return FileRefused(ref.name, "reading it took more memory or time than deepthread allows")
        except Exception as error:  # a reader's own error on a broken file: only this file is lost
            logger.warning("could not read a shared file: %s", type(error).__name__)
            return FileRefused(ref.name, "it could not be read")

    async def results(self, timeout: float | None = None) -> list[tuple[FileRef, FileDocument | FileRefused]]:
        """Each file with what it became, in the order they were shared; one not read within `timeout` seconds is
        refused as such (the run's gathering time is spent), and its download or reading stopped."""
        if self._tasks:
            await asyncio.wait(self._tasks, timeout=timeout)
        outcomes: list[tuple[FileRef, FileDocument | FileRefused]] = []
        for ref, task in zip(self.refs, self._tasks):
            if task.done() and not task.cancelled():
                outcomes.append((ref, task.result()))
            else:
                task.cancel()
                outcomes.append((ref, FileRefused(ref.name, "it could not be read within the run's time")))
        return outcomes

    def cancel(self) -> None:
        for task in self._tasks:
            task.cancel()


def defused(document: FileDocument) -> tuple[FileDocument, frozenset[str]]:
    """The file with its sentences addressed to an AI replaced by a marker (as a web page's are), page by page so
    that a PDF's page offsets still count in the text its passages are cut from; and those sentences' words."""
    if not document.page_starts:
        text, words = defuse_injections(document.text)
        return document.model_copy(update={"text": text}), words
    bounds = [*document.page_starts, len(document.text)]
    pages = [defuse_injections(document.text[start:end]) for start, end in zip(bounds, bounds[1:])]
    starts, offset = [], document.page_starts[0]
    for text, _words in pages:
        starts.append(offset)
        offset += len(text)
    cleaned = document.text[:document.page_starts[0]] + "".join(text for text, _words in pages)
    return (document.model_copy(update={"text": cleaned, "page_starts": starts}),
            frozenset().union(*(words for _text, words in pages)))


def file_source(ref: FileRef, document: FileDocument) -> SearchResult:
    """The search-result shape of a read file: its name as title, its link on its platform as URL."""
    return SearchResult(provider=FILE_PROVIDER, title=document.name, url=ref.link or "",
                        snippet=document.text[:300])


def register(registry: SourceRegistry, ref: FileRef, document: FileDocument) -> SearchResult:
    """Register a read file as a source of the run, under its platform id so that a file shared twice is one source."""
    return registry.add_file(file_source(ref, document), key=f"file:{ref.file_id}")


def as_document(document: FileDocument, url: str, *, checksum: str | None = None) -> Document:
    """The file's text as the passages are cut from it, with the checksum of the text as read (`text_checksum`)."""
    kind: DocumentKind = "pdf" if document.kind == "pdf" else "html" if document.kind == "html" else "text"
    return Document(url=url, kind=kind, text=document.text, title=document.title or document.name, checksum=checksum)


def with_pages(passages: list[Passage], files: dict[str, FileDocument]) -> list[Passage]:
    """`passages` with the page each PDF passage starts on."""
    return [passage.model_copy(update={"page": files[passage.source_id].page_of(passage.start)})
            if passage.source_id in files and files[passage.source_id].page_starts else passage
            for passage in passages]


def described(source: ReportSource, document: FileDocument, passages: dict[str, Passage]) -> ReportSource:
    """A report source that is a file: its kind, size and checksum, and the pages of the passages cited from it."""
    cited = [passage for passage_id in source.passages_used if (passage := passages.get(passage_id.lower())) is not None]
    pages = sorted({page for passage in cited for page in pages_of(passage, document)})
    return source.model_copy(update={
        "file": SourceFile(name=document.name, kind=document.kind, size=document.size, sha256=document.sha256),
        "pages": pages, "title": file_title(document.name, document.kind, pages),
    })


def pages_of(passage: Passage, document: FileDocument) -> list[int]:
    """The pages a passage runs over (from the file's page offsets, or the page it starts on as stored)."""
    first, last = document.page_of(passage.start), document.page_of(max(passage.start, passage.end - 1))
    if first is not None and last is not None:
        return list(range(first, last + 1))
    return [passage.page] if passage.page is not None else []


def file_title(name: str, kind: str, pages: Sequence[int]) -> str:
    """How a source list names a shared file: `field-notes.pdf (PDF, pp. 2, 5), shared file`."""
    where = f", p. {pages[0]}" if len(pages) == 1 else f", pp. {', '.join(map(str, pages))}" if pages else ""
    return f"{name} ({FILE_KIND_NAMES.get(kind, kind)}{where}, shared file)"
