"""The citation audit, one module a job: the model's answer normalised (`draft`), citation spellings read
(`citations`), Markdown blocks, sentences, numbers, lexical evidence, and the audit with renumbering."""

from research.audit.audit import (
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
