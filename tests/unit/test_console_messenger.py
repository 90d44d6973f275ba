"""The console messenger: messages printed, status messages redrawn in place, files saved or shown."""

from __future__ import annotations

import io
from pathlib import Path

from rich.console import Console
from rich.text import Text

from chat.message import Content, FileUpload, Place
from chat.console.messenger import ConsoleMessenger, print_unbroken, renderable_for
from chat.console.render import ConsoleRenderer

PLACE = Place(platform="cli", workspace="local", channel="terminal", thread="run-1")


def make_console(*, terminal: bool) -> tuple[Console, io.StringIO]:
    output = io.StringIO()
    return Console(file=output, width=80, force_terminal=terminal, color_system=None), output


def status(text: str) -> Content:
    return Content(text=text, extra={"live": True})


async def test_post_prints_the_text_literally_and_returns_a_reference_to_it() -> None:
    console, output = make_console(terminal=False)
    messenger = ConsoleMessenger(console)
    ref = await messenger.post(PLACE, Content(text="Report with [bold]markup[/] <!channel>"))
    assert "Report with [bold]markup[/] <!channel>" in output.getvalue()
    assert (ref.platform, ref.channel, ref.thread) == ("cli", "terminal", "run-1")
    assert messenger.messages[ref.message_id].text.startswith("Report with")


async def test_each_post_gets_its_own_reference() -> None:
    messenger = ConsoleMessenger(make_console(terminal=False)[0])
    first = await messenger.post(PLACE, Content(text="one"))
    second = await messenger.post(PLACE, Content(text="two"))
    assert first.message_id != second.message_id


async def test_status_edits_leave_only_the_last_state_on_a_non_terminal() -> None:
    console, output = make_console(terminal=False)
    messenger = ConsoleMessenger(console)
    ref = await messenger.post(PLACE, status("status: searching"))
    await messenger.edit(ref, status("status: reading"))
    await messenger.post(PLACE, Content(text="the report"))
    await messenger.edit(ref, status("status: done"))
    messenger.close()
    printed = output.getvalue()
    assert "searching" not in printed and "reading" not in printed
    assert printed.index("the report") < printed.index("status: done")
    assert printed.count("status: done") == 1


async def test_status_edits_redraw_in_place_on_a_terminal() -> None:
    console, output = make_console(terminal=True)
    async with ConsoleMessenger(console) as messenger:
        ref = await messenger.post(PLACE, status("status: searching"))
        drawn_before_edit = len(output.getvalue())
        await messenger.edit(ref, status("status: reading"))
        redraw = output.getvalue()[drawn_before_edit:]
    assert "status: reading" in redraw
    assert "\x1b[2K" in redraw, "the previous frame is erased before the new one is drawn"


async def test_messages_posted_while_a_status_is_live_appear_above_it() -> None:
    console, output = make_console(terminal=True)
    async with ConsoleMessenger(console) as messenger:
        await messenger.post(PLACE, status("status: running"))
        await messenger.post(PLACE, Content(text="a notice"))
    printed = output.getvalue()
    assert printed.rindex("a notice") < printed.rindex("status: running")


async def test_editing_a_printed_message_prints_its_new_version() -> None:
    console, output = make_console(terminal=False)
    messenger = ConsoleMessenger(console)
    ref = await messenger.post(PLACE, Content(text="first version"))
    await messenger.edit(ref, Content(text="second version"))
    printed = output.getvalue()
    assert printed.index("first version") < printed.index("second version")


async def test_a_rich_renderable_in_extra_is_drawn_instead_of_the_text() -> None:
    console, output = make_console(terminal=False)
    messenger = ConsoleMessenger(console)
    await messenger.post(PLACE, Content(text="fallback", extra={"rich": Text("drawn by rich")}))
    assert "drawn by rich" in output.getvalue() and "fallback" not in output.getvalue()


async def test_markdown_content_is_rendered_as_markdown() -> None:
    console, output = make_console(terminal=False)
    messenger = ConsoleMessenger(console)
    await messenger.post(PLACE, Content(text="# Title\n\n**bold** words", extra={"format": "markdown"}))
    printed = output.getvalue()
    assert "Title" in printed and "bold words" in printed and "**" not in printed


async def test_upload_saves_the_file_and_says_where(tmp_path: Path) -> None:
    console, output = make_console(terminal=False)
    messenger = ConsoleMessenger(console, save_directory=tmp_path / "reports")
    await messenger.upload(PLACE, FileUpload(filename="../report.md", data=b"# Full report\n", title="Full report"))
    saved = tmp_path / "reports" / "report.md"
    assert saved.read_bytes() == b"# Full report\n"
    assert str(saved) in output.getvalue()


async def test_a_saved_path_wider_than_the_console_is_printed_whole_on_one_line(tmp_path: Path) -> None:
    console, output = make_console(terminal=False)
    directory = tmp_path / ("long-directory-name-" * 6) / "reports"
    messenger = ConsoleMessenger(console, save_directory=directory)
    await messenger.upload(PLACE, FileUpload(filename="report.md", data=b"# Full report\n", title="Full report"))
    saved = directory / "report.md"
    assert len(str(saved)) > console.width
    [line] = [line for line in output.getvalue().splitlines() if "saved to" in line]
    assert line.endswith(f"saved to {saved}")


async def test_a_file_name_wider_than_the_console_is_shown_whole() -> None:
    console, output = make_console(terminal=False)
    name = "a-report-with-a-very-long-name-" * 4 + ".txt"
    await ConsoleMessenger(console).upload(PLACE, FileUpload(filename=name, data=b"the text\n"))
    assert len(name) > console.width
    assert f"📎 {name}" in output.getvalue().splitlines()


async def test_upload_without_a_directory_prints_the_whole_file() -> None:
    console, output = make_console(terminal=False)
    messenger = ConsoleMessenger(console)
    await messenger.upload(PLACE, FileUpload(filename="notes.txt", data="line one\nline two\n".encode()))
    printed = output.getvalue()
    assert "notes.txt" in printed and "line one" in printed and "line two" in printed


def test_a_notice_naming_a_long_path_keeps_the_path_whole() -> None:
    console, output = make_console(terminal=False)
    log = "/var/lib/deepthread/" + "logs-of-the-worker/" * 5 + "worker.log"
    notice = ConsoleRenderer().reply(f"The worker is not answering yet: its log is {log}.")
    print_unbroken(console, renderable_for(notice))
    assert f"its log is {log}." in output.getvalue()
