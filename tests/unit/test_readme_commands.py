"""Every `deepthread …` command line in README.md works as written, run the way README says after set-up.

README says that after `scripts/run` (or `scripts/test`) made `.venv`, `source .venv/bin/activate` puts `deepthread` on
PATH. Each command it shows, in a code block or in inline code, is run that way as written with `--help` added: Click
reads every word before it prints the help, so an unknown subcommand or option fails (exit 2) and nothing runs. The
options README names on their own beside a command, in the same paragraph or list item (`--dry-run` after
`deepthread prune …`), must be among those that command's help lists.
"""

from __future__ import annotations

import os
import re
import shlex
import subprocess
from dataclasses import dataclass, field
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
README = ROOT / "README.md"
ACTIVATE = "source .venv/bin/activate"
INLINE_CODE = re.compile(r"`([^`\n]+)`")
DEEPTHREAD = re.compile(r"deepthread\s+[-\w]")  # a command, not the user `deepthread` nor "every `deepthread …`"


@dataclass
class Command:
    """One `deepthread …` line of README, and the options README names for it nearby (`--dry-run`, `--format md`)."""

    text: str
    line: int
    options: list[str] = field(default_factory=list)

    def argv(self) -> list[str]:
        """The words after `deepthread`, a choice (`md|html|json`) read as its first, and `--help` last."""
        words = [word.split("|")[0] for word in shlex.split(self.text, comments=True)[1:]]
        return words if "--help" in words else [*words, "--help"]

    def option_names(self) -> list[str]:
        return [option.split()[0] for option in self.options]

    def __str__(self) -> str:
        return f"README.md:{self.line}: {self.text}" + (f" (and {', '.join(self.options)})" if self.options else "")


def prose_blocks(lines: list[tuple[int, str]]) -> list[list[tuple[int, str]]]:
    """Paragraphs and list items: a blank line or a new item (`- `, `1. `) starts a new block."""
    blocks: list[list[tuple[int, str]]] = [[]]
    for number, line in lines:
        if not line.strip() or re.match(r"\s*(- |\d+\. )", line):
            blocks.append([])
        if line.strip():
            blocks[-1].append((number, line))
    return [block for block in blocks if block]


def readme_commands(text: str) -> list[Command]:
    """Every `deepthread …` command of a README: whole lines of its code blocks, and inline code in its prose."""
    commands: list[Command] = []
    prose: list[tuple[int, str]] = []
    in_code = False
    for number, line in enumerate(text.splitlines(), 1):
        if line.lstrip().startswith("```"):
            in_code = not in_code
            prose.append((number, ""))
        elif in_code:
            command = line.strip().removeprefix("$ ")
            if DEEPTHREAD.match(command):
                commands.append(Command(command, number))
        else:
            prose.append((number, line))
    for block in prose_blocks(prose):
        current: Command | None = None
        for number, line in block:
            for span in INLINE_CODE.findall(line):
                if DEEPTHREAD.match(span):
                    current = Command(span, number)
                    commands.append(current)
                elif span.startswith("-") and current is not None:
                    current.options.append(span)
                elif " " in span:  # another program's command line (`docker compose up`, `/plan …`): options after
                    current = None  # it are its own
    return commands


def distinct(commands: list[Command]) -> list[Command]:
    """Each command once (README names `deepthread migrate` four times), at its first line."""
    seen: dict[tuple[str, tuple[str, ...]], Command] = {}
    for command in commands:
        seen.setdefault((command.text, tuple(command.options)), command)
    return list(seen.values())


COMMANDS = distinct(readme_commands(README.read_text()))


def test_readme_says_how_to_put_deepthread_on_path_after_set_up() -> None:
    text = README.read_text()
    assert ACTIVATE in text
    # The set-up it follows is the README's first command, and it makes the virtual environment there.
    assert "scripts/run" in text.split(ACTIVATE)[0]
    assert ".venv" in (ROOT / "scripts" / "setup").read_text()


def test_the_readme_parser_finds_commands_where_the_readme_writes_them() -> None:
    """A guard on the parser, so that the test below cannot pass by finding nothing."""
    sample = "\n".join([
        "Run `deepthread prune --older-than 90d` (`12h`, `90d`); `--dry-run` only counts.",
        "",
        "- `docker compose up --scale worker=3` and `--if-configured`",
        "- `deepthread discord` (`--sync` also syncs)",
        "```sh",
        "deepthread worker   # a comment",
        "docker run image deepthread worker",
        "```",
    ])
    found = sorted((command.line, command.argv(), command.option_names()) for command in readme_commands(sample))
    assert found == [(1, ["prune", "--older-than", "90d", "--help"], ["--dry-run"]),
                     (4, ["discord", "--help"], ["--sync"]),
                     (6, ["worker", "--help"], [])]
    assert len(COMMANDS) >= 15


def venv_or_skip() -> None:
    if not (ROOT / ".venv" / "bin" / "deepthread").exists():
        if os.environ.get("CI") == "true":
            pytest.fail("no .venv/bin/deepthread: CI runs scripts/test, whose scripts/setup makes it")
        pytest.skip("no .venv: run scripts/setup (scripts/run and scripts/test do) first")


@pytest.mark.parametrize("command", COMMANDS, ids=[f"line{command.line}" for command in COMMANDS])
def test_every_readme_command_exists_with_its_options(command: Command) -> None:
    venv_or_skip()
    # A shell as a reader has one: deepthread's virtual environment not active, so only README's step puts it on PATH.
    path = os.pathsep.join(entry for entry in os.environ.get("PATH", "").split(os.pathsep)
                           if not entry.startswith(str(ROOT / ".venv")))
    env = {name: value for name, value in os.environ.items() if name != "VIRTUAL_ENV"} | {"PATH": path}
    result = subprocess.run(["bash", "-c", f'{ACTIVATE} && deepthread "$@"', "deepthread", *command.argv()],
                            cwd=ROOT, env=env, capture_output=True, text=True, timeout=60)
    shown = result.stdout + result.stderr
    assert result.returncode == 0, f"{command}\n{shown}"
    subcommand = [word for word in command.argv() if not word.startswith("-")][:1]
    assert re.search(r"Usage: deepthread " + "".join(f"{word} " for word in subcommand), shown), f"{command}\n{shown}"
    unknown = [name for name in command.option_names() if not re.search(rf"(?<![\w-]){name}(?![\w-])", result.stdout)]
    assert unknown == [], f"{command}: not an option of that command\n{shown}"
