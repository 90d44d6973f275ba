from __future__ import annotations

from typer.testing import CliRunner

from bot.cli import app


def test_help_lists_the_commands() -> None:
    result = CliRunner().invoke(app, ["--help"])
    assert result.exit_code == 0
    for command in ("migrate", "doctor", "research", "plan", "runs", "export", "worker", "chat", "up", "slack"):
        assert command in result.output


def test_migrate_creates_the_schema_on_sqlite(tmp_path, monkeypatch) -> None:
    from sqlalchemy import inspect

    from storage.db import make_engine

    url = f"sqlite:///{tmp_path}/deep.db"
    monkeypatch.setenv("DATABASE_URL", url)
    result = CliRunner().invoke(app, ["migrate"])
    assert result.exit_code == 0, result.output
    tables = set(inspect(make_engine(url)).get_table_names())
    assert {"conversations", "messages", "runs", "sources", "passages", "citations", "events", "alembic_version"} <= tables


def test_up_reports_missing_llm_settings_in_one_line_before_starting_anything(tmp_path, monkeypatch) -> None:
    monkeypatch.setenv("DATABASE_URL", f"sqlite:///{tmp_path}/deep.db")
    result = CliRunner().invoke(app, ["up"])
    assert result.exit_code == 2
    assert result.output.strip().splitlines() == [result.output.strip()]
    assert "LLM_MODEL is not set" in result.output
    assert not (tmp_path / "deep.db").exists()


def test_log_format_json_writes_one_json_object_a_line() -> None:
    import json
    import logging

    from bot.cli import JsonLogFormatter, configure_logging
    from config import load_settings

    root = logging.getLogger()
    saved_handlers, saved_level = root.handlers[:], root.level
    try:
        configure_logging(load_settings(log_format="json", log_level="WARNING"))
        assert isinstance(root.handlers[-1].formatter, JsonLogFormatter) and root.level == logging.WARNING
    finally:
        root.handlers[:] = saved_handlers
        root.setLevel(saved_level)
    record = logging.LogRecord("deepthread.test", logging.INFO, __file__, 1, "run %s started", (7,), None)
    line = JsonLogFormatter().format(record)
    assert "\n" not in line and json.loads(line)["message"] == "run 7 started"


def test_research_options_are_checked_as_the_chat_checks_them(tmp_path, monkeypatch) -> None:
    monkeypatch.setenv("DATABASE_URL", f"sqlite:///{tmp_path}/never.db")
    for arguments, message in [(["--site", "not a domain"], "--site wants a domain"),
                               (["--since", "yesterday"], "--since wants a date"),
                               (["--deep", "--quick"], "Choose one of --deep or --quick"),
                               ([], None)]:
        question = "x" * 2_001 if not arguments else "why?"
        result = CliRunner().invoke(app, ["research", question, *arguments])
        assert result.exit_code == 2 and (message or "the limit is 2,000") in result.output
    assert not (tmp_path / "never.db").exists(), "nothing is created for a request refused"


def test_help_names_values_not_python_types() -> None:
    result = CliRunner().invoke(app, ["research", "--help"])
    assert result.exit_code == 0 and "--deep" in result.output and "--quick" in result.output
    assert "<str>" not in result.output and "<bool>" not in result.output and "YYYY-MM-DD" in result.output


def test_runs_has_a_header_and_export_says_when_a_run_does_not_exist(tmp_path, monkeypatch) -> None:
    monkeypatch.setenv("DATABASE_URL", f"sqlite:///{tmp_path}/runs.db")
    assert CliRunner().invoke(app, ["runs"]).output.strip() == "No runs yet."
    missing = CliRunner().invoke(app, ["export", "9999"])
    assert missing.exit_code == 1 and "Run 9999 does not exist" in missing.output


def test_a_markdown_report_is_drawn_on_a_terminal_and_left_raw_in_a_pipe(monkeypatch, capsys) -> None:
    import io

    from bot.cli import _write_report

    class Terminal(io.StringIO):
        def isatty(self) -> bool:
            return True

    terminal = Terminal()
    monkeypatch.setattr("sys.stdout", terminal)
    _write_report("# Title\n\nSome **bold** text.", "md", None)
    assert "**" not in terminal.getvalue() and "bold" in terminal.getvalue()
    pipe = io.StringIO()
    monkeypatch.setattr("sys.stdout", pipe)
    _write_report("# Title\n\nSome **bold** text.", "md", None)
    assert pipe.getvalue() == "# Title\n\nSome **bold** text.\n"


def test_request_urls_are_not_logged_at_info(tmp_path) -> None:
    import logging

    from bot.cli import configure_logging
    from config import load_settings

    root, httpx_logger = logging.getLogger(), logging.getLogger("httpx")
    saved_handlers, saved_level, saved_httpx_level = root.handlers[:], root.level, httpx_logger.level
    try:
        configure_logging(load_settings(log_level="INFO"), path=tmp_path / "log")
        assert not httpx_logger.isEnabledFor(logging.INFO)
        assert logging.getLogger("test_cli_probe").isEnabledFor(logging.INFO), "our own INFO lines still go out"
    finally:
        root.handlers[:] = saved_handlers
        root.setLevel(saved_level)
        httpx_logger.setLevel(saved_httpx_level)


def test_worker_concurrency_from_the_command_line_sizes_the_runtime_as_well_as_celery(tmp_path, monkeypatch) -> None:
    import worker.tasks as tasks

    started: list[list[str]] = []
    monkeypatch.setenv("DATABASE_URL", f"sqlite:///{tmp_path}/deepthread.db")
    monkeypatch.setenv("LLM_MODEL", "m")
    monkeypatch.setattr(tasks, "_settings", None)
    monkeypatch.setattr(tasks.app, "worker_main", lambda argv: started.append(argv))
    monkeypatch.setattr(tasks.app.conf, "broker_url", tasks.app.conf.broker_url)

    result = CliRunner().invoke(app, ["worker", "--concurrency", "7"])

    assert result.exit_code == 0, result.output
    assert "--concurrency=7" in started[0]
    # The runtime (database pool, loop threads, Redis pools) is built from them too, not from the environment's.
    import worker.service

    built: list[object] = []
    monkeypatch.setattr(tasks, "_runtime", None)
    monkeypatch.setattr(worker.service, "WorkerRuntime", lambda settings, **_: built.append(settings) or settings)
    tasks.runtime()
    assert [settings.worker_concurrency for settings in built] == [7]  # type: ignore[attr-defined]
