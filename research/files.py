"""Files a person shared where deepthread was asked: what the engine knows of one, and how it becomes a source.

A file reaches a run as a `FileRef` (platform-neutral: the adapter that saw it fills it in). The run's
`FileDownloader` (the platform's: Slack's `files.info` and private download, Discord's CDN, the terminal's disk)
returns its bytes; `read_file_source` (in the CPU pool) sniffs its type by content, extracts its text and returns a
`FileDocument`, or raises `FileRefused` with a reason that names the file in plain words. The file's text is
untrusted data, like a web page's; the raw bytes are never stored.
"""

from __future__ import annotations

import asyncio
import bisect
from pathlib import Path
from typing import Literal, Protocol

from pydantic import BaseModel, Field

from research.errors import DeepthreadError

FileKind = Literal["pdf", "docx", "markdown", "html", "text", "csv"]

# What a person reads for each kind (source lists, exports).
FILE_KIND_NAMES: dict[str, str] = {
    "pdf": "PDF", "docx": "Word document", "markdown": "Markdown", "html": "HTML", "text": "text", "csv": "CSV",
}

MIB = 1024 * 1024
KIB = 1024

# The provider name a file source carries in the run's sources (a web source carries its search provider's).
FILE_PROVIDER = "file"


class FileRef(BaseModel):
    """A file shared in a conversation, as its platform describes it: enough to download it and to link back to it."""

    file_id: str  # the platform's id (Slack's F…, Discord's attachment id; the terminal's absolute path)
    name: str
    size: int | None = None  # as the platform declared it; the download checks again
    mimetype: str | None = None  # as declared; the type is judged by content
    url: str = ""  # where the bytes are (url_private_download, the CDN URL); empty where the downloader looks it up
    link: str | None = None  # where a person opens it on its platform (a permalink); None in the terminal
    shared_by: str | None = None  # platform-qualified user id
    workspace: str | None = None  # the run's workspace (Slack's team id): whose token the downloader uses


class FileRefused(DeepthreadError):
    """A file that cannot be used as a source; `plain_reason` names the file and says why."""

    def __init__(self, name: str, why: str) -> None:
        super().__init__(f"{name}: {why}")
        self.name = name
        self.why = why

    def __reduce__(self) -> tuple[type[FileRefused], tuple[str, str]]:
        """Built again from its name and reason: it is raised in the CPU pool's processes and crosses back by pickle,
        which would otherwise call `__init__` with the one joined message."""
        return type(self), (self.name, self.why)

    @property
    def plain_reason(self) -> str:
        return f"{self.name} was not used: {self.why}."


def size_words(size_bytes: int) -> str:
    """`size_bytes` as a person reads a limit: "20 MB", "1.5 MB", "512 KB", "300 bytes"."""
    if size_bytes >= MIB:
        return f"{size_bytes / MIB:.1f}".removesuffix(".0") + " MB"
    if size_bytes >= KIB:
        return f"{size_bytes / KIB:.0f} KB"
    return f"{size_bytes} bytes"


def too_large(name: str, max_bytes: int) -> FileRefused:
    """The refusal of a file over `max_bytes`."""
    return FileRefused(name, f"it is larger than the {size_words(max_bytes)} limit")


class FileDocument(BaseModel):
    """A file's text, read: what its passages are cut from, with what the source list and the export say of it."""

    name: str
    kind: FileKind
    text: str
    title: str | None = None
    size: int
    sha256: str
    # For a PDF: the offset in `text` where each page starts (page 1 at index 0); empty for other kinds.
    page_starts: list[int] = Field(default_factory=list)

    def page_of(self, offset: int) -> int | None:
        """The 1-based page that `offset` of `text` falls on; None for a file without pages."""
        if not self.page_starts:
            return None
        return max(1, bisect.bisect_right(self.page_starts, offset))


class FileDownloader(Protocol):
    """A platform's way to the bytes of a file shared on it, from its own file hosts only."""

    async def download(self, ref: FileRef, *, max_bytes: int) -> bytes:
        """The file's bytes; raises `FileRefused` (naming the file) when it cannot or may not be had."""
        ...


def local_file_ref(typed: str | Path, *, shared_by: str | None = None) -> FileRef | None:
    """A file on this machine as a shared file (its absolute path its id), or None when there is no such file."""
    path = Path(typed).expanduser().resolve()
    if not path.is_file():
        return None
    return FileRef(file_id=str(path), name=path.name, size=path.stat().st_size, shared_by=shared_by)


class LocalFiles:
    """The terminal's files: `ref.file_id` is a path on this machine, given by the person at the keyboard."""

    async def download(self, ref: FileRef, *, max_bytes: int) -> bytes:
        return await asyncio.to_thread(read_local_file, ref, max_bytes)


def read_local_file(ref: FileRef, max_bytes: int) -> bytes:
    """The bytes of the file at `ref.file_id`, refused past `max_bytes` (checked before it is read) or when it cannot
    be read."""
    path = Path(ref.file_id)
    try:
        if not path.is_file():
            raise FileRefused(ref.name, "there is no such file")
        if path.stat().st_size > max_bytes:
            raise too_large(ref.name, max_bytes)
        with path.open("rb") as opened:
            data = opened.read(max_bytes + 1)
    except OSError as error:
        raise FileRefused(ref.name, f"it could not be opened ({error.strerror or type(error).__name__})") from None
    if len(data) > max_bytes:
        raise too_large(ref.name, max_bytes)
    return data
