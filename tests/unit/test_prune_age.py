"""`deepthread prune --older-than AGE`: minutes are `min`, months `mo`; a bare `m`, minutes or months, is refused."""

from __future__ import annotations

import datetime as dt
from pathlib import Path

import pytest
from typer.testing import CliRunner

from bot.cli import app
from storage.retention import parse_age


@pytest.mark.parametrize(("text", "age"), [("30min", dt.timedelta(minutes=30)), ("3mo", dt.timedelta(days=90)),
                                           ("1MO", dt.timedelta(days=30)), ("12h", dt.timedelta(hours=12))])
def test_minutes_are_min_and_months_are_mo_of_30_days(text: str, age: dt.timedelta) -> None:
    assert parse_age(text) == age


@pytest.mark.parametrize("text", ["1m", "30m", " 6M "])
def test_a_bare_m_is_refused_as_it_could_mean_minutes_or_months(text: str) -> None:
    number = text.strip()[:-1]
    with pytest.raises(ValueError, match=f"could mean minutes or months: write {number}min or {number}mo"):
        parse_age(text)


def test_prune_refuses_a_bare_m_before_deleting_anything(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("DATABASE_URL", f"sqlite:///{tmp_path}/never.db")
    result = CliRunner().invoke(app, ["prune", "--older-than", "1m"])
    assert result.exit_code == 2 and "'1m' could mean minutes or months: write 1min or 1mo" in result.output
    assert not (tmp_path / "never.db").exists()


def test_prunes_help_names_the_units() -> None:
    help_text = " ".join(CliRunner().invoke(app, ["prune", "--help"]).output.split())
    assert "30min" in help_text and "3mo" in help_text and "30m," not in help_text
