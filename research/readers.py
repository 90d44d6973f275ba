"""What the CPU pool runs to read a page, importable without the readers themselves.

trafilatura, lxml, justext and the rest take about a third of a second to import. The process that
reads pages (a CPU pool's) imports them; the process that only hands pages over (the run's) need
not, so these stand-ins import `research.extract` where they run. `preload` imports what a run needs
later (the readers when it reads in-process, the ranker's libraries, the Markdown parser that first reads the
model's answer, the citation audit) in a thread, while it waits.
"""

from __future__ import annotations

import importlib
import threading
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from research.models import Document

# Imported in the background as a run begins: the ranker's libraries, markdown-it-py (`research.markdown.PARSERS` is
# built on first use) and the citation audit, and the readers when the run reads in its own process (no CPU pool: a
# pool's processes have their own).
PRELOADED_MODULES = ("bm25s", "numpy", "markdown_it", "research.phases.verify")
READER_MODULES = ("research.extract",)

_preloading = threading.Lock()
_preload_asked: set[str] = set()


def extract_document(url: str, body: bytes, content_type: str | None, **options: Any) -> Document | None:
    """`research.extract.extract_document`, imported in the process that runs it."""
    from research.extract import extract_document as extract

    return extract(url, body, content_type, **options)


def load_readers() -> None:
    """Nothing, but the process that runs it has imported the readers (`SupervisedPool.warm(load_readers)`)."""
    importlib.import_module("research.extract")


def preload(*, reads_here: bool) -> None:
    """Import what a run needs later in a thread of their own, once per process: a run starts it as it begins, so
    the imports happen while the run waits for its model and its searches, not when it first ranks or reads."""
    modules = PRELOADED_MODULES + (READER_MODULES if reads_here else ())
    with _preloading:
        new = [name for name in modules if name not in _preload_asked]
        _preload_asked.update(new)
    if new:
        threading.Thread(target=_import_modules, args=(new,), name="deepthread-preload", daemon=True).start()


def _import_modules(names: list[str]) -> None:
    for name in names:
        importlib.import_module(name)
