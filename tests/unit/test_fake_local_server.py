"""The fake LLM as real local servers behave: one request in work at a time and its time, llama-cpp-python's quirks,
small context windows and where each server tells its size."""

from __future__ import annotations

import asyncio
import itertools
import json
import threading
from typing import Any

import httpx
import pytest

from research.llm import LLMClient
from tests.fakes.clock import ManualClock
from tests.fakes.llm import (
    LLAMA_CPP_PYTHON_JSON_SCHEMA_ERROR,
    ChatRequest,
    FakeLLM,
    LocalServer,
    estimated_tokens,
)

# 400 characters: 100 prompt tokens as the fake counts them.
PROMPT = [{"role": "user", "content": "x" * 400}]
ANSWER = "The tower is 330 metres tall and opened in 1889."  # 48 characters: 12 tokens
CAPTURED_500 = (
    '{"error":{"message":"1 validation error:\\n  {\'type\': \'literal_error\', \'loc\': (\'body\', \'response_format\', '
    '\'type\'), \'msg\': \\"Input should be \'text\' or \'json_object\'\\", \'input\': \'json_schema\', \'ctx\': '
    '{\'expected\': \\"\'text\' or \'json_object\'\\"}}\\n\\n  File \\"/srv/llama_cpp/server/app.py\\", line 337, in '
    'create_chat_completion\\n    POST /v1/chat/completions","type":"internal_server_error","param":null,"code":null}}'
)


def body(messages: list[dict[str, Any]] | None = None, **extra: Any) -> dict[str, Any]:
    return {"model": "fake-model", "messages": messages or PROMPT, **extra}


def local_fake(prompt_tokens_per_second: float = 1.0, tokens_per_second: float = 1.0, **options: Any) -> FakeLLM:
    """A local server reading PROMPT in 100 s and writing ANSWER in 12 s (simulated)."""
    return FakeLLM(lambda request: ANSWER, local_server=LocalServer(prompt_tokens_per_second, tokens_per_second), **options)


def patient_client(fake: FakeLLM) -> httpx.AsyncClient:
    """A client of the in-process transport whose read timeout (on the fake's clock) outlasts any test's work."""
    return httpx.AsyncClient(transport=fake.transport(), timeout=10_000.0)


async def post(client: httpx.AsyncClient, fake: FakeLLM, payload: dict[str, Any]) -> httpx.Response:
    return await client.post(f"{fake.base_url}/chat/completions", json=payload)


async def streamed_lines(client: httpx.AsyncClient, fake: FakeLLM, payload: dict[str, Any]) -> list[str]:
    async with client.stream("POST", f"{fake.base_url}/chat/completions", json={**payload, "stream": True}) as response:
        assert response.status_code == 200
        return [line async for line in response.aiter_lines() if line]


def streamed_text(lines: list[str]) -> str:
    chunks = [json.loads(line.removeprefix("data: ")) for line in lines if line != "data: [DONE]"]
    return "".join(chunk["choices"][0]["delta"].get("content") or "" for chunk in chunks if chunk["choices"])


# --- one request in work at a time ------------------------------------------------------------------------------


async def test_two_identical_requests_are_worked_one_after_the_other_and_the_second_counts_as_resent() -> None:
    clock = ManualClock()
    fake = local_fake(clock=clock, sleep=clock.sleep)
    local = fake.local
    assert local is not None

    async with patient_client(fake) as client:
        both = asyncio.gather(post(client, fake, body()), post(client, fake, body()))
        await local.wait_until(lambda queue: len(queue.work) == 2)
        assert local.in_work == 1 and local.queued == 1 and local.resent_while_busy == 1
        for _ in range(2):
            await clock.wait_for_sleepers(clock.now + 100)   # the prompt read
            clock.advance(100)
            await clock.wait_for_sleepers(clock.now + 12)    # the answer written
            clock.advance(12)
        first, second = await both

    assert first.status_code == second.status_code == 200
    assert first.json()["choices"][0]["message"]["content"] == ANSWER
    assert local.max_in_work == 1 and local.resent_while_busy == 1
    earlier, later = local.work
    assert (earlier.queued_at, earlier.started_at, earlier.first_token_at, earlier.finished_at) == (1_000, 1_000, 1_100, 1_112)
    assert (later.queued_at, later.started_at, later.first_token_at, later.finished_at) == (1_000, 1_112, 1_212, 1_224)
    assert later.waited == 112 and not earlier.disconnected and not later.disconnected


