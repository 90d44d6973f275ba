"""The platform seam holds: the worker and the shared layers name no platform, and platforms come from one list."""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest
from typer.testing import CliRunner

from bot.cli import app, configured_adapters, platform_bundles
from config import load_settings

ROOT = Path(__file__).resolve().parents[2]
PLATFORM_NAMES = {bundle.name for bundle in platform_bundles()}
# Packages that must not know which platforms exist (their own packages and bot/cli.py's list are the places that do).
NEUTRAL = ["worker", "research", "storage", "bot/conversation", "chat/message.py", "chat/render.py", "chat/state.py",
           "chat/status.py", "chat/text.py", "chat/platform.py", "bot/platform.py", "bot/doctor.py"]


def python_files(*relative: str) -> list[Path]:
    files: list[Path] = []
    for name in relative:
        path = ROOT / name
        files.extend([path] if path.is_file() else sorted(path.rglob("*.py")))
    return files


def imported_modules(path: Path) -> set[str]:
    modules: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            modules.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module:
            modules.add(node.module)
    return modules


def test_the_worker_imports_nothing_from_the_bot() -> None:
    offenders = {str(path.relative_to(ROOT)): sorted(module for module in imported_modules(path)
                                                     if module == "bot" or module.startswith("bot."))
                 for path in python_files("worker")}
    assert {path: modules for path, modules in offenders.items() if modules} == {}


def test_build_core_is_defined_once() -> None:
    definitions = [path.relative_to(ROOT) for path in python_files("bot", "worker", "chat")
                   if re.search(r"^def build_core\(", path.read_text(), re.MULTILINE)]
    assert [str(path) for path in definitions] == ["bot/conversation/core.py"]


def test_no_platform_name_is_written_outside_its_package() -> None:
    literal = re.compile(r"""["'](%s)["']""" % "|".join(sorted(PLATFORM_NAMES)))
    hits = [f"{path.relative_to(ROOT)}:{number}: {line.strip()}" for path in python_files(*NEUTRAL)
            for number, line in enumerate(path.read_text().splitlines(), 1) if literal.search(line)]
    assert hits == []


def test_the_chat_layer_never_imports_a_platform_adapter() -> None:
    offenders = [str(path.relative_to(ROOT)) for path in python_files("chat")
                 if any(module.startswith("bot") or module.startswith("worker") for module in imported_modules(path))]
    assert offenders == []


def test_each_bundle_builds_its_own_messenger_and_renderer_for_the_worker() -> None:
    settings = load_settings(slack_bot_token="xoxb-1", discord_bot_token="discord-1")
    outbound = {bundle.name: bundle.outbound(settings) for bundle in platform_bundles()}
    assert outbound["cli"] is None, "the terminal follows its runs itself"
    for name in PLATFORM_NAMES - {"cli"}:
        assert outbound[name] is not None
        assert outbound[name].messenger.platform == outbound[name].renderer.platform == name


def test_an_unconfigured_platform_says_which_setting_is_missing() -> None:
    settings = load_settings(slack_bot_token="", discord_bot_token="")
    for bundle in platform_bundles():
        if bundle.build_outbound is not None:
            with pytest.raises(LookupError, match=bundle.missing_setting):
                bundle.outbound(settings)


def test_the_workers_slack_renderer_gets_the_configured_cancel_emoji() -> None:
    settings = load_settings(slack_bot_token="xoxb-1", cancel_emoji="stop_sign,🛑")
    slack = next(bundle for bundle in platform_bundles() if bundle.name == "slack").outbound(settings)
    assert slack is not None and slack.renderer.cancel_emoji == "stop_sign"


@pytest.mark.parametrize(("tokens", "adapters"), [
    ({}, []), ({"slack_bot_token": "xoxb-1"}, ["slack"]), ({"discord_bot_token": "d-1"}, ["discord"]),
    ({"slack_bot_token": "xoxb-1", "discord_bot_token": "d-1"}, ["slack", "discord"])])
def test_up_starts_the_adapter_of_every_configured_platform(tokens: dict[str, str], adapters: list[str]) -> None:
    settings = load_settings(**{"slack_bot_token": "", "discord_bot_token": "", **tokens})
    assert configured_adapters(settings) == adapters


def test_every_adapter_has_a_command_of_its_name() -> None:
    from typer.main import get_command

    commands = set(get_command(app).commands)  # type: ignore[attr-defined]
    assert {bundle.adapter_command for bundle in platform_bundles() if bundle.adapter_command} <= commands


def test_discord_invite_needs_the_application_id(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("DISCORD_APPLICATION_ID", "")
    result = CliRunner().invoke(app, ["discord-invite"])
    assert result.exit_code == 2 and "DISCORD_APPLICATION_ID" in result.output
    monkeypatch.setenv("DISCORD_APPLICATION_ID", "4242")
    result = CliRunner().invoke(app, ["discord-invite"])
    assert result.exit_code == 0 and "client_id=4242" in result.output
