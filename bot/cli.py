"""The `deepthread` command: the composition root, where settings meet every package."""

from __future__ import annotations

import sys

import httpx
import typer

from config import Settings, SettingsError, load_settings

app = typer.Typer(
    help="deepthread: a research bot for Slack and Discord that cites every claim.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)


def settings_or_exit() -> Settings:
    """The settings, or exit 2 with the one-line reason naming the bad variable."""
    try:
        return load_settings()
    except SettingsError as error:
        typer.echo(str(error), err=True)
        raise typer.Exit(code=2) from None


@app.command()
def migrate(revision: str = typer.Argument("head", help="Alembic revision to upgrade to.")) -> None:
    """Create or upgrade the database schema at DATABASE_URL."""
    from storage.migrate import upgrade

    settings = settings_or_exit()
    upgrade(settings.database_url, revision)
    typer.echo(f"Database is at revision {revision}.")


@app.command()
def doctor() -> None:
    """Check every component: configured or not, reachable, what is missing (secrets masked)."""
    from bot.doctor import format_checks, run_checks

    settings = settings_or_exit()
    with httpx.Client(timeout=5.0) as http:
        checks = run_checks(settings, http)
    typer.echo(format_checks(checks))
    if any(check.failed for check in checks):
        raise typer.Exit(code=1)


def main() -> None:
    app(prog_name="deepthread")


if __name__ == "__main__":
    sys.exit(main())
