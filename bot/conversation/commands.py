"""What the words of a message mean: commands, options, approvals, cancels. Pure functions."""

from __future__ import annotations

import datetime as dt
import re
from typing import Any, Literal

from pydantic import BaseModel, Field

from research.errors import DeepthreadError
from research.report import ExportFormat
from storage.vocabulary import RunOptions

Mode = Literal["research", "plan", "chat"]
MAX_QUESTION_CHARS = 2_000
KNOWN_OPTIONS = "--since DATE, --site DOMAIN (repeatable), --deep, --quick, --files-only"
USAGE = ("Usage: `/research <question>` for a cited report, `/plan <question>` for a plan to approve first, "
         f"`/ask <question>` for a quick answer. Options: {KNOWN_OPTIONS}.")
HELP = (
    "**deepthread** researches the web and answers in a thread, citing every claim.\n"
    "• `/research <question>` — a cited report (options: --since 2024-01-01, --site example.com, --deep, --quick)\n"
    "• `/plan <question>` — a research plan first; reply **go** (or react ✅) to run it, or reply with changes\n"
    "• `/ask <question>` — a quick answer with no web search\n"
    "• Mention me or DM me: a quick answer, or start with `research:` or `plan:`\n"
    "• In a thread I answered: ask follow-ups (answered from the sources I read), say **dig deeper** for more "
    "research, or **cancel** (or react ❌) to stop a run and keep what was found.\n"
    "• In a report's thread: **export md**, **export html** or **export json** attaches the report as a file\n"
    "• Share files (PDF, Word, Markdown, HTML, text, CSV) with a mention, in my thread or in a DM: they are read "
    "and cited beside the web; start with **files only:** (or add --files-only) to search nothing else\n"
    "• `/research history` — your recent runs and this channel's, shown only to you"
)

_OPTION = re.compile(r"(?<!\S)--([A-Za-z][\w-]*)(?:=(\S+))?")
_DOMAIN = re.compile(r"^(?=.{1,253}$)(?!-)[a-z0-9-]{1,63}(?:\.(?!-)[a-z0-9-]{1,63})+$")
_MODE_PREFIX = re.compile(r"^\s*(research|plan|ask)\s*:\s*", re.IGNORECASE)
_APPROVAL = re.compile(
    r"^\s*(?:go|go ahead|go for it|approve|approved|yes|yes,? (?:please|go|run it|do it)|run it|do it|lgtm|"
    r"looks good(?:,? go)?|start|ok(?:ay)?,? go|ship it)\s*[.!👍]*\s*$", re.IGNORECASE)
_CANCEL = re.compile(r"^\s*(?:cancel|stop|abort)(?: (?:it|the run|research|please))?\s*[.!]*\s*$", re.IGNORECASE)
_DIG_DEEPER = re.compile(r"^\s*(?:dig deeper|go deeper|research (?:more|further|deeper))\b[\s:,.!]*", re.IGNORECASE)
_RETRY = re.compile(r"^\s*(?:retry|try again)\s*[.!]*\s*$", re.IGNORECASE)
_CONTINUE = re.compile(r"^\s*(?:continue|keep going|carry on)\s*[.!]*\s*$", re.IGNORECASE)
_HELP = re.compile(r"^\s*(?:help|\?)\s*$", re.IGNORECASE)
# "files only" as a scope, not as words of a question ("which files only Linux reads?"): at the start ("files only:
# …"), in brackets, or after a comma at the end ("…, files only").
_FILES_ONLY = re.compile(r"^\s*files?[ -]only\s*[:,.!-]|^\s*files?[ -]only\s*$|[(\[]\s*files?[ -]only\s*[)\]]"
                         r"|[,;]\s*files?[ -]only\s*[.!]?\s*$", re.IGNORECASE)
_LEADING_FILES_ONLY = re.compile(r"^\s*files?[ -]only\s*[:,.!-]\s*", re.IGNORECASE)
_HISTORY = re.compile(r"^\s*history\s*[.!?]*\s*$", re.IGNORECASE)
_EXPORT = re.compile(r"^\s*export(?:\s+(?:as\s+)?(md|markdown|html|json))?\s*[.!]*\s*$", re.IGNORECASE)
# What each word that _MODE_PREFIX and _EXPORT admit asks for.
_MODE_OF_PREFIX: dict[str, Mode] = {"research": "research", "plan": "plan", "ask": "chat"}
_EXPORT_FORMAT_OF_WORD: dict[str, ExportFormat] = {"md": "md", "markdown": "md", "html": "html", "json": "json"}


class UsageProblem(DeepthreadError):
    """The request cannot be run as written; the message says why and how to fix it."""


