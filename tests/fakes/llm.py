"""A fake OpenAI-compatible chat-completions endpoint whose answers come from a function you pass (like pydantic-ai's FunctionModel).

    fake = FakeLLM(lambda request: "Paris is the capital of France.")
    client = LLMClient(fake.config(), http_client=fake.http_client())      # in-process (httpx.MockTransport)

    with FakeLLM(default_research_model).start() as fake:                 # loopback server, for other processes
        ... LLM_BASE_URL=fake.base_url ...

A handler takes a `ChatRequest` and returns the answer's text, a dict (sent as JSON text), or a `FakeReply`
for errors, latency, missing usage or a `reasoning_content` field; it may be async. A request with `stream: true`
is answered with server-sent events in OpenAI's chunk format (`chat.completion.chunk`, a word or so per chunk,
`data: [DONE]` last, usage in a last chunk when `stream_options.include_usage`), the first words after
`time_to_first_token` seconds and each further chunk after `chunk_delay`. Every request is recorded
with start and finish times in `fake.requests` (a RequestLog) and parsed in `fake.chat_requests`.

Real servers, each opt-in:

    FakeLLM(model, local_server=LocalServer(prompt_tokens_per_second=50, tokens_per_second=5), time_scale=0.01)

works like llama-cpp-python on a laptop: one request in work at a time, the others waiting in a FIFO queue on
their open connection; the prompt (chars/4 tokens) is read at `prompt_tokens_per_second` before anything is sent
(no headers either), then the answer is written at `tokens_per_second`, chunk by chunk when streamed, whole at the
end otherwise. A request whose client went away is still worked to the end, so a resent copy queues behind it.
The handler is asked when the request's work starts; what the server refuses outright (a `response_format`, an
overflowing context) is answered at once, without queueing.
`fake.local` (a `LocalQueue`) keeps one `LocalWork` per request (queued, started, first token, finished,
disconnected) and counts `max_in_work` and `resent_while_busy`; `await fake.local.wait_idle()` before a test ends.
`quirks="llama_cpp_python"` answers a json_schema `response_format` with that server's HTTP 500 and streams no usage
chunk. `context_window=8192` answers the overflow error of `context_overflow="openai"` (also vLLM, llama-cpp-python)
or `"llama_cpp"` when prompt tokens + max_tokens exceed it, or truncates the prompt silently (`"ollama"`);
`context_discovery="llama_cpp"|"vllm"|"ollama"` tells the size where that server does (`GET /props`,
`GET /v1/models` `max_model_len`, `POST /api/show`), the first and last at `fake.root_url`, not under `/v1`.

Time: every wait of the fake goes through one clock. `time_scale` multiplies the waits (0.01: a 100 s first token
takes 1 s), or pass a `clock`/`sleep` pair (e.g. tests.fakes.clock.ManualClock; in-process transport only; a clock
that jumps on every sleep, like FakeClock, makes every read time out). Times recorded in `fake.local` are on that
clock, in simulated seconds (`clock() / time_scale`). The in-process transport measures the client's read timeout
on the same clock and per read, as a socket does: the wait for the headers, then each gap between streamed events
(it raises httpx.ReadTimeout), so a client keeping a production 60 s timeout times out on a 100 s first token at
any time_scale. Over the loopback server the client's real timeout applies: scale it yourself.

Helpers below are handlers for the common cases; the engine's schemas may evolve, so they stay short. The
`cited_claims` schema is a contract deepthread may ask for instead of inline `[pN]` markers: the answer is
`{"claims": [{"text": "<a sentence>", "passage_id": "p3"}, ...]}` (see `cited_claims`).
"""

from __future__ import annotations

import asyncio
import inspect
import itertools
import json
import math
import re
import threading
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Collection, Mapping
from dataclasses import dataclass, field, replace
from typing import Any, Literal

import httpx

from research.llm import LLMConfig
from research.untrusted import parse_fenced_sources
from tests.fakes.local_llm_server import LocalQueue, LocalServer, LocalWork
from tests.fakes.server import LoopbackServer, RecordedRequest, RequestLog, free_port, read_body

FAKE_MODEL = "fake-model"
TRANSPORT_BASE_URL = "http://fake-llm.invalid/v1"

Answer = str | dict[str, Any] | None
Sleep = Callable[[float], Awaitable[None]]


@dataclass
class FakeReply:
    """A full reply: `content` (text or a dict sent as JSON; for errors, the message or the whole error body), status, headers, delay, usage."""

    content: Answer = ""
    status: int = 200
    headers: dict[str, str] = field(default_factory=dict)
    delay: float = 0.0
    usage: dict[str, int] | Literal["auto", "omit"] = "auto"
    reasoning: str | None = None
    finish_reason: str = "stop"
    time_to_first_token: float | None = None  # streamed answers only; None: the fake's own setting


HandlerResult = Answer | FakeReply
Handler = Callable[["ChatRequest"], HandlerResult | Awaitable[HandlerResult]]


def _content_text(content: Any) -> str:
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "\n".join(str(part.get("text", "")) for part in content if isinstance(part, dict))
    return ""


def estimated_tokens(text: str) -> int:
    """Tokens as the fake counts them: about four characters each."""
    return math.ceil(len(text) / 4)


_SCHEMA_NAME_IN_PROMPT = re.compile(r"\(schema name: ([A-Za-z0-9_-]+)\)")


