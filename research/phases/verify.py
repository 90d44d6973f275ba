"""Verify: the draft's citations audited against the passages the model was shown (research.audit does the work)."""

from research.audit import AuditResult, Judge, JudgeItem, verify_draft

__all__ = ["AuditResult", "Judge", "JudgeItem", "verify_draft"]
