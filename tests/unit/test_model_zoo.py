"""The model zoo: each misbehaving fake model, driven over the wire, sends exactly the misbehaviour it imitates."""

from __future__ import annotations

import json
import re
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import httpx
import pytest

from research.untrusted import fence_untrusted
from tests.fakes.llm import ChatRequest, FakeLLM, FakeReply, citing_synthesis, default_research_model, passages_in
from tests.fakes.model_zoo import (
    CITATION_SPELLINGS,
    CLOSING_CHATTER,
    JSON_PREAMBLE,
    MODEL_ZOO,
    OPENING_CHATTER,
    ZooModel,
    cut_mid_sentence,
    is_continuation,
    is_report_request,
    respell_citations,
    truncating_once,
    with_chatter,
    with_citation_spelling,
    with_reasoning_block,
    zoo_model,
)

QUESTION = "How tall is the tower?"
# Shown out of numeric order, so a passage's position in the prompt is not its id's number.
PASSAGES = [
    ("p3", "Tower facts", "https://alpha.example/tower", "The tower is 330 metres tall. It opened in 1889."),
    ("p4", "City facts", "https://beta.example/city", "Paris is the capital of France. About 2.1 million people live there."),
    ("p1", "River facts", "https://gamma.example/river", "The Seine is 777 kilometres long. It flows into the Channel."),
    ("p2", "Bridge facts", "https://delta.example/bridge", "The city has 37 bridges over the Seine. The oldest is the Pont Neuf."),
]
FACTS = ["The tower is 330 metres tall", "Paris is the capital of France", "The Seine is 777 kilometres long",
         "The city has 37 bridges over the Seine"]
STRUCTURED = ("decomposition", "gap_check", "citation_check", "plan")
CONTINUE = "Your answer was cut off. Continue exactly where you stopped, without repeating anything."


def report_messages(question: str = QUESTION) -> list[dict[str, Any]]:
    fenced = "\n\n".join(fence_untrusted(*passage) for passage in PASSAGES)
    return [
        {"role": "system", "content": "Write the research report. Cite passages like [p3]."},
        {"role": "user", "content": f"Question:\n{question}\n\nSource passages:\n{fenced}"},
    ]


def report_body(**extra: Any) -> dict[str, Any]:
    return {"model": "fake-model", "messages": report_messages(), **extra}


def continuation_body(partial: str, **extra: Any) -> dict[str, Any]:
    messages = [*report_messages(), {"role": "assistant", "content": partial}, {"role": "user", "content": CONTINUE}]
    return {"model": "fake-model", "messages": messages, **extra}


def structured_body(name: str, **extra: Any) -> dict[str, Any]:
    response_format = {"type": "json_schema", "json_schema": {"name": name, "schema": {"type": "object"}, "strict": True}}
    return {"model": "fake-model", "messages": report_messages(), "response_format": response_format, **extra}


def json_mode_body(name: str) -> dict[str, Any]:
    """A structured request as sent after a response_format rejection: the schema is named in the prompt only."""
    messages = report_messages()
    messages[0] = {"role": "system", "content": f"Reply with a single JSON object (schema name: {name}) that matches the schema."}
    return {"model": "fake-model", "messages": messages}


def chat_body() -> dict[str, Any]:
    return {"model": "fake-model", "messages": [{"role": "user", "content": "Hello there?"}]}


def request_of(body: dict[str, Any]) -> ChatRequest:
    return ChatRequest.from_body(body)


REPORT = citing_synthesis(request_of(report_body()))


def expected_json(body: dict[str, Any]) -> Any:
    return default_research_model(request_of(body))


def fake_for(model: ZooModel | str) -> FakeLLM:
    model = zoo_model(model) if isinstance(model, str) else model
    return FakeLLM(model.handler, **model.fake_options)


async def post(fake: FakeLLM, body: dict[str, Any]) -> httpx.Response:
    async with fake.http_client() as client:
        return await client.post(f"{fake.base_url}/chat/completions", json=body)


async def answer(fake: FakeLLM, body: dict[str, Any]) -> tuple[dict[str, Any], str]:
    """The completion's message and finish_reason, after checking it was a 200."""
    response = await post(fake, body)
    assert response.status_code == 200, response.text
    [choice] = response.json()["choices"]
    return choice["message"], choice["finish_reason"]


