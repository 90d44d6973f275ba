"""The prompts the engine sends, as text files beside this module, filled with `str.format`."""

from __future__ import annotations

import datetime as dt
from functools import cache
from pathlib import Path

HERE = Path(__file__).parent


@cache
def _template(name: str) -> str:
    return (HERE / f"{name}.md").read_text(encoding="utf-8")


def render(name: str, **values: object) -> str:
    """The prompt `name` with `values` filled in; raises KeyError for a missing value."""
    return _template(name).format(**values)


def system_prompt(role: str, today: dt.date) -> str:
    """The shared system prompt: date, honesty and citation rules, the untrusted-data rule, then `role`."""
    from research.untrusted import UNTRUSTED_RULE

    return render("system", today=today.isoformat(), untrusted_rule=UNTRUSTED_RULE, role=render(role))
