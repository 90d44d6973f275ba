"""Daily quotas, counted in SQL so that every bot and worker process agrees: runs a person started, LLM cost a workspace spent.

A day is a UTC day. A workspace's cost for the day is what its runs started that day have spent so
far, summed from their stored `llm_usage` events, so runs in flight and runs that failed count too.
"""

from __future__ import annotations

import datetime as dt
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field
from sqlalchemy import and_, func, not_, select
from sqlalchemy.orm import Session

from config import setting_default
from storage.models import Event, Run

ONE_DAY = dt.timedelta(days=1)


class DailyQuotas(BaseModel):
    """The daily limits; 0 turns a limit off."""

    model_config = ConfigDict(frozen=True)

    runs_per_user: int = Field(default=setting_default("daily_runs_per_user"), ge=0)
    cost_per_workspace: float = Field(default=setting_default("daily_cost_per_workspace"), ge=0)

    @classmethod
    def from_settings(cls, settings: Any) -> DailyQuotas:
        """DAILY_RUNS_PER_USER and DAILY_COST_PER_WORKSPACE."""
        return cls(runs_per_user=settings.daily_runs_per_user, cost_per_workspace=settings.daily_cost_per_workspace)

    @property
    def enabled(self) -> bool:
        return self.runs_per_user > 0 or self.cost_per_workspace > 0


class QuotaReached(BaseModel):
    """Which daily limit refuses a new run, how much of it is used, and when it resets."""

    model_config = ConfigDict(frozen=True)

    limit: Literal["runs_per_user", "cost_per_workspace"]
    used: float
    allowed: float
    resets_at: dt.datetime


def day_start(now: dt.datetime) -> dt.datetime:
    """Midnight UTC at the start of `now`'s UTC day."""
    utc = now.astimezone(dt.timezone.utc)
    return utc.replace(hour=0, minute=0, second=0, microsecond=0)


def runs_started_since(session: Session, user: str, since: dt.datetime) -> int:
    """Runs `user` asked for since `since`, leaving out those cancelled before they ever started (they cost nothing)."""
    never_started = and_(Run.state == "cancelled", Run.started_at.is_(None))
    return session.scalar(select(func.count()).select_from(Run).where(
        Run.requested_by == user, Run.created_at >= since, not_(never_started))) or 0


def workspace_cost_since(session: Session, workspace: str, since: dt.datetime) -> float:
    """LLM cost (USD) spent so far by the runs `workspace` started since `since`."""
    runs_of_the_day = select(Run.id).where(Run.workspace == workspace, Run.created_at >= since)
    spent = session.scalar(select(func.sum(Event.payload["cost"].as_float())).where(
        Event.run_id.in_(runs_of_the_day), Event.type == "llm_usage"))
    return float(spent or 0.0)


def quota_reached(session: Session, quotas: DailyQuotas, *, user: str, workspace: str,
                  now: dt.datetime) -> QuotaReached | None:
    """The first daily limit that a new run by `user` in `workspace` would break at `now`, or None."""
    since = day_start(now)
    resets_at = since + ONE_DAY
    if quotas.runs_per_user > 0:
        started = runs_started_since(session, user, since)
        if started >= quotas.runs_per_user:
            return QuotaReached(limit="runs_per_user", used=started, allowed=quotas.runs_per_user, resets_at=resets_at)
    if quotas.cost_per_workspace > 0:
        spent = workspace_cost_since(session, workspace, since)
        if spent >= quotas.cost_per_workspace:
            return QuotaReached(limit="cost_per_workspace", used=spent, allowed=quotas.cost_per_workspace,
                                resets_at=resets_at)
    return None
