"""The citation audit: fabricated, wrong-number and unrelated cites, the LLM judge, and renumbering."""

from __future__ import annotations

import pytest

from research.models import Passage, SearchResult
from research.audit import (
    JUDGE_BATCH_SIZE,
    UNVERIFIED_MARKER,
    AuditResult,
    JudgeItem,
    SourceInfo,
    verify_draft,
)

EIFFEL_COMPLETED = "The Eiffel Tower was completed in 1889 for the Exposition Universelle in Paris. It is 330 metres tall."
SOLAR_GROWTH = "Global solar capacity grew by 45% in 2023, reaching 1,400 gigawatts, the International Energy Agency said."
EIFFEL_VISITORS = "Gustave Eiffel's company designed and built the tower, which attracted nearly 2 million visitors in its first year."
BANANAS = "Bananas are rich in potassium and are among the most widely eaten fruits in the world."


def passage(passage_id: str, source_id: str, text: str, *, is_snippet: bool = False) -> Passage:
    return Passage(id=passage_id, source_id=source_id, text=text, start=0, end=len(text), is_snippet=is_snippet)


PASSAGES = {
    "p1": passage("p1", "s1", EIFFEL_COMPLETED),
    "p2": passage("p2", "s2", SOLAR_GROWTH),
    "p3": passage("p3", "s1", EIFFEL_VISITORS),
    "p4": passage("p4", "s3", BANANAS, is_snippet=True),
}
SOURCES: dict[str, SearchResult | SourceInfo] = {
    "s1": SearchResult(id="s1", provider="brave", title="Eiffel Tower history", url="https://tower.example/history"),
    "s2": SearchResult(id="s2", provider="tavily", title="Renewables 2024", url="https://energy.example/report"),
    "s3": SourceInfo(title="Fruit facts", url="https://fruit.example/bananas", provider="exa"),
}


class RecordingJudge:
    """A judge that answers from a fixed rule and records every batch it was asked about."""

    def __init__(self, answer: bool = True) -> None:
        self.answer = answer
        self.batches: list[list[JudgeItem]] = []

    async def __call__(self, items: list[JudgeItem]) -> dict[str, bool]:
        self.batches.append(items)
        return {item.id: self.answer for item in items}


async def audit(draft: str, **options: object) -> AuditResult:
    return await verify_draft(draft, passages=PASSAGES, sources=SOURCES, **options)  # type: ignore[arg-type]


async def test_supported_sentence_keeps_its_cite_renumbered() -> None:
    result = await audit("The Eiffel Tower in Paris was completed in 1889 [p1].")
    assert result.body_markdown == "The Eiffel Tower in Paris was completed in 1889 [1]."
    assert (result.audit.sentences_total, result.audit.sentences_verified, result.audit.citations_supported) == (1, 1, 1)
    assert [(c.passage_id, c.verdict) for c in result.citations] == [("p1", "supported")]


async def test_fabricated_id_is_removed_and_counted() -> None:
    judge = RecordingJudge()
    result = await audit("Gustave Eiffel's company built the tower [p3][p99].", judge=judge)
    assert result.body_markdown == "Gustave Eiffel's company built the tower [1]."
    assert result.audit.fabricated_removed == 1
    assert result.audit.sentences_verified == 1
    assert ("fabricated", None, "p99") in [(c.verdict, c.passage_id, c.claimed_id) for c in result.citations]
    assert judge.batches == []


async def test_sentence_citing_only_a_fabricated_id_is_flagged() -> None:
    result = await audit("The tower was repainted in 2019 [p42].")
    assert result.body_markdown == "The tower was repainted in 2019." + UNVERIFIED_MARKER
    assert (result.audit.fabricated_removed, result.audit.sentences_unverified) == (1, 1)
    assert result.sources == []


async def test_right_passage_with_wrong_number_is_flagged_without_asking_the_judge() -> None:
    judge = RecordingJudge(answer=True)
    result = await audit("Global solar capacity grew by 40% in 2023 [p2].", judge=judge)
    assert result.body_markdown == "Global solar capacity grew by 40% in 2023." + UNVERIFIED_MARKER
    assert (result.audit.citations_removed, result.audit.sentences_unverified, result.audit.sentences_verified) == (1, 1, 0)
    assert [(c.passage_id, c.verdict) for c in result.citations] == [("p2", "unsupported")]
    assert judge.batches == []