async def test_different_requests_queue_too_but_are_not_counted_as_resent() -> None:
    fake = local_fake(time_scale=0.0005)
    assert fake.local is not None

    async with patient_client(fake) as client:
        await asyncio.gather(*(post(client, fake, body([{"role": "user", "content": f"{n}" * 400}])) for n in range(3)))

    assert fake.local.max_in_work == 1 and fake.local.resent_while_busy == 0
    works = fake.local.work
    assert all(later.started_at >= earlier.finished_at for earlier, later in itertools.pairwise(works))  # type: ignore[operator]
    assert fake.local.idle and fake.local.queued == 0 and fake.local.in_work == 0


async def test_the_prompt_is_read_before_the_first_token_then_the_answer_written_at_its_rate() -> None:
    fake = local_fake(prompt_tokens_per_second=50.0, tokens_per_second=6.0, time_scale=0.001)
    assert fake.local is not None

    async with patient_client(fake) as client:
        lines = await streamed_lines(client, fake, body())

    assert streamed_text(lines) == ANSWER and lines[-1] == "data: [DONE]"
    [work] = fake.local.work
    assert work.stream and work.prompt_tokens == 100 and work.completion_tokens == estimated_tokens(ANSWER) == 12
    assert work.started_at is not None and work.first_token_at is not None and work.finished_at is not None
    assert work.first_token_at - work.started_at >= 100 / 50.0 - 0.01   # 100 tokens at 50 a second, at least
    assert work.finished_at - work.first_token_at >= 12 / 6.0 - 0.01     # 12 tokens at 6 a second, at least


async def test_nothing_is_sent_before_the_first_token_so_the_read_timeout_counts_the_queue_and_the_prompt() -> None:
    clock = ManualClock()
    fake = local_fake(clock=clock, sleep=clock.sleep)
    assert fake.local is not None

    async with httpx.AsyncClient(transport=fake.transport(), timeout=60.0) as client:
        asked = asyncio.ensure_future(post(client, fake, body()))
        await clock.wait_for_sleepers(clock.now + 60)    # the client's read timeout
        await clock.wait_for_sleepers(clock.now + 100)   # the prompt read
        clock.advance(60)
        with pytest.raises(httpx.ReadTimeout):
            await asked
        [work] = fake.local.work
        assert work.disconnected and work.finished_at is None and work.first_token_at is None

        clock.advance(40)
        await clock.wait_for_sleepers(clock.now + 12)
        clock.advance(12)
        await fake.local.wait_idle()


async def test_an_abandoned_request_is_worked_to_the_end_and_its_resent_copy_waits_behind_it() -> None:
    clock = ManualClock()
    fake = local_fake(clock=clock, sleep=clock.sleep)
    local = fake.local
    assert local is not None

    async with (httpx.AsyncClient(transport=fake.transport(), timeout=60.0) as impatient,
                httpx.AsyncClient(transport=fake.transport(), timeout=600.0) as patient):
        abandoned = asyncio.ensure_future(post(impatient, fake, body()))
        await clock.wait_for_sleepers(clock.now + 60)
        clock.advance(60)
        with pytest.raises(httpx.ReadTimeout):
            await abandoned
        resent = asyncio.ensure_future(post(patient, fake, body()))
        await local.wait_until(lambda queue: len(queue.work) == 2)
        assert local.resent_while_busy == 1 and local.queued == 1 and local.in_work == 1

        clock.advance(40)                                       # the abandoned prompt is read (100 s in all)
        await clock.wait_for_sleepers(clock.now + 12)           # its answer is still written, for nobody
        clock.advance(12)
        await local.wait_until(lambda queue: queue.work[1].started_at is not None)
        await clock.wait_for_sleepers(clock.now + 100)
        clock.advance(100)
        await clock.wait_for_sleepers(clock.now + 12)
        clock.advance(12)
        response = await resent
        await local.wait_idle()

    assert response.status_code == 200 and response.json()["choices"][0]["message"]["content"] == ANSWER
    first, second = local.work
    assert first.disconnected and first.finished_at == 1_000 + 112
    assert not second.disconnected and second.queued_at == 1_000 + 60
    assert second.started_at == first.finished_at and second.finished_at == 1_000 + 224
    assert local.max_in_work == 1