async def content_of(fake: FakeLLM, body: dict[str, Any]) -> str:
    message, _finish = await answer(fake, body)
    return message["content"]


def after_think(content: str) -> str:
    return content.split("</think>", 1)[1].strip()


def assert_detectable_reasoning(reasoning: str) -> None:
    assert "[p1]" in reasoning and "[p3]" in reasoning, "reasoning should mention shown passage ids"
    assert "[p999]" in reasoning, "reasoning should mention a made-up passage id"
    assert "Sources" in reasoning
    assert re.search(r"^# Draft title$", reasoning, re.MULTILINE)
    assert len(reasoning) > 1000


# --- the zoo itself -------------------------------------------------------------------------------------------


def test_zoo_names_every_behaviour_with_a_one_line_description() -> None:
    expected = {
        "well_behaved", "think_blocks", "think_tag_swallowed", "reasoning_content", "fenced_json", "rejects_response_format",
        "fenced_report", "chatter", "own_title", "own_source_list", "own_references_list",
        *(f"cites_{spelling}" for spelling in CITATION_SPELLINGS),
        "truncated_always", "truncated_once", "thinks_until_limit", "truncated_json", "no_usage", "kitchen_sink",
    }
    assert set(MODEL_ZOO) == expected
    assert {f"cites_{s}" for s in CITATION_SPELLINGS} >= {
        "cites_upper", "cites_list", "cites_adjacent", "cites_range", "cites_parens", "cites_lenticular", "cites_footnote",
        "cites_source_label", "cites_link", "cites_numbered", "cites_numbered_list", "cites_numbered_adjacent",
    }
    for name, model in MODEL_ZOO.items():
        assert model.name == name
        assert model.description.strip() and "\n" not in model.description
        assert callable(model.handler)


def test_zoo_model_builds_a_fresh_instance_and_rejects_unknown_names() -> None:
    assert zoo_model("truncated_once").handler is not zoo_model("truncated_once").handler
    assert zoo_model("chatter").description == MODEL_ZOO["chatter"].description
    with pytest.raises(KeyError, match="no zoo model"):
        zoo_model("gpt-9")


def test_well_behaved_is_the_default_research_model_unchanged() -> None:
    model = MODEL_ZOO["well_behaved"]
    assert model.handler is default_research_model and model.fake_options == {}


@pytest.mark.parametrize("name", sorted(MODEL_ZOO))
async def test_every_zoo_model_answers_every_request_kind(name: str) -> None:
    fake = fake_for(name)

    for body in [*(json_mode_body(schema) for schema in STRUCTURED), report_body(), chat_body()]:
        message, finish_reason = await answer(fake, body)
        assert isinstance(message["content"], str) and message["content"].strip()
        assert finish_reason in {"stop", "length"}
    assert fake.handler_errors == []


# --- reasoning ------------------------------------------------------------------------------------------------


async def test_think_blocks_open_structured_and_text_answers_with_detectable_reasoning() -> None:
    fake = fake_for("think_blocks")

    for schema in STRUCTURED:
        content = await content_of(fake, structured_body(schema))
        assert content.startswith("<think>\n") and content.count("</think>") == 1
        assert json.loads(after_think(content)) == expected_json(structured_body(schema))
    report = await content_of(fake, report_body())
    chat = await content_of(fake, chat_body())

    assert report.startswith("<think>\n")
    assert_detectable_reasoning(report[len("<think>"):report.index("</think>")])
    assert after_think(report) == REPORT
    assert chat.startswith("<think>") and after_think(chat) == "Here is a short answer about Hello there."


async def test_think_tag_swallowed_starts_with_reasoning_then_a_lone_closing_tag() -> None:
    fake = fake_for("think_tag_swallowed")

    report = await content_of(fake, report_body())
    decomposition = await content_of(fake, structured_body("decomposition"))

    assert "<think>" not in report and report.count("</think>") == 1
    assert_detectable_reasoning(report.split("</think>")[0])
    assert after_think(report) == REPORT
    assert "<think>" not in decomposition
    assert json.loads(after_think(decomposition)) == expected_json(structured_body("decomposition"))