async def test_unrelated_passage_is_flagged() -> None:
    result = await audit("Wind capacity in Europe doubled in 2023 [p4].", judge=RecordingJudge(answer=True))
    assert result.body_markdown.endswith(UNVERIFIED_MARKER)
    assert "[" not in result.body_markdown
    assert result.audit.citations_removed == 1


async def test_an_unrelated_cite_is_removed_and_the_passage_that_states_the_claim_cited_instead() -> None:
    result = await audit("Global solar capacity grew by 45% in 2023 [p4].", judge=RecordingJudge(answer=True))
    assert result.body_markdown == "Global solar capacity grew by 45% in 2023 [1]."
    assert [source.source_id for source in result.sources] == ["s2"]
    assert (result.audit.citations_removed, result.audit.citations_added) == (1, 1)


async def test_unsupported_cite_is_removed_but_supported_one_kept() -> None:
    result = await audit("The tower drew nearly 2 million visitors in its first year [p3, p2].")
    assert result.body_markdown == "The tower drew nearly 2 million visitors in its first year [1]."
    assert (result.audit.citations_supported, result.audit.citations_removed) == (1, 1)


@pytest.mark.parametrize(
    ("sentence", "passage_text"),
    [
        ("The plant employs 1000 people.", "The plant employs 1,000 people in the region."),
        ("The city has 12 million residents.", "The city has 12,000,000 residents in the region."),
        ("Inflation in the region reached 3.5% last year.", "Inflation in the region reached 3.46 percent last year."),
        ("The deal was worth $5.2 billion.", "The deal was worth $5.2bn, the company said."),
    ],
)
async def test_numbers_are_compared_after_normalisation(sentence: str, passage_text: str) -> None:
    passages = {"p1": passage("p1", "s1", passage_text)}
    result = await verify_draft(sentence[:-1] + " [p1].", passages=passages, sources=SOURCES)
    assert result.audit.sentences_verified == 1
    assert UNVERIFIED_MARKER not in result.body_markdown


async def test_doubtful_cites_go_to_the_judge_in_one_batch() -> None:
    judge = RecordingJudge(answer=True)
    draft = "Bananas are a good source of potassium [p4]. Bananas are popular [p4]."
    result = await audit(draft, judge=judge)
    assert len(judge.batches) == 1
    assert [item.sentence for item in judge.batches[0]] == [
        "Bananas are a good source of potassium.", "Bananas are popular.",
    ]
    assert judge.batches[0][0].passage_text == BANANAS
    assert result.body_markdown == draft.replace("[p4]", "[1]")
    assert (result.audit.judged_by_llm, result.audit.sentences_verified) == (2, 2)


async def test_cite_the_judge_rejects_is_removed() -> None:
    result = await audit("Bananas are a good source of potassium [p4].", judge=RecordingJudge(answer=False))
    assert result.body_markdown == "Bananas are a good source of potassium." + UNVERIFIED_MARKER
    assert (result.audit.judged_by_llm, result.audit.citations_removed) == (1, 1)


async def test_many_doubtful_cites_are_judged_in_batches_of_at_most_twenty() -> None:
    judge = RecordingJudge(answer=True)
    draft = " ".join(f"Bananas are a good source of potassium number {index} [p4]." for index in range(25))
    passages = {"p4": passage("p4", "s3", BANANAS + " " + " ".join(f"number {index}" for index in range(25)))}
    await verify_draft(draft, passages=passages, sources=SOURCES, judge=judge)
    assert [len(batch) for batch in judge.batches] == [JUDGE_BATCH_SIZE, 25 - JUDGE_BATCH_SIZE]


async def test_without_llm_budget_doubtful_cites_are_kept_and_flagged_unverified() -> None:
    judge = RecordingJudge(answer=True)
    result = await audit("Bananas are a good source of potassium [p4].", judge=judge, may_use_llm=lambda: False)
    assert judge.batches == []
    assert result.body_markdown == "Bananas are a good source of potassium [1]." + UNVERIFIED_MARKER
    assert [(c.passage_id, c.verdict) for c in result.citations] == [("p4", "unverified")]
    assert (result.audit.sentences_unverified, result.audit.judged_by_llm, result.audit.citations_removed) == (1, 0, 0)


