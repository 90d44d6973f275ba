"""Verify: the draft's citations audited against the passages the model was shown (research.audit does the work)."""

from research.audit import (
    JUDGE_BATCH_SIZE,
    UNVERIFIED_MARKER,
    AuditResult,
    CitationVerdict,
    Judge,
    JudgeItem,
    SourceInfo,
    verify_draft,
)

__all__ = ["JUDGE_BATCH_SIZE", "UNVERIFIED_MARKER", "AuditResult", "CitationVerdict", "Judge", "JudgeItem", "SourceInfo",
           "verify_draft"]
