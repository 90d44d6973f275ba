"""The platform seam holds: the worker and the shared layers name no platform, and platforms come from one list."""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest
from typer.testing import CliRunner

from bot.cli import app, configured_adapters, platform_bundles
from chat.discord.messenger import DiscordMessenger
from chat.slack.messenger import CountedRateLimitRetryHandler, SlackMessenger
from config import load_settings
from ops.metrics import record_rate_limit_wait

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


def names_package(module: str, package: str) -> bool:
    return module == package or module.startswith(f"{package}.")


def test_the_bot_imports_only_the_queue_of_the_worker() -> None:
    composition_root = ROOT / "bot" / "cli.py"
    offenders = {str(path.relative_to(ROOT)): sorted(module for module in imported_modules(path)
                                                     if names_package(module, "worker") and module != "worker.queue")
                 for path in python_files("bot") if path != composition_root}
    assert {path: modules for path, modules in offenders.items() if modules} == {}


def names_sqlalchemy(module: str) -> bool:
    """SQLAlchemy itself, or a module built on it that says so in its name (slack-sdk's SQLAlchemy stores)."""
    return "sqlalchemy" in module.split(".")


def test_only_storage_imports_sqlalchemy() -> None:
    # Storage owns every query, so the worker, the bot and the chat layer reach the database only through it.
    offenders = {str(path.relative_to(ROOT)): sorted(module for module in imported_modules(path)
                                                     if names_sqlalchemy(module))
                 for path in python_files("worker", "bot", "chat")}
    assert {path: modules for path, modules in offenders.items() if modules} == {}


def test_the_chat_layer_imports_nothing_from_ops() -> None:
    offenders = {str(path.relative_to(ROOT)): sorted(module for module in imported_modules(path)
                                                     if names_package(module, "ops"))
                 for path in python_files("chat")}
    assert {path: modules for path, modules in offenders.items() if modules} == {}


def module_name(path: Path) -> str:
    parts = path.relative_to(ROOT).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def imported_submodules(path: Path) -> set[str]:
    """`imported_modules`, plus `package.name` for each `from package import name` (which may be a module)."""
    tree = ast.parse(path.read_text())
    return imported_modules(path) | {f"{node.module}.{alias.name}" for node in ast.walk(tree)
                                     if isinstance(node, ast.ImportFrom) and node.module for alias in node.names}


def import_cycles(package: str) -> list[list[str]]:
    """Each cycle of imports among `package`'s modules once, as the modules in order, its first module repeated last."""
    files = python_files(package)
    modules = {module_name(path) for path in files}
    graph = {module_name(path): sorted(modules & imported_submodules(path) - {module_name(path)}) for path in files}
    cycles: list[list[str]] = []

    def walk(module: str, trail: list[str]) -> None:
        for imported in graph[module]:
            if imported == trail[0]:
                cycles.append([*trail, imported])
            elif imported not in trail and imported > trail[0]:  # each cycle found once, from its smallest module
                walk(imported, [*trail, imported])

    for start in sorted(graph):
        walk(start, [start])
    return cycles


def test_storage_models_and_installations_do_not_import_each_other() -> None:
    # models imports installations, so that Base.metadata holds the Slack tables; the Slack tables need only the Base.
    assert "storage.models" not in imported_modules(ROOT / "storage" / "installations.py")


def test_no_storage_module_imports_itself_through_others() -> None:
    assert import_cycles("storage") == []


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


def test_the_workers_messengers_count_rate_limit_waits_in_the_process_metrics() -> None:
    settings = load_settings(slack_bot_token="xoxb-1", discord_bot_token="discord-1")
    outbound = {bundle.name: bundle.outbound(settings) for bundle in platform_bundles()}
    slack, discord = outbound["slack"], outbound["discord"]
    assert slack is not None and isinstance(slack.messenger, SlackMessenger) and slack.messenger.client is not None
    assert [handler.count_wait for handler in slack.messenger.client.retry_handlers
            if isinstance(handler, CountedRateLimitRetryHandler)] == [record_rate_limit_wait]
    assert discord is not None and isinstance(discord.messenger, DiscordMessenger)
    assert discord.messenger.count_rate_limit_wait is record_rate_limit_wait


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
