"""The terminal as a chat platform: messages are printed, status messages are redrawn in place.

A message whose content has `extra["live"]` set (a run's status) is kept in a live region at the bottom of the
terminal (rich's `Live`) and redrawn on every edit; other messages are printed above it. On a console that is not a
terminal (a pipe, a file) the live region is drawn once, in its final state, when the messenger closes. The
content's `extra["rich"]` may carry a ready rich renderable; `extra["format"] == "markdown"` prints the text as
Markdown; otherwise the text is printed as it is, never read as rich markup. A line that names a path or an id is
printed whole (`print_unbroken`): rich would break it inside the name at the console's width.
"""

from __future__ import annotations

import itertools
from pathlib import Path
from types import TracebackType

from rich.console import Console, Group, RenderableType
from rich.live import Live
from rich.markdown import Markdown
from rich.rule import Rule
from rich.text import Text

from chat.message import Content, FileUpload, MessageRef, OpenedThread, Place, open_thread_under_title

LIVE = "live"
RICH = "rich"
FORMAT = "format"


def renderable_for(content: Content) -> RenderableType:
    """What the terminal shows for `content`: its rich renderable, its Markdown, or its plain text."""
    ready = content.extra.get(RICH)
    if ready is not None:
        return ready
    if content.extra.get(FORMAT) == "markdown":
        return Markdown(content.text)
    return Text(content.text)


def print_unbroken(console: Console, line: RenderableType) -> None:
    """Print a line that names a path or an id as one line, never wrapped or cropped: on a narrow terminal it runs past
    the edge, so the name stays whole (and copies whole)."""
    console.print(line, soft_wrap=True)


def file_heading(console: Console, name: str) -> None:
    """A rule titled with the file's name, or the name on a line of its own when a rule would cut it short."""
    title = Text(f"📎 {name}")
    # rich's Rule leaves 4 columns for its ends and cuts a longer title with an ellipsis.
    if title.cell_len + 4 <= console.width:
        console.print(Rule(title))
        return
    print_unbroken(console, title)
    console.print(Rule())


class ConsoleMessenger:
    """Posts to a rich Console; status messages (marked live) are redrawn in place until `close()`."""

    platform = "cli"

    def __init__(self, console: Console | None = None, *, save_directory: Path | None = None) -> None:
        self.console = console or Console()
        self.save_directory = save_directory
        self.messages: dict[str, Content] = {}
        self._live_ids: list[str] = []
        self._live: Live | None = None
        self._ids = itertools.count(1)

    async def post(self, place: Place, content: Content) -> MessageRef:
        """Print `content` (or show it in the live region when it is a status message); never raises."""
        message_id = str(next(self._ids))
        self.messages[message_id] = content
        if content.extra.get(LIVE):
            self._live_ids.append(message_id)
            self._redraw()
        else:
            self.console.print(renderable_for(content))
        return MessageRef(platform=place.platform, workspace=place.workspace, channel=place.channel,
                          message_id=message_id, thread=place.thread)

    async def edit(self, ref: MessageRef, content: Content) -> None:
        """Redraw a live message in place; a printed message cannot be unprinted, so its new version is printed."""
        self.messages[ref.message_id] = content
        if ref.message_id in self._live_ids:
            self._redraw()
        else:
            self.console.print(renderable_for(content))

    async def withdraw(self, ref: MessageRef) -> None:
        """Take a live message off the screen (a draft that its final version replaces); printed messages stay."""
        if ref.message_id in self._live_ids:
            self._live_ids.remove(ref.message_id)
            self._redraw()

    async def open_thread(self, place: Place, *, title: Content, status: Content) -> OpenedThread:
        """The title in the channel, the status message in its thread."""
        return await open_thread_under_title(self, place, title=title, status=status)

    async def upload(self, place: Place, upload: FileUpload) -> MessageRef | None:
        """Save the file under `save_directory` and say where, or print its text when there is no directory."""
        title = upload.title or upload.filename
        if self.save_directory is not None:
            self.save_directory.mkdir(parents=True, exist_ok=True)
            path = self.save_directory / Path(upload.filename).name
            path.write_bytes(upload.data)
            print_unbroken(self.console, Text(f"📎 {title}: {len(upload.data):,} bytes saved to {path}"))
        else:
            file_heading(self.console, upload.filename)
            text = upload.data.decode("utf-8", errors="replace")
            self.console.print(Markdown(text) if upload.filename.endswith(".md") else Text(text))
            self.console.print(Rule())
        if upload.comment:
            self.console.print(Text(upload.comment))
        return None

    def close(self) -> None:
        """Stop redrawing; the live messages stay on screen in their last state."""
        if self._live is not None:
            self._live.stop()
            self._live = None
            if not self.console.is_terminal:
                # rich ends a live region's last drawing with a newline on terminals only; what follows needs a line.
                self.console.line()
        # What was live stays on screen as last drawn; later messages get a live region of their own.
        self._live_ids.clear()

    async def __aenter__(self) -> "ConsoleMessenger":
        return self

    async def __aexit__(self, kind: type[BaseException] | None, error: BaseException | None,
                        trace: TracebackType | None) -> None:
        self.close()

    def _redraw(self) -> None:
        region = Group(*(renderable_for(self.messages[message_id]) for message_id in self._live_ids))
        if self._live is None:
            # Redraws happen on edits only: no refresh thread, and stdout/stderr are left alone.
            self._live = Live(region, console=self.console, auto_refresh=False, transient=False,
                              redirect_stdout=False, redirect_stderr=False)
            self._live.start(refresh=True)
        else:
            self._live.update(region, refresh=True)
