"""Process logging: every configured secret is redacted from JSON and console lines, and libraries whose lines carry
request URLs or message bodies stay quiet whatever LOG_LEVEL says."""

from __future__ import annotations

import json
import logging
from collections.abc import Iterator

import pytest

from bot.logs import (
    CONTENT_BEARING_LOGGERS,
    REDACTED,
    ConsoleLogFormatter,
    JsonLogFormatter,
    SecretRedactor,
    configure_logging,
    secret_values,
)
from config import load_settings

SECRETS = {
    "llm_api_key": "sk-unit-llm-key-1111",
    "tavily_api_key": "tvly-unit-key-2222",
    "brave_api_key": "brave-unit-key-3333",
    "exa_api_key": "exa-unit-key-4444",
    "slack_bot_token": "xoxb-unit-bot-5555",
    "slack_app_token": "xapp-unit-app-6666",
    "slack_signing_secret": "unit-signing-7777",
    "discord_bot_token": "unit-discord-8888",
}
URL_PASSWORDS = {"database_url": "unit-db-pass", "redis_url": "unit-redis-pass", "searxng_url": "unit-searx-p@ss"}


@pytest.fixture
def settings():  # type: ignore[no-untyped-def]
    return load_settings(**SECRETS,
                         database_url="postgresql+psycopg://deepthread:unit-db-pass@db.internal/deepthread",
                         redis_url="redis://:unit-redis-pass@redis.internal:6379/0",
                         searxng_url="https://searx:unit-searx-p%40ss@searx.internal")


def record(message: str, *args: object, exc_info: object = None) -> logging.LogRecord:
    return logging.LogRecord("deepthread.test.logs", logging.ERROR, __file__, 1, message, args, exc_info)  # type: ignore[arg-type]


def test_every_secret_setting_and_url_password_is_found(settings) -> None:  # type: ignore[no-untyped-def]
    found = set(secret_values(settings))
    assert set(SECRETS.values()) <= found
    assert {"unit-db-pass", "unit-redis-pass", "unit-searx-p%40ss", "unit-searx-p@ss"} <= found


def test_json_lines_show_no_secret_in_the_message_or_the_exception(settings) -> None:  # type: ignore[no-untyped-def]
    formatter = JsonLogFormatter(SecretRedactor(secret_values(settings)))
    everything = " ".join([*SECRETS.values(), *URL_PASSWORDS.values()])
    try:
        raise RuntimeError(f"connecting with {everything} failed")
    except RuntimeError:
        import sys

        line = formatter.format(record("calling with %s", everything, exc_info=sys.exc_info()))
    entry = json.loads(line)
    for secret in [*SECRETS.values(), *URL_PASSWORDS.values()]:
        assert secret not in line
    assert entry["message"].count(REDACTED) == len(SECRETS) + len(URL_PASSWORDS)
    assert REDACTED in entry["exception"]


def test_credentials_of_any_url_are_redacted_even_when_no_setting_holds_them() -> None:
    line = ConsoleLogFormatter().format(record("retrying https://user:hunter2-unknown@proxy.example:8080/x"))
    assert "hunter2-unknown" not in line and f"https://{REDACTED}@proxy.example:8080/x" in line


def test_slack_tokens_no_setting_holds_are_redacted_by_their_shape() -> None:
    # An OAuth install's bot token lives in the database, so the settings cannot name it.
    line = "posting with xoxb-1234567890-0987654321-AbCdEfGhIjKl failed"
    assert SecretRedactor()(line) == f"posting with {REDACTED} failed"


def test_short_values_are_not_treated_as_secrets() -> None:
    redact = SecretRedactor(["abc", "long-enough-secret"])
    assert redact("abc and long-enough-secret") == f"abc and {REDACTED}"


@pytest.fixture
def restored_logging() -> Iterator[None]:
    root = logging.getLogger()
    saved = root.handlers[:], root.level, {name: logging.getLogger(name).level for name in CONTENT_BEARING_LOGGERS}
    try:
        yield
    finally:
        for handler in root.handlers:
            if handler not in saved[0]:
                handler.close()
        root.handlers[:] = saved[0]
        root.setLevel(saved[1])
        for name, level in saved[2].items():
            logging.getLogger(name).setLevel(level)


def test_at_debug_request_urls_and_message_bodies_stay_unlogged(restored_logging: None, tmp_path) -> None:  # type: ignore[no-untyped-def]
    configure_logging(load_settings(log_level="DEBUG", log_format="json"), path=tmp_path / "log")
    assert logging.getLogger("openai").isEnabledFor(logging.DEBUG), "libraries that log no content keep DEBUG"
    assert not logging.getLogger("httpx").isEnabledFor(logging.INFO)
    assert not logging.getLogger("httpx2").isEnabledFor(logging.INFO)
    for body_logger in ("slack_sdk.web.async_base_client", "slack_bolt.App", "discord.http"):
        assert not logging.getLogger(body_logger).isEnabledFor(logging.DEBUG), body_logger


def test_configured_json_logging_redacts_what_any_logger_writes(restored_logging: None, settings, tmp_path) -> None:  # type: ignore[no-untyped-def]
    configure_logging(settings.model_copy(update={"log_format": "json"}), path=tmp_path / "log")
    logging.getLogger("some.library").warning("sent Authorization: Bearer %s", SECRETS["slack_bot_token"])
    for handler in logging.getLogger().handlers:
        handler.flush()
    text = (tmp_path / "log").read_text()
    assert SECRETS["slack_bot_token"] not in text and json.loads(text)["message"] == f"sent Authorization: Bearer {REDACTED}"
