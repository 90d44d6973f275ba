"""The plain words that refuse a run over a daily quota: which limit, the numbers, and when it resets."""

from __future__ import annotations

import datetime as dt

from chat.status import format_elapsed
from storage.quotas import QuotaReached


def quota_refusal_text(reached: QuotaReached, now: dt.datetime) -> str:
    """The refusal for `reached`, with its reset time in UTC and how long until then from `now`."""
    resets = f"{reached.resets_at:%H:%M} UTC (in {format_elapsed((reached.resets_at - now).total_seconds())})"
    if reached.limit == "runs_per_user":
        started = int(reached.used)
        return (f"You have started {started} {'run' if started == 1 else 'runs'} today, the daily limit of "
                f"{int(reached.allowed)}. It resets at {resets}.")
    return (f"This workspace has spent ${reached.used:,.2f} on the language model today, reaching its daily limit of "
            f"${reached.allowed:,.2f}. Runs already going will finish; new ones can start again at {resets}.")