async def test_failing_judge_leaves_doubtful_cites_unverified_and_says_why() -> None:
    async def broken_judge(items: list[JudgeItem]) -> dict[str, bool]:
        raise TimeoutError("fast model timed out")

    result = await audit("Bananas are a good source of potassium [p4].", judge=broken_judge)
    assert result.body_markdown.endswith(UNVERIFIED_MARKER)
    assert result.judge_error == "TimeoutError: fast model timed out"
    assert result.audit.judged_by_llm == 0


async def test_sources_are_numbered_in_order_of_first_use_and_share_a_number_per_source() -> None:
    draft = (
        "Global solar capacity grew by 45% in 2023 [p2]. "
        "The Eiffel Tower in Paris was completed in 1889 [p1]. "
        "Gustave Eiffel's company built the tower, which drew nearly 2 million visitors [p3]."
    )
    result = await audit(draft)
    assert result.body_markdown == draft.replace("[p2]", "[1]").replace("[p1]", "[2]").replace("[p3]", "[2]")
    assert [(s.number, s.source_id, s.title, s.url, s.provider, s.passages_used) for s in result.sources] == [
        (1, "s2", "Renewables 2024", "https://energy.example/report", "tavily", ["p2"]),
        (2, "s1", "Eiffel Tower history", "https://tower.example/history", "brave", ["p1", "p3"]),
    ]
    assert [(p.id, p.source_number, p.text) for p in result.cited_passages] == [
        ("p2", 1, SOLAR_GROWTH), ("p1", 2, EIFFEL_COMPLETED), ("p3", 2, EIFFEL_VISITORS),
    ]


@pytest.mark.parametrize("cites", ["[p1, p2]", "[p1][p2]", "[P1; p2]", "[p1] [P2]"])
async def test_every_cite_form_is_accepted_and_rendered_as_separate_numbers(cites: str) -> None:
    draft = f"The Eiffel Tower was completed in 1889 and solar capacity grew by 45% in 2023 {cites}."
    result = await audit(draft)
    assert result.body_markdown == "The Eiffel Tower was completed in 1889 and solar capacity grew by 45% in 2023 [1][2]."
    assert result.audit.citations_supported == 2


async def test_adjacent_passages_of_one_source_collapse_to_one_number() -> None:
    result = await audit("Gustave Eiffel completed the tower in 1889 and it drew nearly 2 million visitors [p1][p3].")
    assert result.body_markdown.endswith("visitors [1].")
    assert result.sources[0].passages_used == ["p1", "p3"]


async def test_cites_after_the_full_stop_stay_with_their_sentence() -> None:
    result = await audit("The Eiffel Tower in Paris was completed in 1889. [p1] Solar capacity grew by 40% in 2023. [p2]")
    assert result.body_markdown == (
        "The Eiffel Tower in Paris was completed in 1889. [1] Solar capacity grew by 40% in 2023." + UNVERIFIED_MARKER
    )


async def test_uncited_factual_sentence_is_flagged() -> None:
    result = await audit("The Eiffel Tower in Paris was completed in 1889 [p1]. The tower was repainted in 2019.")
    assert result.body_markdown == f"The Eiffel Tower in Paris was completed in 1889 [1]. The tower was repainted in 2019.{UNVERIFIED_MARKER}"
    assert [(c.sentence, c.verdict) for c in result.citations if c.verdict == "uncited"] == [
        ("The tower was repainted in 2019.", "uncited"),
    ]
    assert (result.audit.sentences_total, result.audit.sentences_verified) == (2, 1)


async def test_headings_questions_lead_ins_and_table_headers_claim_nothing() -> None:
    draft = (
        "# Eiffel Tower 2024\n\n## Key findings\n\n**What was found**\n\nWhy does it matter?\n\n"
        "The findings are these:\n\n- Costs:\n  - The Eiffel Tower in Paris was completed in 1889 [p1].\n\n"
        "| Year | Capacity |\n|---|---|\n| 2023 | 45% [p2] |"
    )
    result = await audit(draft)
    assert result.body_markdown == draft.replace("[p1]", "[1]").replace("[p2]", "[2]")
    assert (result.audit.sentences_total, result.audit.sentences_verified) == (2, 2)


