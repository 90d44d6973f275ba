"""Streamed answers: LLMClient reads the fake endpoint's server-sent events (research.llm_wire, httpx-sse) and shows only
what a reader may see (never a reasoning block), while the finished answer is the one the non-streamed path gives."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Callable

import httpx
import pytest

from research.llm import LLMClient, LLMConfig, LLMError, LLMUnavailable, visible_streamed_text
from tests.fakes.llm import FakeLLM, FakeReply, in_order
from tests.fakes.model_zoo import zoo_model

QUESTION = [{"role": "system", "content": "You are careful."}, {"role": "user", "content": "What is the capital of France?"}]
ANSWER = "Paris is the capital of France, on the Seine, with about two million people."


async def streamed(fake: FakeLLM, **options: object) -> tuple[list[str], str, LLMClient]:
    shown: list[str] = []

    async def on_text(visible: str) -> None:
        shown.append(visible)

    async with LLMClient(fake.config(), http_client=fake.http_client()) as client:
        answer = await client.complete_long(QUESTION, task="chat", on_text=on_text, **options)  # type: ignore[arg-type]
    return shown, answer.text, client


async def test_a_streamed_answer_is_shown_as_it_grows_and_ends_as_the_whole_answer() -> None:
    fake = FakeLLM(lambda request: ANSWER)
    shown, text, client = await streamed(fake)
    assert text == ANSWER
    assert len(shown) > 5 and shown[-1] == ANSWER
    assert all(later.startswith(earlier) for earlier, later in zip(shown, shown[1:]))
    assert fake.chat_requests[0].raw["stream"] is True
    assert fake.chat_requests[0].raw["stream_options"] == {"include_usage": True}
    assert client.ledger.by_model["fake-model"].estimated_calls == 0  # usage came in the stream's last chunk


async def test_the_fake_sends_openai_chunks_and_done_last() -> None:
    fake = FakeLLM(lambda request: "two words")
    async with fake.http_client() as http:
        response = await http.post(f"{fake.base_url}/chat/completions",
                                   json={"model": "fake-model", "messages": QUESTION, "stream": True})
    events = [line.removeprefix("data: ") for line in response.text.split("\n\n") if line]
    assert response.headers["content-type"].startswith("text/event-stream")
    assert events[-1] == "[DONE]"
    chunks = [json.loads(event) for event in events[:-1]]
    assert {chunk["object"] for chunk in chunks} == {"chat.completion.chunk"}
    assert chunks[0]["choices"][0]["delta"] == {"role": "assistant", "content": ""}
    assert "".join(chunk["choices"][0]["delta"].get("content", "") for chunk in chunks) == "two words"
    assert chunks[-1]["choices"][0]["finish_reason"] == "stop" and "usage" not in chunks[-1]


async def test_a_think_block_is_never_shown_while_streaming() -> None:
    fake = FakeLLM(zoo_model("think_blocks").handler)
    shown, text, _ = await streamed(fake)
    assert shown and not any("think>" in visible or "reason" in visible.lower() for visible in shown)
    assert text == shown[-1] and "<think>" not in text


async def test_reasoning_whose_opening_tag_was_swallowed_is_dropped_once_it_ends() -> None:
    fake = FakeLLM(zoo_model("think_tag_swallowed").handler)
    shown, text, _ = await streamed(fake)
    assert "</think>" not in shown[-1] and shown[-1] == text
    assert not any("</think" in visible for visible in shown)


async def test_reasoning_content_deltas_are_never_shown() -> None:
    fake = FakeLLM(lambda request: FakeReply(content=ANSWER, reasoning="Secret chain of thought about Paris."))
    shown, text, _ = await streamed(fake)
    assert text == ANSWER and not any("Secret" in visible for visible in shown)


def test_a_reasoning_tag_still_arriving_is_held_back() -> None:
    assert visible_streamed_text("The answer is <thi") == "The answer is"
    assert visible_streamed_text("The answer is <think>still thinking") == "The answer is"
    assert visible_streamed_text("a < b") == "a < b"


def test_an_opening_fence_is_dropped_and_a_closing_one_held_back() -> None:
    assert visible_streamed_text("```mark") == ""
    assert visible_streamed_text("```markdown\n## Findings\nParis ``") == "## Findings\nParis"


async def test_a_fenced_answer_never_shows_its_fence() -> None:
    fake = FakeLLM(lambda request: f"```markdown\n{ANSWER}\n```")
    shown, _, _ = await streamed(fake)
    assert shown[-1] == ANSWER and not any("`" in visible for visible in shown)


async def test_an_endpoint_refusing_stream_options_is_streamed_without_them() -> None:
    fake = FakeLLM(lambda request: ANSWER, unsupported_parameters={"stream_options"})
    shown, text, client = await streamed(fake)
    assert text == ANSWER and shown[-1] == ANSWER
    assert "stream_options" not in fake.chat_requests[-1].raw
    assert client.ledger.by_model["fake-model"].estimated_calls == 1  # no usage chunk without stream_options


async def test_a_continued_answer_streams_on_from_the_text_already_shown() -> None:
    first, rest = "Paris is the capital", " of France."
    fake = FakeLLM(in_order(FakeReply(content=first, finish_reason="length"), FakeReply(content=rest)))
    shown, text, _ = await streamed(fake)
    assert text == first + rest and shown[-1] == text
    assert all(later.startswith(earlier) for earlier, later in zip(shown, shown[1:]))



class _BreaksOff(httpx.AsyncByteStream):
    """An event stream whose connection is lost after its first words."""

    async def __aiter__(self) -> AsyncIterator[bytes]:
        yield b'data: {"choices": [{"index": 0, "delta": {"content": "Paris is"}, "finish_reason": null}]}\n\n'
        raise httpx.RemoteProtocolError("peer closed connection without sending complete message body")


def _endpoint(reply: Callable[[], httpx.Response]) -> tuple[LLMClient, list[httpx.Request]]:
    sent: list[httpx.Request] = []

    def answer(request: httpx.Request) -> httpx.Response:
        sent.append(request)
        return reply()

    config = LLMConfig(base_url="http://llm.test/v1", model="fake-model", max_retries=3)
    return LLMClient(config, http_client=httpx.AsyncClient(transport=httpx.MockTransport(answer))), sent


async def test_an_answer_that_breaks_off_is_unavailable_and_never_asked_again() -> None:
    # The server had the request (it began to answer): a copy would queue behind it on a local server.
    client, sent = _endpoint(lambda: httpx.Response(200, headers={"content-type": "text/event-stream"},
                                                    stream=_BreaksOff()))
    with pytest.raises(LLMUnavailable, match="broke off its answer"):
        await client.complete(QUESTION, task="chat")
    assert len(sent) == 1


async def test_an_error_sent_as_the_stream_s_first_event_is_an_llm_error_not_an_answer() -> None:
    body = b'data: {"error": {"message": "model overloaded", "type": "server_error"}}\n\n'
    client, sent = _endpoint(lambda: httpx.Response(200, headers={"content-type": "text/event-stream"}, content=body))
    with pytest.raises(LLMError) as raised:
        await client.complete(QUESTION, task="chat")
    assert not isinstance(raised.value, LLMUnavailable) and len(sent) == 1


async def test_an_endpoint_that_answers_a_stream_with_json_is_asked_whole_from_then_on() -> None:
    completion = {"choices": [{"index": 0, "message": {"role": "assistant", "content": ANSWER}, "finish_reason": "stop"}],
                  "usage": {"prompt_tokens": 12, "completion_tokens": 20, "total_tokens": 32}}
    client, sent = _endpoint(lambda: httpx.Response(200, json=completion))
    assert await client.complete(QUESTION, task="chat") == ANSWER
    assert [json.loads(request.content).get("stream") for request in sent] == [True, None]
    assert client.ledger.prompt_tokens == 12 and client.ledger.completion_tokens == 20


class _LostBody(httpx.AsyncByteStream):
    """An error answer whose body is lost on the way."""

    async def __aiter__(self) -> AsyncIterator[bytes]:
        raise httpx.ReadError("connection reset while reading the body")
        yield b""  # pragma: no cover - makes this an async generator


async def test_an_error_status_whose_body_is_lost_is_judged_by_its_status_and_not_asked_again() -> None:
    client, sent = _endpoint(lambda: httpx.Response(400, stream=_LostBody()))
    with pytest.raises(LLMError, match=r"rejected the request \(HTTP 400\)"):
        await client.complete(QUESTION, task="chat")
    assert len(sent) == 1  # a 400 is the server's answer: never sent again, as a connection failure would be
