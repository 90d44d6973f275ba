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


# How to cite, told to a model that is shown passages. The id is described, never shown as an example: a weak model
# copies an example marker as if it were real (into its report, and into search queries).
CITATION_RULE = (
    "- When you rely on a source passage, cite it inline right after the claim it supports: its id (given in the "
    'id="..." of its source block) in square brackets. Cite only ids you were shown; several passages, several '
    "bracketed ids.\n"
)


def system_prompt(role: str, today: dt.date, *, cites: bool = True) -> str:
    """The shared system prompt: date, honesty rules (with how to cite passages, when the model is shown any and
    `cites`), the untrusted-data rule, then `role`."""
    from research.untrusted import UNTRUSTED_RULE

    return render("system", today=today.isoformat(), untrusted_rule=UNTRUSTED_RULE, role=render(role),
                  citation_rule=CITATION_RULE if cites else "")