@dataclass
class ChatRequest:
    """One chat-completions request as the fake received it."""

    model: str
    messages: list[dict[str, Any]]
    response_format: dict[str, Any] | None
    max_tokens: int | None
    temperature: float | None
    raw: dict[str, Any]

    @classmethod
    def from_body(cls, body: Mapping[str, Any]) -> "ChatRequest":
        return cls(
            model=str(body.get("model", "")),
            messages=list(body.get("messages") or []),
            response_format=body.get("response_format"),
            max_tokens=body.get("max_tokens", body.get("max_completion_tokens")),
            temperature=body.get("temperature"),
            raw=dict(body),
        )

    def _texts(self, role: str) -> list[str]:
        return [_content_text(message.get("content")) for message in self.messages if message.get("role") == role]

    @property
    def system(self) -> str:
        """Every system message's text, joined."""
        return "\n\n".join(self._texts("system"))

    @property
    def user(self) -> str:
        """The last user message's text (what the model is answering now)."""
        texts = self._texts("user")
        return texts[-1] if texts else ""

    @property
    def first_user(self) -> str:
        """The first user message's text (the original request, even during a repair exchange)."""
        texts = self._texts("user")
        return texts[0] if texts else ""

    @property
    def text(self) -> str:
        """Every message's text, joined."""
        return "\n\n".join(_content_text(message.get("content")) for message in self.messages)

    @property
    def prompt_tokens(self) -> int:
        """The prompt's size as the fake counts it (`estimated_tokens` of `text`)."""
        return estimated_tokens(self.text)

    @property
    def messages_key(self) -> str:
        """The messages as canonical JSON: equal for two requests that ask exactly the same."""
        return json.dumps(self.messages, sort_keys=True, ensure_ascii=False)

    @property
    def schema_name(self) -> str | None:
        """The json_schema name asked for; in JSON-mode fallback, the name written in the schema instruction."""
        response_format = self.response_format or {}
        if response_format.get("type") == "json_schema":
            return (response_format.get("json_schema") or {}).get("name")
        found = _SCHEMA_NAME_IN_PROMPT.search(self.text)
        return found.group(1) if found else None

    @property
    def json_schema(self) -> dict[str, Any] | None:
        """The JSON Schema sent in `response_format`, if any."""
        response_format = self.response_format or {}
        if response_format.get("type") == "json_schema":
            return (response_format.get("json_schema") or {}).get("schema")
        return None


# ---------------------------------------------------------------------------------------------------------------
# Prepared answers: what is sent, and when
# ---------------------------------------------------------------------------------------------------------------


@dataclass
class _Prepared:
    status: int
    headers: dict[str, str]
    body: bytes
    delay: float
    events: list[bytes] | None = None  # a streamed answer: sent one by one, `body` unused
    first_event_delay: float = 0.0
    event_delay: float = 0.0

    async def head(self, sleep: Sleep) -> "_Prepared":
        """Wait until the status line and headers go out; the answer (its body or its events) is then known."""
        await sleep(self.delay)
        return self

    async def paced_events(self, sleep: Sleep) -> AsyncIterator[bytes]:
        """The streamed answer's events, each after its wait (the first content after the time to first token)."""
        assert self.events is not None
        for index, event in enumerate(self.events):
            wait = self.first_event_delay if index == 1 else self.event_delay if index > 1 else 0.0
            if wait:
                await sleep(wait)
            yield event

    def client_gone(self) -> None:
        """Nothing to record: only a local server's work outlives its client."""


class _LocalJob:
    """One request in a local server's work: the head once known, then the streamed events as they are written."""

    def __init__(self, queue: LocalQueue, work: LocalWork) -> None:
        self.queue = queue
        self.work = work
        self.prepared: _Prepared | None = None
        self._head_known = asyncio.Event()
        self._events: asyncio.Queue[bytes | None] = asyncio.Queue()

    def send_head(self, prepared: _Prepared) -> None:
        self.prepared = prepared
        self._head_known.set()

    def send_event(self, event: bytes | None) -> None:
        self._events.put_nowait(event)

    async def head(self, sleep: Sleep) -> _Prepared:
        await self._head_known.wait()
        assert self.prepared is not None
        return self.prepared

    async def paced_events(self, sleep: Sleep) -> AsyncIterator[bytes]:
        while (event := await self._events.get()) is not None:
            yield event

    def client_gone(self) -> None:
        self.queue.client_gone(self.work)


_Outcome = _Prepared | _LocalJob


class _ClientStream(httpx.AsyncByteStream):
    """A streamed body read through the in-process transport, with the client's read timeout applied to each gap."""

    def __init__(self, fake: "FakeLLM", outcome: _Outcome, read_timeout: float | None, request: httpx.Request) -> None:
        self._fake = fake
        self._outcome = outcome
        self._read_timeout = read_timeout
        self._request = request
        self._finished = False

    async def __aiter__(self) -> AsyncIterator[bytes]:
        events = self._outcome.paced_events(self._fake._sleep)
        try:
            while (event := await self._fake._within(_next_or_none(events), self._read_timeout, self._request)) is not None:
                yield event
            self._finished = True
        finally:
            if not self._finished:
                self._outcome.client_gone()

    async def aclose(self) -> None:
        if not self._finished:
            self._outcome.client_gone()


async def _next_or_none(events: AsyncIterator[bytes]) -> bytes | None:
    try:
        return await events.__anext__()
    except StopAsyncIteration:
        return None


