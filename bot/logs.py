"""Process logging: LOG_FORMAT's formatters, the run's context on each line, secrets redacted, chatty libraries held back.

Imports nothing beyond the standard library until logging is configured, so `deepthread --help` stays light.
"""

from __future__ import annotations

import json
import logging
import re
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import TYPE_CHECKING
from urllib.parse import unquote, urlsplit

if TYPE_CHECKING:
    from config import Settings

REDACTED = "[redacted]"
CONSOLE_FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"
# Shorter values are no secret worth the name, and replacing them would blank out parts of ordinary words.
MIN_SECRET_CHARACTERS = 4
SECRET_SETTING_ENDINGS = ("_key", "_token", "_secret", "_password")
_URL_CREDENTIALS = re.compile(r"(?P<scheme>[a-z][a-z0-9+.-]*://)[^/@\s]+@", re.IGNORECASE)
# Slack tokens by their shape: the per-workspace tokens of OAuth installs live in the database, not in the settings.
_SLACK_TOKENS = re.compile(r"\bxox[abposr]-[0-9A-Za-z-]{8,}")

# The lowest level each library may log at: below it, its lines carry request URLs with the user's queries (httpx's
# INFO) or request and response bodies with message and report text (slack-sdk's, slack-bolt's and discord.py's DEBUG).
CONTENT_BEARING_LOGGERS = {
    "httpx": logging.WARNING, "httpcore": logging.WARNING, "httpx2": logging.WARNING, "httpcore2": logging.WARNING,
    "slack_sdk": logging.INFO, "slack_bolt": logging.INFO, "discord": logging.INFO,
}


def _url_passwords(value: str) -> list[str]:
    try:
        password = urlsplit(value).password
    except ValueError:  # not a URL after all
        return []
    return [password, unquote(password)] if password else []


def secret_values(settings: Settings) -> list[str]:
    """Every secret the settings hold: SecretStr values, settings named like keys, tokens, secrets or passwords, and the
    passwords inside URL settings (DATABASE_URL, REDIS_URL, SEARXNG_URL…)."""
    found: list[str] = []
    for name, value in settings:
        if hasattr(value, "get_secret_value"):
            found.append(value.get_secret_value())
        elif isinstance(value, str):
            if name.endswith(SECRET_SETTING_ENDINGS):
                found.append(value)
            found.extend(_url_passwords(value))
    return [value for value in dict.fromkeys(found) if len(value) >= MIN_SECRET_CHARACTERS]


class SecretRedactor:
    """Replaces each given secret value, and the credentials of any URL, in a text about to be logged."""

    def __init__(self, secrets: Iterable[str] = ()) -> None:
        # Longest first, so a secret containing another is replaced whole.
        values = sorted({value for value in secrets if len(value) >= MIN_SECRET_CHARACTERS}, key=len, reverse=True)
        self._secrets = re.compile("|".join(map(re.escape, values))) if values else None

    def __call__(self, text: str) -> str:
        if self._secrets is not None:
            text = self._secrets.sub(REDACTED, text)
        text = _SLACK_TOKENS.sub(REDACTED, text)
        return _URL_CREDENTIALS.sub(lambda match: f"{match['scheme']}{REDACTED}@", text)


Redact = Callable[[str], str]


class JsonLogFormatter(logging.Formatter):
    """One JSON object a line (LOG_FORMAT=json), for machines: inside a run, its id, conversation, platform, workspace
    and phase (put on the record by `RunContextFilter`); secrets redacted."""

    def __init__(self, redact: Redact = SecretRedactor()) -> None:
        from ops.log_context import RUN_FIELDS

        super().__init__()
        self.redact = redact
        self.run_fields = RUN_FIELDS

    def format(self, record: logging.LogRecord) -> str:
        entry: dict[str, object] = {"time": self.formatTime(record), "level": record.levelname, "logger": record.name,
                                    "thread": record.threadName}
        for name in self.run_fields:
            value = getattr(record, name, None)
            if value is not None:
                entry[name] = value
        entry["message"] = self.redact(record.getMessage())
        if record.exc_info:
            entry["exception"] = self.redact(self.formatException(record.exc_info))
        if record.stack_info:
            entry["stack"] = self.redact(self.formatStack(record.stack_info))
        return json.dumps(entry, ensure_ascii=False)


class ConsoleLogFormatter(logging.Formatter):
    """Plain lines for people (LOG_FORMAT=console), secrets redacted."""

    def __init__(self, redact: Redact = SecretRedactor()) -> None:
        super().__init__(CONSOLE_FORMAT)
        self.redact = redact

    def format(self, record: logging.LogRecord) -> str:
        return self.redact(super().format(record))


def configure_logging(settings: Settings, *, path: Path | None = None) -> None:
    """Root logging at LOG_LEVEL, as console lines or JSON (LOG_FORMAT), on stderr or appended to `path`."""
    from ops.log_context import RunContextFilter

    if path is not None:
        path.parent.mkdir(parents=True, exist_ok=True)
    handler = logging.FileHandler(path, encoding="utf-8") if path is not None else logging.StreamHandler()
    redact = SecretRedactor(secret_values(settings))
    handler.setFormatter(JsonLogFormatter(redact) if settings.log_format == "json" else ConsoleLogFormatter(redact))
    handler.addFilter(RunContextFilter())
    logging.basicConfig(level=settings.log_level, handlers=[handler], force=True)
    configured = logging.getLevelName(settings.log_level)
    for name, lowest in CONTENT_BEARING_LOGGERS.items():
        logging.getLogger(name).setLevel(max(lowest, configured))