async def test_reasoning_content_goes_in_its_own_field_and_the_content_stays_clean() -> None:
    fake = fake_for("reasoning_content")

    report, _ = await answer(fake, report_body())
    gap, _ = await answer(fake, structured_body("gap_check"))

    assert report["content"] == REPORT
    assert_detectable_reasoning(report["reasoning_content"])
    assert json.loads(gap["content"]) == {"covered": True, "sub_questions": [], "more_queries": []}
    assert "[p999]" in gap["reasoning_content"]


async def test_thinks_until_limit_spends_a_small_budget_on_unclosed_reasoning() -> None:
    fake = fake_for("thinks_until_limit")

    small, small_finish = await answer(fake, report_body(max_tokens=4000))
    completion, completion_finish = await answer(fake, report_body(max_completion_tokens=8000))
    large, large_finish = await answer(fake, report_body(max_tokens=16000))
    structured, structured_finish = await answer(fake, structured_body("plan", max_tokens=500))

    assert small["content"].startswith("<think>\n") and "</think>" not in small["content"]
    assert "## Findings" not in small["content"] and small_finish == "length"
    assert completion["content"].startswith("<think>") and completion_finish == "length"
    assert large["content"] == REPORT and large_finish == "stop"
    assert json.loads(structured["content"]) == expected_json(structured_body("plan")) and structured_finish == "stop"


# --- structured answers ----------------------------------------------------------------------------------------


async def test_fenced_json_wraps_structured_answers_after_a_chatty_sentence() -> None:
    fake = fake_for("fenced_json")

    for schema in STRUCTURED:
        content = await content_of(fake, structured_body(schema))
        fenced = re.fullmatch(rf"{re.escape(JSON_PREAMBLE)}\n\n```json\n(.*)\n```", content, re.DOTALL)
        assert fenced, content
        assert json.loads(fenced.group(1)) == expected_json(structured_body(schema))
    assert await content_of(fake, report_body()) == REPORT


@pytest.mark.parametrize("kind", ["json_schema", "json_object"])
async def test_rejects_response_format_answers_400(kind: str) -> None:
    fake = fake_for("rejects_response_format")
    body = structured_body("decomposition") if kind == "json_schema" else {**report_body(), "response_format": {"type": "json_object"}}

    response = await post(fake, body)

    assert response.status_code == 400
    error = response.json()["error"]
    assert error["param"] == "response_format" and kind in error["message"]
    decomposition = await content_of(fake, json_mode_body("decomposition"))
    assert json.loads(decomposition) == expected_json(json_mode_body("decomposition"))