class Request(BaseModel):
    """A question to run in a mode, with the requester's options."""

    mode: Mode
    question: str
    options: RunOptions = Field(default_factory=RunOptions)


def is_help(text: str) -> bool:
    return bool(_HELP.match(text))


def is_history(text: str) -> bool:
    return bool(_HISTORY.match(text))


def export_format(text: str) -> ExportFormat | None:
    """`export html` → "html" (`export` alone, or `export markdown`: "md"); None when the text asks for no export."""
    match = _EXPORT.match(text)
    if not match:
        return None
    return _EXPORT_FORMAT_OF_WORD[(match.group(1) or "md").lower()]


def is_approval(text: str) -> bool:
    return bool(_APPROVAL.match(text))


def is_cancel(text: str) -> bool:
    return bool(_CANCEL.match(text))


def is_retry(text: str) -> bool:
    return bool(_RETRY.match(text))


def is_continue(text: str) -> bool:
    return bool(_CONTINUE.match(text))


def dig_deeper(text: str) -> str | None:
    """The rest of the text after "dig deeper" (maybe empty), or None when it does not ask for that."""
    match = _DIG_DEEPER.match(text)
    return text[match.end():].strip() if match else None


def mode_prefix(text: str) -> tuple[Mode | None, str]:
    """`research: q` → ("research", "q"); text without a prefix → (None, text)."""
    match = _MODE_PREFIX.match(text)
    if not match:
        return None, text
    return _MODE_OF_PREFIX[match.group(1).lower()], text[match.end():]


def parse_options(text: str) -> tuple[str, dict[str, Any]]:
    """Split `--since`, `--site`, `--deep`, `--quick`, `--files-only` out of the text (the words "files only" ask
    for the last too, and stay in the question); raises UsageProblem naming a bad one."""
    options: dict[str, Any] = {}
    sites: list[str] = []
    words = text.split()
    kept: list[str] = []
    index = 0
    while index < len(words):
        match = _OPTION.fullmatch(words[index])
        if not match:
            kept.append(words[index])
            index += 1
            continue
        name, inline_value = match.group(1).lower(), match.group(2)
        if name == "files-only" and inline_value is None:
            options["files_only"] = True
            index += 1
            continue
        if name in ("deep", "quick"):
            if "preset" in options and options["preset"] != name:
                raise UsageProblem("Choose one of --deep or --quick, not both.")
            options["preset"] = name
            index += 1
            continue
        if name not in ("since", "site"):
            raise UsageProblem(f"Unknown option --{name}. Options: {KNOWN_OPTIONS}.")
        value = inline_value
        if value is None:
            if index + 1 >= len(words):
                raise UsageProblem(f"--{name} needs a value, e.g. " + ("--since 2024-01-31." if name == "since" else "--site example.com."))
            value = words[index + 1]
            index += 1
        index += 1
        if name == "since":
            try:
                options["since"] = dt.date.fromisoformat(value).isoformat()
            except ValueError:
                raise UsageProblem(f"--since wants a date like 2024-01-31, not “{value}”.") from None
        else:
            domain = value.lower().removeprefix("https://").removeprefix("http://").strip("/")
            if not _DOMAIN.match(domain):
                raise UsageProblem(f"--site wants a domain like example.com, not “{value}”.")
            sites.append(domain)
    if sites:
        options["sites"] = sites
    question = " ".join(kept)
    if asks_files_only(question):
        options["files_only"] = True
        # The scope said before the question is no part of it (it would title the report).
        question = _LEADING_FILES_ONLY.sub("", question, count=1)
    return question, options


def asks_files_only(text: str) -> bool:
    """Whether `text` asks for the shared files only (`--files-only`, or the words "files only")."""
    return bool(_FILES_ONLY.search(text)) or "--files-only" in text.lower().split()


def scoped(options: RunOptions, *, has_files: bool) -> RunOptions:
    """`options` as a run with (or without) files takes them: "files only" where no file is shared was the question's
    words, not a scope (nothing would be read)."""
    return options.model_copy(update={"files_only": False}) if options.files_only and not has_files else options


def parse_request(text: str, default_mode: Mode) -> Request:
    """The request in `text`; raises UsageProblem (empty, too long, bad option)."""
    prefixed, rest = mode_prefix(text)
    question, options = parse_options(rest)
    question = question.strip()
    if not question:
        raise UsageProblem(USAGE)
    if len(question) > MAX_QUESTION_CHARS:
        raise UsageProblem(f"That question is {len(question):,} characters; the limit is {MAX_QUESTION_CHARS:,}. "
                           "Please shorten it.")
    mode = prefixed or default_mode
    if mode == "chat":
        options = {}  # a quick answer searches nothing, so nothing narrows it
    return Request(mode=mode, question=question, options=RunOptions(**options))