_STREAMED_PIECE = re.compile(r"\s*\S+\s*|\s+")
_SSE_HEADERS = {"content-type": "text/event-stream; charset=utf-8"}


def _openai_error(status: int, message: str, *, error_type: str, param: str | None = None, code: str | None = None) -> FakeReply:
    return FakeReply(content={"error": {"message": message, "type": error_type, "param": param, "code": code}}, status=status)


_DEFAULT_ERROR_TYPES = {
    400: "invalid_request_error", 401: "invalid_request_error", 403: "permission_error", 404: "invalid_request_error",
    429: "rate_limit_exceeded", 500: "server_error", 502: "server_error", 503: "server_error",
}
_UNSUPPORTED_PARAMETER_MESSAGES = {
    "temperature": "Unsupported value: 'temperature' does not support {value} with this model. Only the default (1) value is supported.",
    "max_tokens": "Unsupported parameter: 'max_tokens' is not supported with this model. Use 'max_completion_tokens' instead.",
}

# Captured from the real llama-cpp-python 0.2.62 server, asked for a response_format of type json_schema.
LLAMA_CPP_PYTHON_JSON_SCHEMA_ERROR: dict[str, Any] = {"error": {
    "message": (
        "1 validation error:\n  {'type': 'literal_error', 'loc': ('body', 'response_format', 'type'), "
        "'msg': \"Input should be 'text' or 'json_object'\", 'input': 'json_schema', "
        "'ctx': {'expected': \"'text' or 'json_object'\"}}\n\n  File \"/srv/llama_cpp/server/app.py\", "
        "line 337, in create_chat_completion\n    POST /v1/chat/completions"
    ),
    "type": "internal_server_error", "param": None, "code": None,
}}

Quirks = Literal["llama_cpp_python"]
ContextOverflow = Literal["openai", "llama_cpp", "ollama"]
ContextDiscovery = Literal["llama_cpp", "vllm", "ollama"]
OLLAMA_ARCHITECTURE = "qwen2"


def context_overflow_reply(style: ContextOverflow, context_window: int, prompt_tokens: int, completion_tokens: int) -> FakeReply | None:
    """The error a server of `style` answers when the prompt and the completion do not fit (None for Ollama, which truncates)."""
    if style == "openai":  # OpenAI, vLLM, and llama-cpp-python (exactly what the real local server sent)
        return _openai_error(
            400,
            f"This model's maximum context length is {context_window} tokens. However, you requested "
            f"{prompt_tokens + completion_tokens} tokens ({prompt_tokens} in the messages, {completion_tokens} in the "
            "completion). Please reduce the length of the messages or completion.",
            error_type="invalid_request_error", param="messages", code="context_length_exceeded",
        )
    if style == "llama_cpp":
        return FakeReply(status=400, content={"error": {
            "code": 400, "message": "the request exceeds the available context size, try increasing it",
            "type": "exceed_context_size_error", "n_prompt_tokens": prompt_tokens, "n_ctx": context_window,
        }})
    return None


def truncated_to_fit(request: ChatRequest, budget_tokens: int) -> ChatRequest:
    """`request` with its oldest non-system text dropped until the prompt fits `budget_tokens` (Ollama's silent truncation)."""
    excess = len(request.text) - max(0, budget_tokens) * 4
    if excess <= 0:
        return request
    messages: list[dict[str, Any]] = []
    for message in request.messages:
        text = _content_text(message.get("content"))
        if excess > 0 and message.get("role") != "system":
            dropped = min(excess, len(text))
            excess -= dropped
            if dropped == len(text):
                continue
            message = {**message, "content": text[dropped:]}
        messages.append(message)
    return replace(request, messages=messages, raw={**request.raw, "messages": messages})


