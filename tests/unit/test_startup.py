"""`deepthread --help` and the start of `deepthread research` load no LLM, search, platform, Celery or storage module."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import SETTINGS_PREFIXES
from tests.import_profile import RUN_MODULES, STORAGE_MODULES, ImportProfile, parse_importtime, profile_command


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


def test_a_profile_is_the_command_s_own_imports_not_those_of_the_processes_it_starts() -> None:
    # A run starts its CPU pool (and multiprocessing's resource tracker), which inherited `-X importtime` and wrote
    # its own interpreter's start into the figure (a second header line, which the profile refuses, and `site` again).
    environment = {name: value for name, value in os.environ.items() if not name.startswith(SETTINGS_PREFIXES)}
    result = profile_command(["research", "what changed in CPython 3.13?"], cwd=Path.cwd(), environment=environment)
    assert result.returncode == 2 and "LLM_MODEL" in result.stderr
    assert "research.engine" in result.names and "research.cpu" in result.names, "the run's modules were loaded"
    assert [module.name for module in result.modules].count("site") == 1
    assert result.loaded(("pygments", "rich.syntax")) == [], "httpx's command-line client is not loaded"


def test_an_importtime_output_of_two_processes_is_refused() -> None:
    header = "import time: self [us] | cumulative | imported package"
    one = f"{header}\nimport time:       120 |        120 | site"
    assert [module.name for module in parse_importtime(one)[0]] == ["site"]
    with pytest.raises(ValueError, match="second process"):
        parse_importtime(f"{one}\n{one}")


def printed_by(script: str) -> list[str]:
    """The lines a fresh interpreter prints running `script` (which must succeed)."""
    ran = subprocess.run([sys.executable, "-c", script], cwd=Path.cwd(), capture_output=True, text=True, timeout=60)
    assert ran.returncode == 0, ran.stderr
    return ran.stdout.splitlines()


def test_a_run_with_one_search_provider_loads_no_provider_s_sdk() -> None:
    # exa-py alone took a good part of a research run's start-up though only Tavily was configured, and
    # tavily-python a third of a second for a POST the router's httpx client sends as well.
    script = (
        "import sys, httpx\n"
        "from research.engine import research\n"
        "from research.providers import SearchConfig, build_router\n"
        "async def emit(event): pass\n"
        "config = SearchConfig(providers=['tavily'], tavily_api_key='tvly-test')\n"
        "router = build_router(config, http=httpx.AsyncClient(), emit=emit)\n"
        "print(sorted(name for name in ('exa_py', 'tavily', 'requests') if name in sys.modules))\n"
    )
    assert printed_by(script) == ["[]"]


def test_the_readers_and_the_ranker_load_only_once_a_run_begins_and_then_beside_it() -> None:
    # trafilatura (with lxml, justext) and bm25s (with numpy) were a third of a research run's start-up, though a run
    # reads and ranks only once pages arrive, and reads in its CPU pool's processes.
    # markdown-it-py and the citation audit too: the first text a run parses is its model's first answer, and it
    # audits last.
    later = "('trafilatura', 'bm25s', 'numpy', 'markdown_it', 'research.audit')"
    script = (
        "import sys\n"
        "import worker.toolkit, worker.attempt, research.engine, research.scrape_fallback\n"
        "import bot.console.bundle, chat.console.render, storage.runs, worker.headless, bot.conversation.commands\n"
        f"print(sorted(name for name in {later} if name in sys.modules))\n"
        "from research import rank, readers\n"
        "readers.preload(reads_here=True)\n"
        "import threading\n"
        "[thread.join() for thread in threading.enumerate() if thread.name == 'deepthread-preload']\n"
        f"print(sorted(name for name in {later} if name in sys.modules))\n"
        "from research.models import Passage\n"
        "passage = Passage(id='p1', source_id='s1', text='tidal turbines deliver energy', start=0, end=29)\n"
        "print(rank.rank_passages('tidal energy', [passage], top_k=1)[0][0].id)\n"
    )
    assert printed_by(script) == ["[]", "['bm25s', 'markdown_it', 'numpy', 'research.audit', 'trafilatura']", "p1"]


def test_the_model_is_asked_without_an_sdk() -> None:
    # The openai SDK took a second of a research run's start-up (a second httpx and aiohttp among its imports) for
    # one POST and its events: the run's model calls go through httpx, which the engine has loaded anyway.
    script = (
        "import sys, asyncio\n"
        f"sys.path.insert(0, {str(Path(__file__).resolve().parents[2])!r})\n"
        "import worker.toolkit, research.engine\n"
        "from research.llm import LLMClient\n"
        "from tests.fakes.llm import FakeLLM\n"
        "model = FakeLLM()\n"
        "client = LLMClient(model.config(), http_client=model.http_client())\n"
        "print(asyncio.run(client.complete([{'role': 'user', 'content': 'Say hello.'}], task='chat'))[:5])\n"
        "print(sorted(name for name in ('openai', 'httpx2', 'aiohttp') if name in sys.modules))\n"
    )
    answer, loaded = printed_by(script)
    assert answer and loaded == "[]"


def test_a_run_loads_no_watch_module_and_no_metrics_before_its_first_step() -> None:
    # A watch's comparison is made only as a watch's run is stored, and only a worker serves metrics; importing them
    # with the attempt and the terminal's renderers put a tenth of a second on every `deepthread research` start.
    script = (
        "import sys\n"
        "import worker.toolkit, worker.attempt, research.engine, bot.console.bundle\n"
        "print(sorted(name for name in ('worker.watches', 'storage.watches', 'prometheus_client') if name in sys.modules))\n"
    )
    assert printed_by(script) == ["[]"]
