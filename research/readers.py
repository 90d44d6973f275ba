"""What the CPU pool runs to read a page, importable without the readers themselves.

trafilatura, lxml, justext and the rest take about a third of a second to import. The process that
reads pages (a CPU pool's) imports them; the process that only hands pages over (the run's) need
not, so these stand-ins import `research.extract` where they run. `preload` imports what a run needs
later (the readers when it reads in-process, the ranker's libraries) in a thread, while it waits.
"""

from __future__ import annotations

import importlib
import threading
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from research.models import Document

# Imported in the background as a run begins: the ranker's libraries, and the readers (for a run with no CPU pool).
LATER_MODULES = ("bm25s", "numpy", "research.extract")

_preloading = threading.Lock()
_preloaded = False


def extract_document(url: str, body: bytes, content_type: str | None, **options: Any) -> Document | None:
    """`research.extract.extract_document`, imported in the process that runs it."""
    from research.extract import extract_document as extract

    return extract(url, body, content_type, **options)


def load_readers() -> None:
    """Nothing, but the process that runs it has imported the readers (`SupervisedPool.warm(load_readers)`)."""
    importlib.import_module("research.extract")


def preload() -> None:
    """Import LATER_MODULES in a thread of their own, once per process: a run starts it as it begins, so the imports
    happen while the run waits for its model and its searches, not when it first reads or ranks."""
    global _preloaded
    with _preloading:
        if _preloaded:
            return
        _preloaded = True
    threading.Thread(target=_import_later_modules, name="deepthread-preload", daemon=True).start()


def _import_later_modules() -> None:
    for name in LATER_MODULES:
        importlib.import_module(name)