class FakeLLM:
    """An OpenAI-compatible endpoint in process (`transport()`) or on a loopback port (`start()`), answering with `handler`."""

    local: LocalQueue | None  # the local server's queue and counters, when `local_server` is set

    def __init__(
        self,
        handler: Handler | None = None,
        *,
        reject_json_schema: bool = False,
        reject_json_object: bool = False,
        unsupported_parameters: Collection[str] = (),
        latency: float = 0.0,
        models: Collection[str] = (FAKE_MODEL,),
        time_to_first_token: float = 0.0,
        chunk_delay: float = 0.0,
        local_server: LocalServer | None = None,
        quirks: Quirks | None = None,
        context_window: int | None = None,
        context_overflow: ContextOverflow = "openai",
        context_discovery: ContextDiscovery | None = None,
        time_scale: float = 1.0,
        clock: Callable[[], float] | None = None,
        sleep: Sleep | None = None,
    ) -> None:
        if context_discovery is not None and context_window is None:
            raise ValueError("context_discovery needs a context_window to tell")
        if time_scale <= 0:
            raise ValueError("time_scale must be positive")
        self.handler: Handler = handler or default_research_model
        self.reject_json_schema = reject_json_schema
        self.reject_json_object = reject_json_object
        self.unsupported_parameters = frozenset(unsupported_parameters)
        self.latency = latency
        self.time_to_first_token = time_to_first_token
        self.chunk_delay = chunk_delay
        self.models = list(models)
        self.quirks = quirks
        self.context_window = context_window
        self.context_overflow = context_overflow
        self.context_discovery = context_discovery
        self.time_scale = time_scale
        self._clock = clock or time.monotonic
        self._sleep_on_clock: Sleep = sleep or asyncio.sleep
        self.local_server = local_server
        self.requests = RequestLog()
        self.chat_requests: list[ChatRequest] = []
        self.handler_errors: list[BaseException] = []
        self._lock = threading.Lock()
        self._ids = itertools.count(1)
        self._server: LoopbackServer | None = None
        self._local_tasks: set[asyncio.Task[None]] = set()

    @property
    def local_server(self) -> LocalServer | None:
        """The local server imitated, if any; setting it (also after construction) starts a fresh `local` queue."""
        return self.local.server if self.local is not None else None

    @local_server.setter
    def local_server(self, server: LocalServer | None) -> None:
        self.local = LocalQueue(server) if server is not None else None

    # -- ways in --------------------------------------------------------------------------------------------

    def transport(self) -> httpx.MockTransport:
        """An in-process transport for `httpx.AsyncClient(transport=...)`; waits use the fake's clock and respect the read timeout."""
        return httpx.MockTransport(self._handle_httpx)

    def http_client(self) -> httpx.AsyncClient:
        """An `httpx.AsyncClient` wired to `transport()`."""
        return httpx.AsyncClient(transport=self.transport())

    @property
    def base_url(self) -> str:
        """The loopback server's `/v1` URL once started; before that, a placeholder host for the in-process transport."""
        return f"{self.root_url}/v1"

    @property
    def root_url(self) -> str:
        """The server's root, where llama.cpp's `/props` and Ollama's `/api/show` live (`base_url` without `/v1`)."""
        return self._server.url if self._server is not None else TRANSPORT_BASE_URL.removesuffix("/v1")

    def config(self, **overrides: Any) -> LLMConfig:
        """An LLMConfig pointing at this fake (short timeout, no retries unless overridden)."""
        values: dict[str, Any] = {"base_url": self.base_url, "model": self.models[0], "timeout_seconds": 10.0, "max_retries": 0}
        values.update(overrides)
        return LLMConfig(**values)

    def start(self, port: int | None = None) -> "FakeLLM":
        """Serve on 127.0.0.1 (a free port unless given); `base_url` then points there."""
        self._server = LoopbackServer(self._asgi_app(), port=port or free_port()).start()
        return self

    def stop(self) -> None:
        if self._server is not None:
            self._server.stop()
            self._server = None

    def __enter__(self) -> "FakeLLM":
        return self if self._server is not None else self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    # -- time -----------------------------------------------------------------------------------------------

    def now(self) -> float:
        """The fake's clock in simulated seconds (`clock() / time_scale`)."""
        return self._clock() / self.time_scale

    async def _sleep(self, seconds: float) -> None:
        """Wait `seconds` simulated seconds on the fake's clock."""
        if seconds > 0:
            await self._sleep_on_clock(seconds * self.time_scale)

    async def _within(self, awaitable: Awaitable[Any], timeout: float | None, request: httpx.Request) -> Any:
        """`awaitable`'s result, or httpx.ReadTimeout once `timeout` simulated seconds pass first (a socket read's timeout)."""
        if timeout is None:
            return await awaitable
        work = asyncio.ensure_future(awaitable)
        timer = asyncio.ensure_future(self._sleep(timeout))
        try:
            await asyncio.wait({work, timer}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            timer.cancel()
            timed_out = not work.done()
            if timed_out:
                work.cancel()
        if timed_out:
            raise httpx.ReadTimeout("fake LLM: read timed out", request=request)
        return work.result()

    # -- what it answers ------------------------------------------------------------------------------------

    async def _prepare(self, method: str, path: str, body: bytes) -> _Outcome:
        if method == "GET" and path.endswith("/models"):
            return self._json(200, self._model_listing())
        if method == "GET" and path == "/props" and self.context_discovery == "llama_cpp" and self.context_window:
            return self._json(200, self._llama_cpp_props())
        if method == "POST" and path == "/api/show" and self.context_discovery == "ollama" and self.context_window:
            return self._ollama_show(body)
        if method != "POST" or not path.endswith("/chat/completions"):
            return self._render(_openai_error(404, f"Unknown request URL: {method} {path}", error_type="invalid_request_error"), None)
        try:
            request = ChatRequest.from_body(json.loads(body or b"{}"))
        except (json.JSONDecodeError, AttributeError):
            return self._render(_openai_error(400, "We could not parse the JSON body of your request.", error_type="invalid_request_error"), None)
        with self._lock:
            self.chat_requests.append(request)
        rejection = self._rejection(request)
        if rejection is not None:
            return self._render(rejection, request)
        if self.context_window is not None and self.context_overflow == "ollama":
            request = truncated_to_fit(request, self.context_window - (request.max_tokens or 0))
        if self.local is not None:
            return await self._queue_locally(request)
        return self._render(await self._ask_handler(request), request)

    def _json(self, status: int, payload: Any) -> _Prepared:
        return _Prepared(status, {"content-type": "application/json"}, json.dumps(payload).encode(), self.latency)

    def _model_listing(self) -> dict[str, Any]:
        def entry(name: str) -> dict[str, Any]:
            model: dict[str, Any] = {"id": name, "object": "model", "created": 0, "owned_by": "fake"}
            if self.context_discovery == "vllm" and self.context_window:
                model.update(root=name, parent=None, max_model_len=self.context_window, permission=[])
            return model

        return {"object": "list", "data": [entry(name) for name in self.models]}

    def _llama_cpp_props(self) -> dict[str, Any]:
        return {
            "default_generation_settings": {
                "id": 0, "id_task": -1, "n_ctx": self.context_window, "speculative": False, "is_processing": False,
                "params": {"n_predict": -1, "temperature": 0.8, "top_k": 40, "top_p": 0.95},
            },
            "total_slots": 1,
            "model_path": f"/models/{self.models[0]}.gguf",
            "model_alias": self.models[0],
            "chat_template": "{% for message in messages %}{{ message.content }}{% endfor %}",
            "modalities": {"vision": False, "audio": False},
            "build_info": "b0000-fake",
        }

    def _ollama_show(self, body: bytes) -> _Prepared:
        try:
            asked = json.loads(body or b"{}")
            name = str(asked.get("model") or asked.get("name") or "")  # "name" in Ollama before 0.4
        except (json.JSONDecodeError, AttributeError):
            name = ""
        if name not in self.models:
            return self._json(404, {"error": f"model '{name}' not found"})
        return self._json(200, {
            "modelfile": f"FROM {name}\nPARAMETER num_ctx {self.context_window}",
            "parameters": f"num_ctx                        {self.context_window}",
            "template": "{{ .Prompt }}",
            "details": {"parent_model": "", "format": "gguf", "family": OLLAMA_ARCHITECTURE, "families": [OLLAMA_ARCHITECTURE],
                        "parameter_size": "7.6B", "quantization_level": "Q4_K_M"},
            "model_info": {
                "general.architecture": OLLAMA_ARCHITECTURE, "general.parameter_count": 7615616512,
                f"{OLLAMA_ARCHITECTURE}.context_length": self.context_window, f"{OLLAMA_ARCHITECTURE}.embedding_length": 3584,
            },
            "capabilities": ["completion"],
        })

    def _rejection(self, request: ChatRequest) -> FakeReply | None:
        kind = (request.response_format or {}).get("type")
        if kind == "json_schema" and self.quirks == "llama_cpp_python":
            return FakeReply(content=LLAMA_CPP_PYTHON_JSON_SCHEMA_ERROR, status=500)
        if (kind == "json_schema" and self.reject_json_schema) or (kind == "json_object" and self.reject_json_object):
            return _openai_error(
                400,
                f"Invalid parameter: 'response_format' of type '{kind}' is not supported with this model.",
                error_type="invalid_request_error", param="response_format",
            )
        refused = sorted(self.unsupported_parameters & request.raw.keys())
        if refused:
            parameter = refused[0]
            template = _UNSUPPORTED_PARAMETER_MESSAGES.get(parameter, "Unsupported parameter: '{name}' is not supported with this model.")
            return _openai_error(
                400, template.format(name=parameter, value=request.raw[parameter]),
                error_type="invalid_request_error", param=parameter, code="unsupported_parameter",
            )
        if self.context_window is not None:
            completion_tokens = request.max_tokens or 0
            if request.prompt_tokens + completion_tokens > self.context_window:
                return context_overflow_reply(self.context_overflow, self.context_window, request.prompt_tokens, completion_tokens)
        return None

    async def _ask_handler(self, request: ChatRequest) -> FakeReply:
        try:
            result = self.handler(request)
            if inspect.isawaitable(result):
                result = await result
        except Exception as error:  # noqa: BLE001 - a broken handler must surface in the test, not as a hang
            self.handler_errors.append(error)
            reply = _openai_error(500, f"fake LLM handler raised {type(error).__name__}: {error}", error_type="server_error")
            reply.headers["x-should-retry"] = "false"
            return reply
        return result if isinstance(result, FakeReply) else FakeReply(content=result)

    def _render(self, reply: FakeReply, request: ChatRequest | None) -> _Prepared:
        headers = {"content-type": "application/json", **{key.lower(): value for key, value in reply.headers.items()}}
        delay = self.latency + reply.delay
        if reply.status != 200:
            body = reply.content if isinstance(reply.content, dict) else {
                "error": {
                    "message": reply.content or f"fake error {reply.status}",
                    "type": _DEFAULT_ERROR_TYPES.get(reply.status, "api_error"), "param": None, "code": None,
                },
            }
            return _Prepared(reply.status, headers, json.dumps(body, separators=(",", ":")).encode(), delay)
        assert request is not None
        if request.raw.get("stream"):
            first_token = self.time_to_first_token if reply.time_to_first_token is None else reply.time_to_first_token
            return _Prepared(200, {**headers, **_SSE_HEADERS}, b"", delay,
                             events=[_sse(chunk) for chunk in self._stream_chunks(reply, request)] + [_SSE_DONE],
                             first_event_delay=first_token, event_delay=self.chunk_delay)
        return _Prepared(200, headers, json.dumps(self._completion(reply, request)).encode(), delay)

    def _stream_chunks(self, reply: FakeReply, request: ChatRequest) -> list[dict[str, Any]]:
        """The answer as OpenAI streams it: a role chunk, content chunks, a finish chunk, usage if asked (`[DONE]` follows)."""
        completion = self._completion(reply, request)
        content = completion["choices"][0]["message"]["content"] or ""
        base = {"id": completion["id"], "object": "chat.completion.chunk", "created": completion["created"],
                "model": completion["model"], "system_fingerprint": None}

        def chunk(delta: dict[str, Any], finish_reason: str | None = None) -> dict[str, Any]:
            return {**base, "choices": [{"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish_reason}]}

        chunks = [chunk({"role": "assistant", "content": ""})]
        if reply.reasoning:
            chunks += [chunk({"reasoning_content": piece}) for piece in _STREAMED_PIECE.findall(reply.reasoning)]
        chunks += [chunk({"content": piece}) for piece in _STREAMED_PIECE.findall(content)]
        chunks.append(chunk({}, reply.finish_reason))
        usage_asked = (request.raw.get("stream_options") or {}).get("include_usage")
        if usage_asked and "usage" in completion and self.quirks != "llama_cpp_python":  # that server accepts it, sends none
            chunks.append({**base, "choices": [], "usage": completion["usage"]})
        return chunks

    def _completion(self, reply: FakeReply, request: ChatRequest) -> dict[str, Any]:
        content = json.dumps(reply.content) if isinstance(reply.content, dict) else reply.content
        message: dict[str, Any] = {"role": "assistant", "content": content}
        if reply.reasoning is not None:
            message["reasoning_content"] = reply.reasoning
        completion: dict[str, Any] = {
            "id": f"chatcmpl-fake-{next(self._ids)}",
            "object": "chat.completion",
            "created": int(time.time()),
            "model": request.model,
            "choices": [{"index": 0, "message": message, "logprobs": None, "finish_reason": reply.finish_reason}],
        }
        if reply.usage == "auto":
            prompt_tokens, completion_tokens = request.prompt_tokens, estimated_tokens(content or "")
            completion["usage"] = {
                "prompt_tokens": prompt_tokens, "completion_tokens": completion_tokens, "total_tokens": prompt_tokens + completion_tokens,
            }
        elif reply.usage != "omit":
            completion["usage"] = dict(reply.usage)
        return completion

    # -- a local server's work ------------------------------------------------------------------------------

    async def _queue_locally(self, request: ChatRequest) -> _LocalJob:
        assert self.local is not None
        await self._sleep(self.latency)
        work = self.local.arrive(request.messages_key, stream=bool(request.raw.get("stream")),
                                  prompt_tokens=request.prompt_tokens, now=self.now())
        job = _LocalJob(self.local, work)
        # The work is its own task: it goes on to the end when the client gives up, as a real server's does.
        task = asyncio.get_running_loop().create_task(self._work_locally(job, request))
        self._local_tasks.add(task)
        task.add_done_callback(self._local_tasks.discard)
        return job

    async def _work_locally(self, job: _LocalJob, request: ChatRequest) -> None:
        queue, work, speed = job.queue, job.work, job.queue.server
        await queue.take_turn(work)
        try:
            queue.update(work, started_at=self.now())
            reply = await self._ask_handler(request)
            if reply.status != 200:
                job.send_head(replace(self._render(reply, request), delay=0.0))
                return
            await self._sleep(work.prompt_tokens / speed.prompt_tokens_per_second + reply.delay)
            queue.update(work, first_token_at=self.now())
            if request.raw.get("stream"):
                job.send_head(_Prepared(200, {**_SSE_HEADERS, **{k.lower(): v for k, v in reply.headers.items()}}, b"", 0.0, events=[]))
                written = 0  # characters; a chunk's time is its share of the tokens (four characters each)
                for chunk in self._stream_chunks(reply, request):
                    delta = chunk["choices"][0]["delta"] if chunk["choices"] else {}
                    piece = len(delta.get("content") or delta.get("reasoning_content") or "")
                    await self._sleep(piece / 4 / speed.tokens_per_second)
                    written += piece
                    queue.update(work, completion_tokens=math.ceil(written / 4))
                    job.send_event(_sse(chunk))
                job.send_event(_SSE_DONE)
            else:
                prepared = self._render(reply, request)
                answer = json.dumps(reply.content) if isinstance(reply.content, dict) else reply.content or ""
                queue.update(work, completion_tokens=estimated_tokens(answer) + estimated_tokens(reply.reasoning or ""))
                await self._sleep(work.completion_tokens / speed.tokens_per_second)
                job.send_head(replace(prepared, delay=0.0))
        except Exception as error:  # noqa: BLE001 - a bug in the fake must surface in the test, not as a hang
            self.handler_errors.append(error)
            if job.prepared is None:
                job.send_head(self._render(_openai_error(500, f"fake local server failed: {error}", error_type="server_error"), None))
        finally:
            job.send_event(None)
            queue.update(work, finished_at=self.now())
            queue.release()

    # -- the two adapters -----------------------------------------------------------------------------------

    def _record(self, method: str, host: str, path: str, query: dict[str, str], headers: dict[str, str], body: bytes) -> RecordedRequest:
        record = RecordedRequest(method=method, host=host, path=path, query=query, headers=headers, body=body)
        self.requests.add(record)
        return record

    async def _handle_httpx(self, request: httpx.Request) -> httpx.Response:
        body = await request.aread()
        headers = {key.lower(): value for key, value in request.headers.items()}
        record = self._record(request.method, request.url.host, request.url.path, dict(request.url.params), headers, body)
        read_timeout = (request.extensions.get("timeout") or {}).get("read")
        try:
            outcome = await self._prepare(request.method, request.url.path, body)
            try:
                head = await self._within(outcome.head(self._sleep), read_timeout, request)
            except BaseException:
                outcome.client_gone()
                raise
            if head.events is not None:
                return httpx.Response(head.status, headers=head.headers, stream=_ClientStream(self, outcome, read_timeout, request))
            return httpx.Response(head.status, headers=head.headers, content=head.body)
        finally:
            record.finished_at = time.monotonic()

    def _asgi_app(self) -> Callable[..., Any]:
        # uvicorn takes a bound method for an ASGI2 app; a plain coroutine function is ASGI3 to it.
        async def app(scope: dict[str, Any], receive: Callable[[], Any], send: Callable[[dict], Any]) -> None:
            if scope["type"] != "http":
                return
            await self._serve_asgi(scope, receive, send)

        return app

    async def _serve_asgi(self, scope: dict[str, Any], receive: Callable[[], Any], send: Callable[[dict], Any]) -> None:
        body = await read_body(receive)
        headers = {key.decode("latin-1").lower(): value.decode("latin-1") for key, value in scope["headers"]}
        query = dict(httpx.QueryParams(scope.get("query_string", b"").decode("latin-1")))
        record = self._record(scope["method"], headers.get("host", "").split(":")[0], scope["path"], query, headers, body)
        watcher: asyncio.Task[None] | None = None
        try:
            outcome = await self._prepare(scope["method"], scope["path"], body)
            if isinstance(outcome, _LocalJob):
                watcher = asyncio.get_running_loop().create_task(_watch_disconnect(receive, outcome))
            head = await outcome.head(self._sleep)
            raw_headers = [(key.encode("latin-1"), value.encode("latin-1")) for key, value in head.headers.items()]
            if head.events is not None:
                await send({"type": "http.response.start", "status": head.status, "headers": raw_headers})
                async for event in outcome.paced_events(self._sleep):
                    await send({"type": "http.response.body", "body": event, "more_body": True})
                await send({"type": "http.response.body", "body": b"", "more_body": False})
                return
            raw_headers.append((b"content-length", str(len(head.body)).encode()))
            await send({"type": "http.response.start", "status": head.status, "headers": raw_headers})
            await send({"type": "http.response.body", "body": head.body, "more_body": False})
        finally:
            if watcher is not None:
                watcher.cancel()
            record.finished_at = time.monotonic()


async def _watch_disconnect(receive: Callable[[], Any], job: _LocalJob) -> None:
    """Mark the job's client gone when uvicorn says the connection closed before the work finished."""
    while (await receive()).get("type") != "http.disconnect":
        pass
    job.client_gone()


_SSE_DONE = b"data: [DONE]\n\n"


def _sse(chunk: dict[str, Any]) -> bytes:
    return f"data: {json.dumps(chunk)}\n\n".encode()


# ---------------------------------------------------------------------------------------------------------------
# Handlers and pieces of handlers
# ---------------------------------------------------------------------------------------------------------------

_SENTENCE_END = re.compile(r"(?<=[.!?])\s+")
_CITATION = re.compile(r"\[(p\d+(?:\s*,\s*p\d+)*)\]")
_QUESTION_LINE = re.compile(r"^\s*(?:question|research question)\s*:\s*(.+)$", re.IGNORECASE | re.MULTILINE)
_FENCED_BLOCKS = re.compile(r"<untrusted_source\b.*?</untrusted_source>", re.DOTALL)


def in_order(*answers: HandlerResult | Handler) -> Handler:
    """A handler giving `answers` one per call, in order, repeating the last; an answer may itself be a handler."""
    if not answers:
        raise ValueError("in_order needs at least one answer")
    calls = itertools.count()
    lock = threading.Lock()

    def handler(request: ChatRequest) -> HandlerResult | Awaitable[HandlerResult]:
        with lock:
            index = min(next(calls), len(answers) - 1)
        answer = answers[index]
        return answer(request) if callable(answer) else answer

    return handler


def passages_in(request: ChatRequest) -> dict[str, str]:
    """Passage id → text for every `<untrusted_source>` block in the request, in the order shown."""
    return {source.id: source.text for source in parse_fenced_sources(request.text)}


def cited_ids(text: str) -> list[str]:
    """Every `[pN]` (or `[pN, pM]`) citation in `text`, in order, repeats kept."""
    return [part.strip() for group in _CITATION.findall(text) for part in group.split(",")]


def question_in(request: ChatRequest) -> str:
    """The user's question: a `Question:` line if there is one, else the first line of the first user message outside any fence."""
    outside_fences = _FENCED_BLOCKS.sub("", request.first_user)
    labelled = _QUESTION_LINE.search(outside_fences)
    if labelled:
        return labelled.group(1).strip()
    lines = [line.strip() for line in outside_fences.splitlines() if line.strip()]
    return lines[0] if lines else ""


def sentences(text: str) -> list[str]:
    """`text` split into sentences at `.`, `!` or `?` followed by white space."""
    return [sentence.strip() for sentence in _SENTENCE_END.split(" ".join(text.split())) if sentence.strip()]


def cite(sentence: str, passage_id: str) -> str:
    """`sentence` with `[passage_id]` placed before its final punctuation."""
    body = sentence.rstrip()
    ending = body[-1] if body and body[-1] in ".!?" else "."
    return f"{body.rstrip('.!?')} [{passage_id}]{ending}"


def _report(paragraphs: list[str]) -> str:
    return "\n\n".join(["## Findings", *paragraphs])


def _restated_passages(request: ChatRequest) -> list[str]:
    return [cite(sentences(text)[0], passage_id) for passage_id, text in passages_in(request).items() if sentences(text)]


def _require_passages(request: ChatRequest) -> dict[str, str]:
    passages = passages_in(request)
    if not passages:
        raise ValueError("the prompt shows no <untrusted_source> passages to cite")
    return passages


def citing_synthesis(request: ChatRequest) -> str:
    """A Markdown report restating each shown passage's first sentence, cited `[pN]`."""
    _require_passages(request)
    return _report(_restated_passages(request))


def unshown_passage_id(request: ChatRequest) -> str:
    """A passage id that the request never showed (`p999` unless taken)."""
    shown = set(passages_in(request))
    return next(f"p{number}" for number in itertools.count(999) if f"p{number}" not in shown)


def fabricating_synthesis(request: ChatRequest) -> str:
    """`citing_synthesis` plus one sentence citing a passage id that was never shown."""
    fabricated = cite("Independent auditors confirmed all of these figures in a later review.", unshown_passage_id(request))
    return _report([*_restated_passages(request), fabricated]) if passages_in(request) else _report([fabricated])


def change_first_number(sentence: str) -> str:
    """`sentence` with the first digit of its first number changed (1→2 … 9→1), so the figure is wrong but plausible."""
    return re.sub(r"\d", lambda digit: str(int(digit.group()) % 9 + 1), sentence, count=1)


def wrong_number_synthesis(request: ChatRequest) -> str:
    """A report like `citing_synthesis`, except the first passage sentence containing a number is restated with that number changed."""
    passages = _require_passages(request)
    paragraphs: list[str] = []
    changed = False
    for passage_id, text in passages.items():
        passage_sentences = sentences(text)
        with_number = next((sentence for sentence in passage_sentences if re.search(r"\d", sentence)), None)
        if with_number is not None and not changed:
            paragraphs.append(cite(change_first_number(with_number), passage_id))
            changed = True
        elif passage_sentences:
            paragraphs.append(cite(passage_sentences[0], passage_id))
    if not changed:
        raise ValueError("no shown passage contains a number to change")
    return _report(paragraphs)


UNRELATED_SENTENCE = "The city's oldest bakery switched to sourdough bread in the spring."


def unrelated_citation_synthesis(request: ChatRequest) -> str:
    """`citing_synthesis` plus `UNRELATED_SENTENCE`, cited to the first shown passage, which says nothing about it."""
    first_id = next(iter(_require_passages(request)))
    return _report([*_restated_passages(request), cite(UNRELATED_SENTENCE, first_id)])


def cited_claims(request: ChatRequest) -> dict[str, Any]:
    """The `cited_claims` answer: `{"claims": [{"text": sentence, "passage_id": "p3"}, ...]}`, each shown passage's first
    sentence word for word with its id, in prompt order (no claims when no passage is shown)."""
    claims = [{"text": sentences(text)[0], "passage_id": passage_id}
              for passage_id, text in passages_in(request).items() if sentences(text)]
    return {"claims": claims}


def timing_out(delay: float = 30.0) -> Handler:
    """A handler whose every answer arrives after `delay` seconds."""

    def handler(request: ChatRequest) -> FakeReply:
        return FakeReply(content="This answer arrives too late.", delay=delay)

    return handler


def unavailable_while_writing(model: Handler | None = None, *, status: int = 503) -> Handler:
    """`model` (the default one unless given), except that every free-text request showing passages (a report, a
    follow-up answer) is answered HTTP `status`: the model goes down once the sources are gathered."""

    def handler(request: ChatRequest) -> HandlerResult | Awaitable[HandlerResult]:
        if request.schema_name is None and passages_in(request):
            return FakeReply(content="The server is overloaded, please try again later.", status=status)
        return (model or default_research_model)(request)

    return handler


def decomposition(subquestions: list[str], queries: list[str] | None = None) -> Callable[[ChatRequest], dict[str, Any]]:
    """A handler answering the decomposition JSON; each sub-question is its own query unless `queries` are given (dealt out round-robin)."""
    per_question: list[list[str]] = [[] for _ in subquestions]
    if queries is None:
        per_question = [[question] for question in subquestions]
    else:
        for index, query in enumerate(queries):
            per_question[index % len(subquestions)].append(query)
    answer = {
        "sub_questions": [{"question": question, "queries": found} for question, found in zip(subquestions, per_question)],
        "outline": list(subquestions),
    }

    def handler(request: ChatRequest) -> dict[str, Any]:
        return answer

    return handler


def default_research_model(request: ChatRequest) -> HandlerResult:
    """A well-behaved model: routes structured requests by schema name, writes a cited report when passages are shown, else chats."""
    question = question_in(request).rstrip("?") or "the question"
    name = request.schema_name
    if name == "decomposition":
        return decomposition(
            [f"Background: {question}?", f"Recent evidence: {question}?"], [question, f"{question} latest"],
        )(request)
    if name == "gap_check":
        return {"covered": True, "sub_questions": [], "more_queries": []}
    if name == "citation_check":
        ids = list(passages_in(request)) or list(dict.fromkeys(cited_ids(request.text)))
        return {"verdicts": [{"id": passage_id, "supported": True} for passage_id in ids]}
    if name == "plan":
        return {
            "query": question,
            "key_questions": [f"Background: {question}?", f"Recent evidence: {question}?"],
            "search_strategy": [{"query": question, "source_type": "official documentation"},
                                {"query": f"{question} latest", "source_type": "news"}],
            "deliverable": "A cited report answering the question.",
        }
    if name == "cited_claims":
        return cited_claims(request)
    if name is not None:
        return {}
    if passages_in(request):
        return citing_synthesis(request)
    return f"Here is a short answer about {question}."
