from __future__ import annotations

from typer.testing import CliRunner

from bot.cli import app


def test_help_lists_the_commands() -> None:
    result = CliRunner().invoke(app, ["--help"])
    assert result.exit_code == 0
    for command in ("migrate", "doctor"):
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