async def test_truncated_json_is_cut_in_half_first_then_valid_with_a_larger_limit() -> None:
    fake = fake_for("truncated_json")

    cut, cut_finish = await answer(fake, structured_body("decomposition"))
    retried, retried_finish = await answer(fake, structured_body("decomposition", max_tokens=8000))
    small_gap, small_gap_finish = await answer(fake, structured_body("gap_check", max_tokens=1000))
    large_plan, large_plan_finish = await answer(fake, structured_body("plan", max_tokens=4000))

    with pytest.raises(json.JSONDecodeError):
        json.loads(cut["content"])
    full = json.dumps(expected_json(structured_body("decomposition")), indent=2)
    assert cut["content"] == full[: len(full) // 2] and cut_finish == "length"
    assert json.loads(retried["content"]) == expected_json(structured_body("decomposition")) and retried_finish == "stop"
    with pytest.raises(json.JSONDecodeError):
        json.loads(small_gap["content"])
    assert small_gap_finish == "length"
    assert json.loads(large_plan["content"]) == expected_json(structured_body("plan")) and large_plan_finish == "stop"
    assert await content_of(fake, report_body()) == REPORT


# --- report presentation ---------------------------------------------------------------------------------------


async def test_fenced_report_wraps_the_whole_report_in_a_markdown_fence() -> None:
    fake = fake_for("fenced_report")

    assert await content_of(fake, report_body()) == f"```markdown\n{REPORT}\n```"
    assert json.loads(await content_of(fake, structured_body("gap_check")))["covered"] is True


async def test_chatter_frames_the_report_with_its_own_paragraphs() -> None:
    fake = fake_for("chatter")

    paragraphs = (await content_of(fake, report_body())).split("\n\n")

    assert paragraphs[0] == OPENING_CHATTER
    assert paragraphs[-1] == CLOSING_CHATTER
    assert "\n\n".join(paragraphs[1:-1]) == REPORT
    assert await content_of(fake, chat_body()) == "Here is a short answer about Hello there."


async def test_own_title_repeats_the_question_as_two_titles_before_the_body() -> None:
    content = await content_of(fake_for("own_title"), report_body())

    assert content == f"# Research Report: {QUESTION}\n\n**{QUESTION}**\n\n{REPORT}"


async def test_own_source_list_ends_with_a_sources_heading_of_linked_cited_passages() -> None:
    content = await content_of(fake_for("own_source_list"), report_body())

    body, sources = content.split("\n\n## Sources\n\n")
    assert body == REPORT
    assert sources.splitlines() == [
        "1. [Tower facts](https://alpha.example/tower) [p3]",
        "2. [City facts](https://beta.example/city) [p4]",
        "3. [River facts](https://gamma.example/river) [p1]",
        "4. [Bridge facts](https://delta.example/bridge) [p2]",
    ]


async def test_own_references_list_ends_with_a_bold_line_and_title_dash_url_lines() -> None:
    content = await content_of(fake_for("own_references_list"), report_body())

    body, references = content.split("\n\n**References:**\n\n")
    assert body == REPORT and "## References" not in content
    assert references.splitlines() == [
        "- Tower facts — https://alpha.example/tower",
        "- City facts — https://beta.example/city",
        "- River facts — https://gamma.example/river",
        "- Bridge facts — https://delta.example/bridge",
    ]


# --- citation spellings ----------------------------------------------------------------------------------------

SPELLED: dict[str, list[str]] = {
    "upper": ["[P3]", "[P4]", "[P1]", "[P2]"],
    "list": ["[p3, p4]", "[p3, p4]", "[p1, p2]", "[p1, p2]"],
    "adjacent": ["[p3][p4]", "[p3][p4]", "[p1][p2]", "[p1][p2]"],
    "range": ["[p3-p4]", "[p3-p4]", "[p1-p2]", "[p1-p2]"],
    "parens": ["(p3)", "(p4)", "(p1)", "(p2)"],
    "lenticular": ["【p3】", "【p4】", "【p1】", "【p2】"],
    "footnote": ["[^p3]", "[^p4]", "[^p1]", "[^p2]"],
    "source_label": ["[source: p3]", "[source: p4]", "[source: p1]", "[source: p2]"],
    "link": ["[p3](https://alpha.example/tower)", "[p4](https://beta.example/city)",
             "[p1](https://gamma.example/river)", "[p2](https://delta.example/bridge)"],
    # Positions in the prompt (p3 is shown first), not the ids' numbers.
    "numbered": ["[1]", "[2]", "[3]", "[4]"],
    "numbered_list": ["[1, 2]", "[1, 2]", "[3, 4]", "[3, 4]"],
    "numbered_adjacent": ["[1][2]", "[1][2]", "[3][4]", "[3][4][7]"],
}
LONE_CITE = re.compile(r"(?<!\])\[p\d+\](?![\[(])")


def test_the_spelling_table_covers_every_spelling() -> None:
    assert set(SPELLED) == set(CITATION_SPELLINGS)


@pytest.mark.parametrize("spelling", sorted(SPELLED))
async def test_citation_spelling_replaces_every_pn_cite_on_its_sentence(spelling: str) -> None:
    content = await content_of(fake_for(f"cites_{spelling}"), report_body())

    paragraphs = content.split("\n\n")
    assert paragraphs[0] == "## Findings"
    assert paragraphs[1:5] == [f"{fact} {cite}." for fact, cite in zip(FACTS, SPELLED[spelling])]
    assert not LONE_CITE.search(content), "a well-behaved [pN] cite was left where the spelling replaced it"


async def test_footnote_spelling_defines_each_footnote_with_its_title_at_the_end() -> None:
    content = await content_of(fake_for("cites_footnote"), report_body())

    assert content.split("\n\n")[-1].splitlines() == [
        "[^p3]: Tower facts", "[^p4]: City facts", "[^p1]: River facts", "[^p2]: Bridge facts",
    ]


async def test_paired_spellings_cite_two_shown_passages_per_sentence() -> None:
    shown = [passage_id for passage_id, *_ in PASSAGES]
    for spelling in ("list", "adjacent", "range"):
        content = await content_of(fake_for(f"cites_{spelling}"), report_body())
        for paragraph in content.split("\n\n")[1:]:
            ids = re.findall(r"p\d+", paragraph)
            assert len(set(ids)) == 2 and set(ids) <= set(shown)
            if spelling == "range":  # the two ends are consecutive in the prompt and in number
                first, last = (int(passage_id[1:]) for passage_id in ids)
                assert last == first + 1 and shown.index(ids[1]) == shown.index(ids[0]) + 1


async def test_numbered_cites_are_prompt_positions_and_one_adjacent_cite_points_past_the_end() -> None:
    request = request_of(report_body())
    positions = {passage_id: index for index, passage_id in enumerate(passages_in(request), start=1)}
    numbered = await content_of(fake_for("cites_numbered"), report_body())
    adjacent = await content_of(fake_for("cites_numbered_adjacent"), report_body())

    for passage_id, fact in zip(positions, FACTS):
        assert f"{fact} [{positions[passage_id]}]." in numbered
    assert positions == {"p3": 1, "p4": 2, "p1": 3, "p2": 4}
    sentence_numbers = [[int(n) for n in re.findall(r"\[(\d+)\]", paragraph)] for paragraph in adjacent.split("\n\n")[1:]]
    beyond = [number for numbers in sentence_numbers for number in numbers if number > len(positions)]
    assert beyond == [len(positions) + 3]
    for numbers in sentence_numbers:  # each sentence still cites its own (and a neighbour's) shown passage
        assert len([number for number in numbers if 1 <= number <= len(positions)]) == 2


async def test_spellings_change_only_the_cites_never_the_facts() -> None:
    strip = re.compile(r"\s*(?:\[[^\]]*\]\([^)]*\)|\[[^\]]*\]|\([pP]\d+[^)]*\)|【[^】]*】)")
    well_behaved = [strip.sub("", paragraph) for paragraph in REPORT.split("\n\n")]

    for spelling in CITATION_SPELLINGS:
        content = await content_of(fake_for(f"cites_{spelling}"), report_body())
        assert [strip.sub("", paragraph) for paragraph in content.split("\n\n")[:5]] == well_behaved, spelling


def test_respell_citations_rejects_an_unknown_spelling() -> None:
    with pytest.raises(ValueError, match="unknown citation spelling"):
        respell_citations(request_of(report_body()), REPORT, "roman")  # type: ignore[arg-type]
    with pytest.raises(ValueError):
        with_citation_spelling(default_research_model, "roman")  # type: ignore[arg-type]


def test_unshown_ids_keep_their_pn_form_in_numbered_spellings() -> None:
    text = "Shown fact [p3]. Invented fact [p999]."

    assert respell_citations(request_of(report_body()), text, "numbered") == "Shown fact [1]. Invented fact [p999]."


# --- truncation and continuation -------------------------------------------------------------------------------


def assert_cut_mid_sentence(partial: str) -> None:
    assert partial and REPORT.startswith(partial) and partial != REPORT
    assert partial[-1] not in ".!?]" and not partial.endswith("\n")


async def test_truncated_always_stops_at_forty_percent_on_every_call() -> None:
    fake = fake_for("truncated_always")

    first, first_finish = await answer(fake, report_body(max_tokens=4000))
    partial = first["content"]
    continued, continued_finish = await answer(fake, continuation_body(partial, max_tokens=4000))
    larger, larger_finish = await answer(fake, report_body(max_tokens=32000))
    gap, gap_finish = await answer(fake, structured_body("gap_check"))

    assert_cut_mid_sentence(partial)
    assert 0.35 <= len(partial) / len(REPORT) <= 0.55
    assert first_finish == continued_finish == larger_finish == "length"
    assert continued["content"] == partial and larger["content"] == partial
    assert json.loads(gap["content"])["covered"] is True and gap_finish == "stop"


async def test_truncated_once_continuation_answers_exactly_the_rest() -> None:
    fake = fake_for("truncated_once")

    first, first_finish = await answer(fake, report_body(max_tokens=4000))
    partial = first["content"]
    rest, rest_finish = await answer(fake, continuation_body(partial, max_tokens=4000))
    fresh, fresh_finish = await answer(fake, report_body(max_tokens=4000))

    assert_cut_mid_sentence(partial)
    assert 0.45 <= len(partial) / len(REPORT) <= 0.65 and first_finish == "length"
    assert partial + rest["content"] == REPORT and rest_finish == "stop"
    assert fresh["content"] == REPORT and fresh_finish == "stop"


async def test_truncated_once_remembers_each_prompt_separately() -> None:
    fake = fake_for("truncated_once")
    other = {"model": "fake-model", "messages": report_messages("How long is the river?")}

    first = await content_of(fake, report_body())
    other_first, other_finish = await answer(fake, other)

    assert first != REPORT
    assert other_first["content"] != REPORT and other_finish == "length"


def test_truncated_once_truncates_only_one_of_many_concurrent_first_requests() -> None:
    handler = truncating_once(default_research_model)
    request = request_of(report_body())

    with ThreadPoolExecutor(max_workers=8) as pool:
        replies = list(pool.map(lambda _: handler(request), range(16)))

    assert sorted(reply.finish_reason for reply in replies) == ["length"] + ["stop"] * 15


def test_a_follow_up_with_history_is_a_report_request_not_a_continuation() -> None:
    history = [{"role": "user", "content": "Earlier question"}, {"role": "assistant", "content": "Earlier report [p1]."}]
    follow_up = request_of({"messages": [{"role": "system", "content": "Answer."}, *history, report_messages()[1]]})
    continuation = request_of(continuation_body("The tower is"))

    assert is_report_request(follow_up) and not is_continuation(follow_up)
    assert is_report_request(continuation) and is_continuation(continuation)
    assert not is_continuation(request_of({**continuation_body("{"), "response_format": structured_body("plan")["response_format"]}))


def test_cut_mid_sentence_never_cuts_after_a_sentence_or_next_to_a_cite() -> None:
    for fraction in (0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8):
        cut = cut_mid_sentence(REPORT, fraction)
        assert REPORT[cut - 1] not in ".!?]" and not REPORT[cut:].startswith(" [")
        assert not REPORT[:cut].splitlines()[-1].startswith("#")


# --- usage and everything at once -------------------------------------------------------------------------------


async def test_no_usage_omits_the_usage_object() -> None:
    without = await post(fake_for("no_usage"), report_body())
    with_usage = await post(fake_for("well_behaved"), report_body())

    assert "usage" not in without.json()
    assert without.json()["choices"][0]["message"]["content"] == REPORT
    assert "usage" in with_usage.json()


async def test_kitchen_sink_thinks_chats_fences_numbers_lists_sources_and_omits_usage() -> None:
    fake = fake_for("kitchen_sink")

    response = await post(fake, report_body(max_tokens=4000))
    decomposition = await content_of(fake, structured_body("decomposition"))

    assert "usage" not in response.json()
    content = response.json()["choices"][0]["message"]["content"]
    assert content.startswith("<think>\n")
    assert_detectable_reasoning(content[: content.index("</think>")])
    paragraphs = after_think(content).split("\n\n")
    assert paragraphs[0] == OPENING_CHATTER and paragraphs[-1] == CLOSING_CHATTER
    fenced = "\n\n".join(paragraphs[1:-1])
    assert fenced.startswith("```markdown\n## Findings") and fenced.endswith("```")
    assert f"{FACTS[0]} [1][2]." in fenced and f"{FACTS[3]} [3][4][7]." in fenced
    assert not LONE_CITE.search(fenced.split("## Sources")[0])
    assert "## Sources\n\n1. [Tower facts](https://alpha.example/tower)\n2. [City facts](https://beta.example/city)" in fenced
    assert json.loads(after_think(decomposition)) == expected_json(structured_body("decomposition"))


# --- composing the building blocks -------------------------------------------------------------------------------


async def test_building_blocks_compose_and_keep_async_handlers_async() -> None:
    async def slow_model(request: ChatRequest) -> str:
        return citing_synthesis(request)

    handler = with_reasoning_block(with_chatter(with_citation_spelling(slow_model, "parens")))
    content = await content_of(FakeLLM(handler), report_body())

    paragraphs = after_think(content).split("\n\n")
    assert paragraphs[0] == OPENING_CHATTER and paragraphs[-1] == CLOSING_CHATTER
    assert paragraphs[2] == f"{FACTS[0]} (p3)."


async def test_error_replies_pass_through_the_building_blocks_untouched() -> None:
    handler = with_reasoning_block(with_chatter(lambda request: FakeReply("overloaded", status=503)))

    response = await post(FakeLLM(handler), report_body())

    assert response.status_code == 503 and response.json()["error"]["message"] == "overloaded"