async def test_a_streamed_client_that_stops_reading_leaves_the_work_going() -> None:
    fake = local_fake(prompt_tokens_per_second=1000.0, tokens_per_second=0.1, time_scale=0.001)
    assert fake.local is not None

    async with patient_client(fake) as client:
        async with client.stream("POST", f"{fake.base_url}/chat/completions", json=body(stream=True)) as response:
            async for _line in response.aiter_lines():
                break
        await fake.local.wait_until(lambda queue: queue.work[0].disconnected)
        assert fake.local.work[0].finished_at is None
        await fake.local.wait_idle()

    [work] = fake.local.work
    assert work.disconnected and work.completion_tokens == estimated_tokens(ANSWER)


async def test_a_local_server_answers_the_llm_client_streamed_and_not() -> None:
    fake = local_fake(prompt_tokens_per_second=10_000.0, tokens_per_second=10_000.0)

    async with LLMClient(fake.config(), http_client=fake.http_client()) as client:
        plain = await client.complete(PROMPT, task="chat")
        shown: list[str] = []

        async def on_text(visible: str) -> None:
            shown.append(visible)

        streamed = await client.complete_long(PROMPT, task="chat", on_text=on_text)

    assert plain == ANSWER and streamed.text == ANSWER and shown[-1] == ANSWER
    assert fake.local is not None and len(fake.local.work) == 2 and fake.local.idle


async def test_the_loopback_server_serialises_requests_and_sees_a_client_go_away() -> None:
    released = threading.Event()

    async def held_until_released(request: ChatRequest) -> str:
        await asyncio.to_thread(released.wait, 30)
        return ANSWER

    server = LocalServer(prompt_tokens_per_second=1.0, tokens_per_second=1.0)
    with FakeLLM(held_until_released, local_server=server, time_scale=0.0001).start() as fake:
        local = fake.local
        assert local is not None
        async with httpx.AsyncClient(trust_env=False, timeout=0.05) as impatient:
            with pytest.raises(httpx.ReadTimeout):
                await post(impatient, fake, body())
        await local.wait_until(lambda queue: queue.work[0].disconnected)
        async with httpx.AsyncClient(trust_env=False, timeout=10.0) as patient:
            pair = asyncio.gather(post(patient, fake, body()), post(patient, fake, body()))
            await local.wait_until(lambda queue: len(queue.work) == 3)
            assert local.queued == 2 and local.in_work == 1
            released.set()
            first, second = await pair
        await local.wait_idle()

    assert first.status_code == second.status_code == 200
    assert local.max_in_work == 1 and local.resent_while_busy == 2
    works = local.work
    assert [work.disconnected for work in works] == [True, False, False]
    assert all(later.started_at >= earlier.finished_at for earlier, later in itertools.pairwise(works))  # type: ignore[operator]
    assert all(work.first_token_at - work.started_at >= 100 - 0.01 for work in works)  # type: ignore[operator]


# --- the read timeout, per read -------------------------------------------------------------------------------


async def test_a_stream_times_out_when_a_gap_between_events_exceeds_the_read_timeout() -> None:
    fake = FakeLLM(lambda request: ANSWER, time_to_first_token=5.0)

    async with (httpx.AsyncClient(transport=fake.transport(), timeout=0.05) as client,
                client.stream("POST", f"{fake.base_url}/chat/completions", json=body(stream=True)) as response):
        assert response.status_code == 200   # the headers came at once
        with pytest.raises(httpx.ReadTimeout):
            async for _line in response.aiter_lines():
                pass