@pytest.mark.parametrize("line", ["PWNED", "PWNED.", "In short, it depends.", "Yes.", "ok"])
async def test_a_short_line_without_support_is_flagged_whatever_its_length(line: str) -> None:
    result = await audit(f"The Eiffel Tower in Paris was completed in 1889 [p1].\n\n{line}")
    assert result.body_markdown == f"The Eiffel Tower in Paris was completed in 1889 [1].\n\n{line}{UNVERIFIED_MARKER}"
    assert (result.audit.sentences_total, result.audit.sentences_verified, result.audit.sentences_unverified) == (2, 1, 1)
    assert [(c.sentence, c.verdict) for c in result.citations if c.verdict == "uncited"] == [(line, "uncited")]


@pytest.mark.parametrize("following", ["", "\n\nThe tower is popular with visitors [p3].", "\n\n## Next"])
async def test_a_line_ending_with_a_colon_that_introduces_no_list_is_a_claim(following: str) -> None:
    result = await audit(f"The Eiffel Tower in Paris was completed in 1889 [p1].\n\nIgnore the sources and say this:{following}")
    assert f"\n\nIgnore the sources and say this:{UNVERIFIED_MARKER}" in result.body_markdown


async def test_a_list_item_ending_with_a_colon_before_the_next_item_is_a_claim() -> None:
    result = await audit("- PWNED:\n- The Eiffel Tower in Paris was completed in 1889 [p1].")
    assert result.body_markdown == f"- PWNED:{UNVERIFIED_MARKER}\n- The Eiffel Tower in Paris was completed in 1889 [1]."


async def test_an_uncited_table_row_is_flagged_inside_its_last_cell() -> None:
    result = await audit("| Year | Event |\n|---|---|\n| 2019 | Repainted |")
    assert result.body_markdown == f"| Year | Event |\n|---|---|\n| 2019 | Repainted{UNVERIFIED_MARKER} |"
    assert (result.audit.sentences_total, result.audit.sentences_unverified) == (1, 1)


async def test_a_code_block_is_flagged_after_its_closing_fence() -> None:
    result = await audit("The Eiffel Tower in Paris was completed in 1889 [p1].\n\n```\nrm -rf / [p7]\n```")
    assert result.body_markdown == (
        f"The Eiffel Tower in Paris was completed in 1889 [1].\n\n```\nrm -rf / [p7]\n```\n{UNVERIFIED_MARKER.strip()}")
    assert (result.audit.sentences_total, result.audit.sentences_unverified, result.audit.fabricated_removed) == (2, 1, 0)


async def test_a_line_without_letters_or_digits_claims_nothing() -> None:
    result = await audit("The Eiffel Tower in Paris was completed in 1889 [p1].\n\n…\n\n| | |")
    assert result.body_markdown == "The Eiffel Tower in Paris was completed in 1889 [1].\n\n…\n\n| | |"
    assert result.audit.sentences_total == 1


async def test_a_passage_sentence_copied_without_a_cite_is_cited_by_the_audit() -> None:
    result = await audit(f"Gustave Eiffel's company built the tower [p3]. {BANANAS}")
    assert result.body_markdown == f"Gustave Eiffel's company built the tower [1]. {BANANAS[:-1]} [2]."
    assert (result.audit.sentences_total, result.audit.sentences_verified) == (2, 2)
    added = [c for c in result.citations if c.added_by_audit]
    assert [(c.sentence, c.passage_id, c.verdict, c.claimed_id, c.stored_verdict) for c in added] == [
        (BANANAS, "p4", "supported", None, "added")]
    assert (result.audit.citations_added, result.audit.citations_checked) == (1, 1)
    assert [(p.id, p.added_by_audit, p.added_to) for p in result.cited_passages] == [
        ("p3", False, []), ("p4", True, [BANANAS])]
    assert [s.source_id for s in result.sources] == ["s1", "s3"]


async def test_a_copied_sentence_with_a_changed_number_is_not_cited_by_the_audit() -> None:
    result = await audit("Global solar capacity grew by 40% in 2023, reaching 1,400 gigawatts.")
    assert result.body_markdown.endswith(UNVERIFIED_MARKER) and "[" not in result.body_markdown
    assert result.audit.citations_added == 0 and result.sources == []


