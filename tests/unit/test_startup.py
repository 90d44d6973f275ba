"""`deepthread --help` and the start of `deepthread research` load no LLM, search, platform, Celery or storage module."""

from __future__ import annotations

import os
from pathlib import Path

from tests.import_profile import RUN_MODULES, STORAGE_MODULES, ImportProfile, profile_command


def profile(arguments: list[str], **settings: str) -> ImportProfile:
    return profile_command(arguments, cwd=Path.cwd(), environment={**os.environ, **settings})


def test_help_imports_no_llm_search_platform_celery_or_storage_module() -> None:
    result = profile(["--help"])
    assert result.returncode == 0 and "research" in result.stdout
    assert "typer" in result.names, "the profile sees the command's own imports"
    assert result.loaded(RUN_MODULES + STORAGE_MODULES) == []
    assert result.loaded(("config", "httpx")) == [], "help needs neither the settings nor an HTTP client"


def test_research_help_imports_no_llm_search_platform_celery_or_storage_module() -> None:
    result = profile(["research", "--help"])
    assert result.returncode == 0 and "--deep" in result.stdout
    assert result.loaded(RUN_MODULES + STORAGE_MODULES) == []


def test_research_without_a_question_says_how_to_ask_before_loading_the_engine() -> None:
    result = profile(["research", ""])
    assert result.returncode == 2 and "/research <question>" in result.stderr
    assert "bot.conversation.commands" in result.names, "the chat's request rules checked the question"
    assert result.loaded(RUN_MODULES + STORAGE_MODULES) == []


def test_research_with_a_bad_setting_names_it_before_loading_the_engine() -> None:
    result = profile(["research", "what changed in CPython 3.13?"], RESEARCH_MAX_ROUNDS="0")
    assert result.returncode == 2 and "RESEARCH_MAX_ROUNDS" in result.stderr
    assert "config.settings" in result.names, "the settings were read"
    assert result.loaded(RUN_MODULES) == []
