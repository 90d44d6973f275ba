from __future__ import annotations

from pathlib import Path

import yaml
from typer.main import get_command

from bot.cli import app

ROOT = Path(__file__).resolve().parents[2]


def deepthread_commands() -> set[str]:
    return set(get_command(app).commands)  # type: ignore[attr-defined]


def test_compose_has_the_foundation_services() -> None:
    services = yaml.safe_load((ROOT / "docker-compose.yml").read_text())["services"]
    assert {"postgres", "redis", "migrate"} <= set(services)


def test_every_deepthread_service_runs_a_real_command() -> None:
    services = yaml.safe_load((ROOT / "docker-compose.yml").read_text())["services"]
    known = deepthread_commands()
    deepthread_services = {name: service for name, service in services.items() if "build" in service}
    assert deepthread_services, "no service builds the deepthread image"
    for name, service in deepthread_services.items():
        command = service["command"]
        assert command[0] == "deepthread", name
        assert command[1] in known, f"service {name} runs unknown command {command[1]}"


def test_deepthread_services_read_the_env_file() -> None:
    services = yaml.safe_load((ROOT / "docker-compose.yml").read_text())["services"]
    for name, service in services.items():
        if "build" in service:
            assert service["env_file"] == ".env", name


def test_env_example_lists_every_setting() -> None:
    from config.settings import Settings

    listed = {line.split("=", 1)[0].strip("# ").strip() for line in (ROOT / ".env.example").read_text().splitlines() if "=" in line}
    expected = {name.upper() for name in Settings.model_fields}
    assert expected <= listed, f"missing from .env.example: {sorted(expected - listed)}"


def test_a_platform_service_without_its_token_stops_once_instead_of_restarting(monkeypatch) -> None:
    from typer.testing import CliRunner

    services = yaml.safe_load((ROOT / "docker-compose.yml").read_text())["services"]
    for name in ("slack", "discord"):
        assert "--if-configured" in services[name]["command"] and services[name]["restart"] == "on-failure", name
        monkeypatch.setenv(f"{name.upper()}_BOT_TOKEN", "")
        result = CliRunner().invoke(app, services[name]["command"][1:])
        assert result.exit_code == 0 and f"{name.upper()}_BOT_TOKEN is not set" in result.output, name


def test_the_slack_service_is_health_checked_on_its_healthz() -> None:
    slack = yaml.safe_load((ROOT / "docker-compose.yml").read_text())["services"]["slack"]
    assert "/healthz" in " ".join(slack["healthcheck"]["test"])


def test_the_manifest_asks_only_for_scopes_the_code_uses() -> None:
    manifest = yaml.safe_load((ROOT / "slack" / "manifest.yml").read_text())
    assert "users:read" not in manifest["oauth_config"]["scopes"]["bot"]
