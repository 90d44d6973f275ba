"""What a `deepthread` command imports, read from `python -X importtime` (shared by the start-up test and bench)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from pydantic import BaseModel

ROOT = Path(__file__).resolve().parents[1]
IMPORTTIME_PREFIX = "import time:"

# What only a run, a worker or a platform adapter needs: none of it may load before a command has started.
RUN_MODULES = (
    "openai", "tavily", "exa_py", "ddgs", "duckduckgo_search", "slack_sdk", "slack_bolt", "discord", "celery",
    "kombu", "trafilatura", "lxml", "pypdfium2", "numpy", "bm25s", "aiohttp",
    "research.llm", "research.providers", "research.engine", "research.extract", "worker",
    "bot.slack", "bot.discord", "chat.slack", "chat.discord",
)
# The database and Redis layers (reading the settings loads SQLAlchemy's URL parser to check DATABASE_URL).
STORAGE_MODULES = ("sqlalchemy", "alembic", "redis", "storage")
# The run vocabulary (literals and the JSON columns' pydantic models) is storage's one module a request's words are
# checked with: it loads nothing but pydantic.
LIGHT_STORAGE_MODULES = ("storage", "storage.vocabulary")


class ImportedModule(BaseModel):
    """One line of `-X importtime`: a module, its own and cumulative import time, and how deep it was imported."""

    name: str
    self_microseconds: int
    cumulative_microseconds: int
    depth: int


class ImportProfile(BaseModel):
    """A command's exit code, its output without the import lines, and every module it imported, in order."""

    returncode: int
    stdout: str
    stderr: str
    modules: list[ImportedModule]

    @property
    def names(self) -> set[str]:
        return {module.name for module in self.modules}

    @property
    def seconds(self) -> float:
        """Cumulative import time: the sum over modules imported at the top level (their children are inside)."""
        return sum(module.cumulative_microseconds for module in self.modules if module.depth == 0) / 1e6

    def loaded(self, packages: tuple[str, ...]) -> list[str]:
        """The imported modules that are one of `packages` or inside one of them."""
        return sorted(name for name in self.names if name not in LIGHT_STORAGE_MODULES
                      and any(name == package or name.startswith(package + ".") for package in packages))


def parse_importtime(stderr: str) -> tuple[list[ImportedModule], str]:
    """The modules in `-X importtime` output, and the rest of stderr (what the program itself wrote).

    Raises ValueError when the output holds more than one process's imports (each process writes its own header
    line first): their lines interleave, and no figure read from them would be one process's."""
    modules: list[ImportedModule] = []
    other_lines: list[str] = []
    headers = 0
    for line in stderr.splitlines():
        if not line.startswith(IMPORTTIME_PREFIX):
            other_lines.append(line)
            continue
        self_column, cumulative_column, name_column = line[len(IMPORTTIME_PREFIX):].split("|", 2)
        if not self_column.strip().isdigit():
            headers += 1
            if headers > 1:
                raise ValueError("the -X importtime output holds a second process's imports")
            continue
        # CPython indents the name by one space, plus two a level of nesting.
        indent = len(name_column) - len(name_column.lstrip(" "))
        modules.append(ImportedModule(name=name_column.strip(), self_microseconds=int(self_column),
                                      cumulative_microseconds=int(cumulative_column), depth=(indent - 1) // 2))
    return modules, "\n".join(other_lines)


# `python -m bot.cli`, except that the processes it starts are not profiled: multiprocessing hands its helper
# processes (the CPU pool's resource tracker and workers) the interpreter's `-X` options, read from `sys._xoptions`,
# so each would write its whole start, its own interpreter's included, into the same stderr.
RUN_CLI_ALONE = ("import runpy, sys; sys._xoptions.pop('importtime', None); "
                 "runpy.run_module('bot.cli', run_name='__main__', alter_sys=True)")


def profile_command(arguments: list[str], *, cwd: Path, environment: dict[str, str] | None = None) -> ImportProfile:
    """Run `python -X importtime -m bot.cli <arguments>` in `cwd` and profile what that process imported."""
    environment = dict(os.environ if environment is None else environment)
    environment["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), environment.get("PYTHONPATH")]))
    completed = subprocess.run([sys.executable, "-X", "importtime", "-c", RUN_CLI_ALONE, *arguments], cwd=cwd,
                               env=environment, capture_output=True, text=True, timeout=60)
    modules, stderr = parse_importtime(completed.stderr)
    return ImportProfile(returncode=completed.returncode, stdout=completed.stdout, stderr=stderr, modules=modules)
