"""Time that fits real models, and quirks learnt instead of fatal: the client against the fake endpoint's wire."""

from __future__ import annotations

from typing import Any

import httpx
import pytest
from pydantic import BaseModel

from research.llm_wire import EndpointStatusError
from research.llm import (
    ContextOverflow,
    LLMClient,
    LLMTimeout,
    LLMUnavailable,
    context_overflow_window,
    forget_learnt_quirks,
    learnt_quirks,
)
from tests.fakes.llm import ChatRequest, FakeLLM, FakeReply, in_order

QUESTION = [{"role": "user", "content": "Name a city."}]
LLAMA_CPP_PYTHON_500 = {"error": {
    "message": "1 validation error:\n  {'type': 'literal_error', 'loc': ('body', 'response_format', 'type'), 'msg': "
               "\"Input should be 'text' or 'json_object'\", 'input': 'json_schema', 'ctx': {'expected': "
               "\"'text' or 'json_object'\"}}\n\n  File \"/srv/llama_cpp/server/app.py\", line 337, in "
               "create_chat_completion\n    POST /v1/chat/completions",
    "type": "internal_server_error", "param": None, "code": None}}


class City(BaseModel):
    city: str


def client_for(fake: FakeLLM, **overrides: Any) -> LLMClient:
    return LLMClient(fake.config(**overrides), http_client=fake.http_client())


def kinds_of_response_format(fake: FakeLLM) -> list[str | None]:
    return [(request.response_format or {}).get("type") for request in fake.chat_requests]


async def test_an_answer_that_keeps_coming_is_never_cut_by_a_total_limit() -> None:
    # Forty chunks a twentieth of a second apart: two seconds in all, ten times the total limit of a whole answer.
    fake = FakeLLM(lambda request: " ".join(["word"] * 40), chunk_delay=0.05)

    text = await client_for(fake, timeout_seconds=0.2, idle_timeout_seconds=1.0).complete(QUESTION, task="chat")

    assert text.split() == ["word"] * 40
    assert fake.chat_requests[0].raw["stream"] is True


async def test_structured_calls_are_streamed_too() -> None:
    fake = FakeLLM(lambda request: {"city": "Lyon"})

    assert (await client_for(fake).structured(QUESTION, City, task="city")).city == "Lyon"
    assert fake.chat_requests[0].raw["stream"] is True


async def test_a_model_that_goes_quiet_mid_answer_is_stopped_by_the_idle_limit_and_not_asked_again() -> None:
    fake = FakeLLM(lambda request: "one two three", chunk_delay=5.0)

    with pytest.raises(LLMTimeout) as raised:
        await client_for(fake, idle_timeout_seconds=0.2, max_retries=3).complete(QUESTION, task="chat")

    assert raised.value.limit == "LLM_IDLE_TIMEOUT"
    assert len(fake.chat_requests) == 1


async def test_a_long_wait_for_the_first_token_within_its_limit_is_patience_not_failure() -> None:
    fake = FakeLLM(lambda request: "Lyon.", time_to_first_token=0.5)

    assert await client_for(fake, first_token_timeout_seconds=2.0, idle_timeout_seconds=0.1,
                            timeout_seconds=0.1).complete(QUESTION, task="chat") == "Lyon."


async def test_an_endpoint_that_does_not_stream_gets_one_total_limit() -> None:
    def no_streaming(request: ChatRequest) -> FakeReply | str:
        if request.raw.get("stream"):
            return FakeReply({"error": {"message": "Unsupported parameter: 'stream' is not supported with this model.",
                                        "type": "invalid_request_error", "param": "stream", "code": None}}, status=400)
        return FakeReply("late", delay=5.0)

    fake = FakeLLM(no_streaming)

    with pytest.raises(LLMTimeout) as raised:
        await client_for(fake, timeout_seconds=0.2, max_retries=2).complete(QUESTION, task="chat")

    assert raised.value.limit == "LLM_TIMEOUT"
    assert [request.raw.get("stream", False) for request in fake.chat_requests] == [True, False]
    assert learnt_quirks(fake.base_url, fake.models[0]).streams is False


async def test_a_500_naming_response_format_steps_down_at_once_and_every_later_client_asks_the_way_that_works() -> None:
    def llama_cpp_python(request: ChatRequest) -> FakeReply | dict[str, str]:
        if (request.response_format or {}).get("type") == "json_schema":
            return FakeReply(LLAMA_CPP_PYTHON_500, status=500)
        return {"city": "Lyon"}

    fake = FakeLLM(llama_cpp_python)

    assert (await client_for(fake, max_retries=3).structured(QUESTION, City, task="city")).city == "Lyon"
    assert (await client_for(fake, max_retries=3).structured(QUESTION, City, task="city")).city == "Lyon"

    # Not retried as an outage, and not asked with json_schema again by a new client of the same process.
    assert kinds_of_response_format(fake) == ["json_schema", "json_object", "json_object"]


async def test_a_500_that_names_no_parameter_is_still_an_outage_retried_then_reported() -> None:
    fake = FakeLLM(lambda request: FakeReply("Internal Server Error", status=500, headers={"retry-after-ms": "1"}))

    with pytest.raises(LLMUnavailable, match="HTTP 500"):
        await client_for(fake, max_retries=2).structured(QUESTION, City, task="city")

    assert kinds_of_response_format(fake) == ["json_schema"] * 3