async def test_a_long_stream_of_short_gaps_does_not_time_out() -> None:
    # Twelve gaps of 2 s against a 10 s read timeout: 24 s in all, on a clock the test moves.
    clock = ManualClock()
    fake = FakeLLM(lambda request: ANSWER, chunk_delay=2.0, time_to_first_token=2.0, clock=clock, sleep=clock.sleep)

    async with httpx.AsyncClient(transport=fake.transport(), timeout=10.0) as client:
        reading = asyncio.ensure_future(streamed_lines(client, fake, body()))
        while not reading.done():
            next_event = asyncio.ensure_future(clock.wait_for_sleepers(clock.now + 2))
            await asyncio.wait({reading, next_event}, return_when=asyncio.FIRST_COMPLETED)
            if next_event.done():
                clock.advance(2)
            next_event.cancel()
        lines = reading.result()

    assert streamed_text(lines) == ANSWER and clock.now - 1_000 >= 20


async def test_the_read_timeout_is_measured_on_the_fakes_scaled_clock() -> None:
    # 100 s to the first token against a client's 10 s: it times out though both take a tenth of a second or less.
    fake = FakeLLM(lambda request: ANSWER, time_to_first_token=100.0, time_scale=0.001)

    async with httpx.AsyncClient(transport=fake.transport(), timeout=10.0) as client:
        with pytest.raises(httpx.ReadTimeout):
            await streamed_lines(client, fake, body())


# --- llama-cpp-python's quirks --------------------------------------------------------------------------------


async def test_llama_cpp_python_answers_a_json_schema_with_its_captured_500() -> None:
    fake = FakeLLM(quirks="llama_cpp_python")
    response_format = {"type": "json_schema", "json_schema": {"name": "plan", "schema": {"type": "object"}}}

    async with fake.http_client() as client:
        response = await post(client, fake, body(response_format=response_format))

    assert response.status_code == 500
    assert response.text == CAPTURED_500
    assert response.json() == LLAMA_CPP_PYTHON_JSON_SCHEMA_ERROR


async def test_llama_cpp_python_accepts_json_object_and_stream_options_but_streams_no_usage() -> None:
    fake = FakeLLM(lambda request: {"ok": True}, quirks="llama_cpp_python")

    async with fake.http_client() as client:
        json_mode = await post(client, fake, body(response_format={"type": "json_object"}))
        lines = await streamed_lines(client, fake, body(stream_options={"include_usage": True}))

    assert json_mode.status_code == 200 and "usage" in json_mode.json()
    assert streamed_text(lines) == '{"ok": true}'
    assert not any('"usage"' in line for line in lines)


# --- a small context window -----------------------------------------------------------------------------------

OVERFLOWING = [{"role": "user", "content": "y" * (9030 * 4)}]   # 9030 prompt tokens


async def test_an_overflow_is_answered_as_openai_vllm_and_llama_cpp_python_do() -> None:
    fake = FakeLLM(context_window=8192)

    async with fake.http_client() as client:
        response = await post(client, fake, body(OVERFLOWING, max_tokens=10))

    assert response.status_code == 400
    assert response.json() == {"error": {
        "message": "This model's maximum context length is 8192 tokens. However, you requested 9040 tokens (9030 in the "
                   "messages, 10 in the completion). Please reduce the length of the messages or completion.",
        "type": "invalid_request_error", "param": "messages", "code": "context_length_exceeded",
    }}


async def test_an_overflow_is_answered_as_llama_cpps_server_does() -> None:
    fake = FakeLLM(context_window=8192, context_overflow="llama_cpp")

    async with fake.http_client() as client:
        response = await post(client, fake, body(OVERFLOWING, max_tokens=10))

    assert response.status_code == 400
    assert response.json() == {"error": {
        "code": 400, "message": "the request exceeds the available context size, try increasing it",
        "type": "exceed_context_size_error", "n_prompt_tokens": 9030, "n_ctx": 8192,
    }}