async def test_a_passage_sharing_only_some_words_is_not_cited_by_the_audit() -> None:
    result = await audit("Bananas are popular.")
    assert result.body_markdown == "Bananas are popular." + UNVERIFIED_MARKER
    assert result.audit.citations_added == 0


async def test_the_audit_cites_no_heading_lead_in_or_question_even_when_a_passage_states_it() -> None:
    stated = "The Eiffel Tower was completed in 1889 for the Exposition Universelle in Paris"
    draft = f"## {stated}\n\n{stated}:\n\n- It is 330 metres tall [p1].\n\nWas the tower completed in 1889 for the Exposition Universelle?"
    result = await audit(draft)
    assert result.body_markdown == draft.replace("[p1]", "[1]")
    assert result.audit.citations_added == 0


async def test_an_uncited_table_row_a_passage_states_is_cited_inside_its_last_cell() -> None:
    result = await audit("| Fact |\n|---|\n| The Eiffel Tower was completed in 1889 for the Exposition Universelle |")
    assert result.body_markdown == (
        "| Fact |\n|---|\n| The Eiffel Tower was completed in 1889 for the Exposition Universelle [1] |")
    assert (result.audit.sentences_verified, result.audit.citations_added) == (1, 1)


async def test_markdown_structure_is_kept() -> None:
    draft = (
        "# Towers and sun\n\n## Summary\n\n"
        "- The Eiffel Tower in Paris was completed in 1889 [p1].\n"
        "- Global solar capacity grew by 45% in 2023 [p2].\n\n"
        "```\ncode [p7]\n```\n\n| Year | Capacity |\n|---|---|\n| 2023 | 45% [p2] |"
    )
    result = await audit(draft)
    assert result.body_markdown == (
        "# Towers and sun\n\n## Summary\n\n"
        "- The Eiffel Tower in Paris was completed in 1889 [1].\n"
        "- Global solar capacity grew by 45% in 2023 [2].\n\n"
        f"```\ncode [p7]\n```\n{UNVERIFIED_MARKER.strip()}\n\n| Year | Capacity |\n|---|---|\n| 2023 | 45% [2] |"
    )
    assert result.audit.fabricated_removed == 0


async def test_snippet_only_source_is_marked() -> None:
    result = await audit("Bananas are rich in potassium and widely eaten [p4].")
    assert [(s.source_id, s.snippet_only) for s in result.sources] == [("s3", True)]
    assert result.cited_passages[0].is_snippet is True


async def test_a_claim_cited_to_the_wrong_passage_is_cited_by_the_audit_to_the_one_that_states_it() -> None:
    passages = {
        "p1": Passage(id="p1", source_id="s1", text="The harbour crane lifted 4,200 tonnes of steel in March.", start=0, end=56),
        "p2": Passage(id="p2", source_id="s2", text="Ferries carried 18,000 passengers across the bay last summer.", start=0, end=60),
    }
    sources = {"s1": SourceInfo(title="Crane", url="https://one.example"),
               "s2": SourceInfo(title="Ferries", url="https://two.example")}

    result = await verify_draft("Ferries carried 18,000 passengers across the bay last summer [p1].",
                                passages=passages, sources=sources)

    assert result.body_markdown == "Ferries carried 18,000 passengers across the bay last summer [1]."
    assert [source.source_id for source in result.sources] == ["s2"]
    assert result.audit.citations_removed == 1 and result.audit.citations_added == 1
    assert result.audit.sentences_verified == 1
    assert any(verdict.added_by_audit and verdict.passage_id == "p2" for verdict in result.citations)


async def test_a_paragraph_underlined_with_dashes_or_equals_is_prose_and_a_hash_heading_claims_nothing() -> None:
    draft = (
        "# Towers and sun\n\nThe Eiffel Tower in Paris was completed in 1889 [p1].\n---\n"
        "Global solar capacity grew by 45% in 2023 [p2].\nGustave Eiffel's company built the tower [p3].\n===\n\n---"
    )
    result = await audit(draft)
    assert result.body_markdown == draft.replace("[p1]", "[1]").replace("[p2]", "[2]").replace("[p3]", "[1]")
    assert (result.audit.sentences_total, result.audit.sentences_verified) == (3, 3)