async def test_quirks_are_learnt_per_endpoint_and_model_and_forgotten_on_request() -> None:
    fake = FakeLLM(in_order(FakeReply(LLAMA_CPP_PYTHON_500, status=500), {"city": "Lyon"}))
    await client_for(fake).structured(QUESTION, City, task="city")

    assert learnt_quirks(fake.base_url, fake.models[0]).response_format_mode == "json_object"
    assert learnt_quirks(fake.base_url, "another-model").response_format_mode == "json_schema"
    forget_learnt_quirks()
    assert learnt_quirks(fake.base_url, fake.models[0]).response_format_mode == "json_schema"


async def test_max_completion_tokens_refused_goes_back_to_max_tokens() -> None:
    def refuses(request: ChatRequest) -> FakeReply | str:
        if "max_completion_tokens" in request.raw:
            return FakeReply({"error": {"message": "Unrecognized request argument supplied: max_completion_tokens",
                                        "type": "invalid_request_error", "param": None, "code": None}}, status=400)
        if "max_tokens" in request.raw and len([r for r in fake.chat_requests if "max_tokens" in r.raw]) == 1:
            return FakeReply({"error": {"message": "Unsupported parameter: 'max_tokens' is not supported with this "
                                                   "model. Use 'max_completion_tokens' instead.",
                                        "type": "invalid_request_error", "param": "max_tokens", "code": None}}, status=400)
        return "ok"

    fake = FakeLLM(refuses)

    assert await client_for(fake).complete(QUESTION, task="chat", max_tokens=50) == "ok"
    assert [("max_tokens" in r.raw, "max_completion_tokens" in r.raw) for r in fake.chat_requests] == [
        (True, False), (False, True), (True, False)]


async def test_a_stream_that_ends_without_finishing_is_not_taken_for_a_whole_answer() -> None:
    fake = FakeLLM(lambda request: FakeReply("cut short here", finish_reason=None))  # type: ignore[arg-type]

    with pytest.raises(LLMUnavailable, match="before it was finished"):
        await client_for(fake).complete(QUESTION, task="chat")


# --- the context window ------------------------------------------------------------------------------------------

OPENAI_OVERFLOW = ("This model's maximum context length is 1024 tokens. However, you requested 1500 tokens (500 in "
                   "the messages, 1000 in the completion). Please reduce the length of the messages or completion.")


def overflow_reply(message: str = OPENAI_OVERFLOW) -> FakeReply:
    return FakeReply({"error": {"message": message, "type": "invalid_request_error", "param": "messages",
                                "code": "context_length_exceeded"}}, status=400)


def error_for(status: int, body: dict[str, Any]) -> EndpointStatusError:
    return EndpointStatusError(httpx.Response(status, json=body, request=httpx.Request("POST", "http://x/v1/chat/completions")))


@pytest.mark.parametrize(("body", "window"), [
    ({"error": {"message": OPENAI_OVERFLOW, "code": "context_length_exceeded"}}, 1024),
    ({"error": {"code": 400, "message": "the request exceeds the available context size, try increasing it",
                "type": "exceed_context_size_error", "n_prompt_tokens": 9030, "n_ctx": 8192}}, 8192),
    ({"error": {"message": "Requested tokens (9000) exceed context window of 4096"}}, 4096),
    ({"error": {"message": "prompt is too long"}}, None),
])
def test_overflow_errors_of_real_servers_are_read_with_the_window_they_name(body: dict[str, Any], window: int | None) -> None:
    assert context_overflow_window(error_for(400, body)) == window


def test_an_error_about_something_else_is_not_an_overflow() -> None:
    assert context_overflow_window(error_for(400, {"error": {"message": "Invalid value for temperature"}})) is False


async def test_an_overflow_teaches_the_window_and_a_prompt_that_fits_is_asked_again_with_less_room_for_the_answer() -> None:
    fake = FakeLLM(in_order(overflow_reply(), "Lyon."))

    assert await client_for(fake).complete(QUESTION, task="chat", max_tokens=1000) == "Lyon."

    first, second = fake.chat_requests
    assert first.max_tokens == 1000 and second.max_tokens is not None and second.max_tokens < 1024
    assert learnt_quirks(fake.base_url, fake.models[0]).context_tokens == 1024


async def test_a_prompt_that_cannot_fit_the_window_raises_context_overflow_for_the_caller_to_send_less() -> None:
    fake = FakeLLM(lambda request: overflow_reply())
    long_prompt = [{"role": "user", "content": "word " * 2000}]

    with pytest.raises(ContextOverflow) as raised:
        await client_for(fake).complete(long_prompt, task="chat", max_tokens=100)

    assert raised.value.context_tokens == 1024
    with pytest.raises(ContextOverflow):
        await client_for(fake).complete(long_prompt, task="chat", max_tokens=100)
    assert len(fake.chat_requests) == 1  # the window is known now: the second prompt is not even sent


async def test_the_configured_window_caps_the_answer_without_asking_the_server() -> None:
    fake = FakeLLM(lambda request: "ok")

    await client_for(fake, context_tokens=2048).complete(QUESTION, task="chat", max_tokens=16_000)

    assert fake.chat_requests[0].max_tokens is not None and fake.chat_requests[0].max_tokens < 2048


async def test_a_report_cut_off_with_no_room_left_in_the_window_to_continue_keeps_what_was_written() -> None:
    rambling = " ".join(["The turbines turned."] * 120)  # about 600 tokens, stopped at its limit every time
    fake = FakeLLM(lambda request: FakeReply(rambling, finish_reason="length"))

    answer = await client_for(fake, context_tokens=1024).complete_long(QUESTION, task="synthesize", max_tokens=600)

    assert answer.cut_off and answer.text.startswith("The turbines turned.")
    assert len(fake.chat_requests) == 1  # the continuation would not fit the window, so it was not asked
