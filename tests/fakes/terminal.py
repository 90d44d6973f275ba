"""Enough of a terminal to read what rich leaves on screen after its live redraws (line feeds, erase line, cursor up)."""

from __future__ import annotations

import re

_CONTROL = re.compile(r"(\x1b\[[0-9;?]*[A-Za-z]|\n)")
_CURSOR_UP = re.compile(r"\x1b\[(\d*)A")


def screen_left_by(output: str) -> str:
    """The words a terminal shows after `output`, in order, one space apart (wrapping and colours ignored)."""
    lines, row = [""], 0
    for token in _CONTROL.split(output):
        if token == "\n":
            row += 1
            if row == len(lines):
                lines.append("")
        elif token == "\x1b[2K":
            lines[row] = ""
        elif (up := _CURSOR_UP.fullmatch(token)) is not None:
            row = max(0, row - int(up.group(1) or 1))
        elif not token.startswith("\x1b"):
            lines[row] += token.replace("\r", "")
    return " ".join(" ".join(lines).split())