async def test_the_completion_budget_counts_towards_the_window() -> None:
    fake = FakeLLM(lambda request: "fits", context_window=8192)
    fitting = [{"role": "user", "content": "y" * (8000 * 4)}]

    async with fake.http_client() as client:
        room = await post(client, fake, body(fitting, max_tokens=192))
        no_room = await post(client, fake, body(fitting, max_tokens=193))

    assert room.status_code == 200 and no_room.status_code == 400


async def test_ollama_truncates_the_oldest_text_silently_and_keeps_the_system_prompt() -> None:
    seen: list[ChatRequest] = []

    def handler(request: ChatRequest) -> str:
        seen.append(request)
        return "truncated, and never said so"

    fake = FakeLLM(handler, context_window=100, context_overflow="ollama")
    messages = [{"role": "system", "content": "S" * 40}, {"role": "user", "content": "old " * 100},
                {"role": "user", "content": "the question"}]

    async with fake.http_client() as client:
        response = await post(client, fake, body(messages, max_tokens=20))

    assert response.status_code == 200
    [request] = seen
    assert request.prompt_tokens <= 80 and request.system == "S" * 40 and request.user == "the question"
    assert fake.chat_requests[0].prompt_tokens > 100  # what was sent is recorded whole


# --- where the window size is told ----------------------------------------------------------------------------


async def test_llama_cpp_tells_its_window_at_props_on_the_server_root() -> None:
    fake = FakeLLM(context_window=8192, context_discovery="llama_cpp")

    async with fake.http_client() as client:
        props = await client.get(f"{fake.root_url}/props")
        under_v1 = await client.get(f"{fake.base_url}/props")

    assert props.status_code == 200 and props.json()["default_generation_settings"]["n_ctx"] == 8192
    assert under_v1.status_code == 404


async def test_vllm_tells_its_window_as_max_model_len_in_the_model_list() -> None:
    fake = FakeLLM(context_window=8192, context_discovery="vllm", models=["qwen", "llama"])

    async with fake.http_client() as client:
        listing = (await client.get(f"{fake.base_url}/models")).json()

    assert [(model["id"], model["max_model_len"]) for model in listing["data"]] == [("qwen", 8192), ("llama", 8192)]


async def test_ollama_tells_its_window_in_api_show_model_info() -> None:
    fake = FakeLLM(context_window=32768, context_discovery="ollama", models=["qwen2.5:7b"])

    async with fake.http_client() as client:
        shown = await client.post(f"{fake.root_url}/api/show", json={"model": "qwen2.5:7b"})
        unknown = await client.post(f"{fake.root_url}/api/show", json={"model": "nope"})

    info = shown.json()["model_info"]
    assert info["general.architecture"] == "qwen2" and info["qwen2.context_length"] == 32768
    assert unknown.status_code == 404


async def test_without_discovery_no_server_tells_its_window() -> None:
    fake = FakeLLM(context_window=8192)

    async with fake.http_client() as client:
        props = await client.get(f"{fake.root_url}/props")
        show = await client.post(f"{fake.root_url}/api/show", json={"model": "fake-model"})
        listing = (await client.get(f"{fake.base_url}/models")).json()

    assert props.status_code == show.status_code == 404
    assert "max_model_len" not in listing["data"][0]


async def test_discovery_is_served_over_the_loopback_server_at_its_root() -> None:
    with FakeLLM(context_window=4096, context_discovery="llama_cpp").start() as fake:
        assert fake.base_url == f"{fake.root_url}/v1"
        async with httpx.AsyncClient(trust_env=False) as client:
            props = await client.get(f"{fake.root_url}/props")

    assert props.json()["default_generation_settings"]["n_ctx"] == 4096


def test_discovery_needs_a_window() -> None:
    with pytest.raises(ValueError, match="context_window"):
        FakeLLM(context_discovery="vllm")
