from __future__ import annotations

import pytest

from config import SettingsError, load_settings


def test_defaults_match_the_architecture_table() -> None:
    settings = load_settings()
    assert settings.database_url == "sqlite:///data/deepthread.db"
    assert settings.redis_url == ""
    assert settings.search_providers == ["auto"]
    assert settings.search_fanout is False
    assert (settings.research_max_seconds, settings.research_max_rounds, settings.research_max_searches,
            settings.research_max_sources) == (300, 3, 30, 12)
    assert settings.research_max_fetch_bytes == 25 * 1024 * 1024
    assert settings.research_max_llm_tokens == 200_000
    assert (settings.worker_concurrency, settings.max_runs_per_user, settings.max_runs_per_workspace) == (8, 1, 10)
    assert settings.cancel_emoji == ["x", "octagonal_sign", "❌", "🛑"]
    assert settings.llm_fast_model is None
    assert (settings.log_level, settings.log_format) == ("INFO", "console")


def test_fast_model_falls_back_to_the_main_model(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("LLM_MODEL", "big")
    assert load_settings().fast_model == "big"
    monkeypatch.setenv("LLM_FAST_MODEL", "small")
    assert load_settings().fast_model == "small"


def test_comma_lists_are_split_and_trimmed(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SEARCH_PROVIDERS", " brave , EXA ")
    monkeypatch.setenv("ADMIN_USER_IDS", "slack:U1,discord:42")
    monkeypatch.setenv("FETCH_ALLOW_PRIVATE_HOSTS", "intranet.local, 10.0.0.0/8")
    settings = load_settings()
    assert settings.search_providers == ["brave", "exa"]
    assert settings.admin_user_ids == ["slack:U1", "discord:42"]
    assert settings.fetch_allow_private_hosts == ["intranet.local", "10.0.0.0/8"]


def test_values_are_read_from_a_dotenv_file(tmp_path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    (tmp_path / ".env").write_text("LLM_MODEL=from-dotenv\nRESEARCH_MAX_ROUNDS=5\n")
    settings = load_settings()
    assert settings.llm_model == "from-dotenv"
    assert settings.research_max_rounds == 5


@pytest.mark.parametrize(
    ("variable", "value"),
    [
        ("RESEARCH_MAX_SECONDS", "five minutes"),
        ("RESEARCH_MAX_ROUNDS", "2.5"),
        ("RESEARCH_MAX_FETCH_BYTES", "-1"),
        ("MAX_RUNS_PER_USER", "many"),
        ("SEARCH_PROVIDERS", "brave,google"),
        ("LLM_BASE_URL", "not a url"),
        ("TAVILY_BASE_URL", "ftp://tavily.example"),
        ("SLACK_API_URL", "slack.com/api"),
        ("SEARXNG_URL", "searx"),
        ("DATABASE_URL", "::nonsense::"),
        ("SEARCH_FANOUT", "perhaps"),
        ("LOG_FORMAT", "xml"),
    ],
)
def test_invalid_value_gives_one_line_naming_the_variable(monkeypatch: pytest.MonkeyPatch, variable: str, value: str) -> None:
    monkeypatch.setenv(variable, value)
    with pytest.raises(SettingsError) as raised:
        load_settings()
    message = str(raised.value)
    assert "\n" not in message
    assert message.startswith(f"Invalid setting {variable}:")


def test_unknown_provider_is_named_in_the_error(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SEARCH_PROVIDERS", "tavily,bing")
    with pytest.raises(SettingsError, match="unknown provider bing"):
        load_settings()


def test_secrets_are_masked_when_settings_are_printed(monkeypatch: pytest.MonkeyPatch) -> None:
    secrets = {"LLM_API_KEY": "sk-live-123", "SLACK_BOT_TOKEN": "xoxb-999", "BRAVE_API_KEY": "brv-7",
               "SLACK_SIGNING_SECRET": "sign-me", "DISCORD_BOT_TOKEN": "disc-tok", "TAVILY_API_KEY": "tvly-1",
               "EXA_API_KEY": "exa-2", "SLACK_APP_TOKEN": "xapp-3"}
    for name, value in secrets.items():
        monkeypatch.setenv(name, value)
    settings = load_settings()
    shown = repr(settings) + str(settings) + settings.model_dump_json()
    for value in secrets.values():
        assert value not in shown
    assert settings.secret("llm_api_key") == "sk-live-123"


def test_cli_reports_a_bad_setting_in_one_line_and_exits_2(monkeypatch: pytest.MonkeyPatch) -> None:
    from typer.testing import CliRunner

    from bot.cli import app

    monkeypatch.setenv("RESEARCH_MAX_SEARCHES", "lots")
    result = CliRunner().invoke(app, ["doctor"])
    assert result.exit_code == 2
    assert result.output.strip().splitlines() == ["Invalid setting RESEARCH_MAX_SEARCHES: Input should be a valid integer, unable to parse string as an integer"]


def test_the_defaults_classes_keep_beside_their_settings_are_the_settings_defaults(monkeypatch) -> None:
    from bot.conversation.core import CoreSettings
    from chat.slack.render import SlackRenderer
    from config import Settings
    from worker.delivery import DeliveryRetry
    from worker.progress import InMemoryEditBucket

    defaults = Settings(_env_file=None)
    retry, core = DeliveryRetry(), CoreSettings()
    assert (retry.max_attempts, retry.first_delay_seconds, retry.max_delay_seconds) == (
        defaults.delivery_max_attempts, defaults.delivery_retry_seconds, defaults.delivery_retry_max_seconds)
    assert core.cancel_emoji == frozenset(defaults.cancel_emoji)
    assert core.max_queued_per_user == defaults.max_queued_per_user
    assert (core.daily_quotas.runs_per_user, core.daily_quotas.cost_per_workspace) == (
        defaults.daily_runs_per_user, defaults.daily_cost_per_workspace)
    assert InMemoryEditBucket().capacity == defaults.status_edits_per_minute
    assert SlackRenderer().cancel_emoji == defaults.cancel_emoji[0]
