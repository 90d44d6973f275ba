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
with start and finish times in `fake.requests` (a RequestLog) and parsed in `fake.chat_requests`. The
in-process transport honours the client's read timeout as a real socket would (it raises httpx.ReadTimeout).

Helpers below are handlers for the common cases; the engine's schemas may evolve, so they stay short.
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
from dataclasses import dataclass, field
from typing import Any, Literal

import httpx

from research.llm import LLMConfig
from research.untrusted import parse_fenced_sources
from tests.fakes.server import LoopbackServer, RecordedRequest, RequestLog, free_port

FAKE_MODEL = "fake-model"
TRANSPORT_BASE_URL = "http://fake-llm.invalid/v1"

Answer = str | dict[str, Any] | None


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


@dataclass
class _Prepared:
    status: int
    headers: dict[str, str]
    body: bytes
    delay: float
    events: list[bytes] | None = None  # a streamed answer: sent one by one, `body` unused
    first_event_delay: float = 0.0
    event_delay: float = 0.0

    async def paced_events(self) -> AsyncIterator[bytes]:
        """The streamed answer's events, each after its wait (the first content after the time to first token)."""
        assert self.events is not None
        for index, event in enumerate(self.events):
            wait = self.first_event_delay if index == 1 else self.event_delay if index > 1 else 0.0
            if wait:
                await asyncio.sleep(wait)
            yield event


_STREAMED_PIECE = re.compile(r"\s*\S+\s*|\s+")


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


class FakeLLM:
    """An OpenAI-compatible endpoint in process (`transport()`) or on a loopback port (`start()`), answering with `handler`."""

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
    ) -> None:
        self.handler: Handler = handler or default_research_model
        self.reject_json_schema = reject_json_schema
        self.reject_json_object = reject_json_object
        self.unsupported_parameters = frozenset(unsupported_parameters)
        self.latency = latency
        self.time_to_first_token = time_to_first_token
        self.chunk_delay = chunk_delay
        self.models = list(models)
        self.requests = RequestLog()
        self.chat_requests: list[ChatRequest] = []
        self.handler_errors: list[BaseException] = []
        self._lock = threading.Lock()
        self._ids = itertools.count(1)
        self._server: LoopbackServer | None = None

    # -- ways in --------------------------------------------------------------------------------------------

    def transport(self) -> httpx.MockTransport:
        """An in-process transport for `httpx.AsyncClient(transport=...)`; delays use asyncio.sleep and respect the read timeout."""
        return httpx.MockTransport(self._handle_httpx)

    def http_client(self) -> httpx.AsyncClient:
        """An `httpx.AsyncClient` wired to `transport()`."""
        return httpx.AsyncClient(transport=self.transport())

    @property
    def base_url(self) -> str:
        """The loopback server's `/v1` URL once started; before that, a placeholder host for the in-process transport."""
        return f"{self._server.url}/v1" if self._server is not None else TRANSPORT_BASE_URL

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

    # -- what it answers ------------------------------------------------------------------------------------

    async def _prepare(self, method: str, path: str, body: bytes) -> _Prepared:
        if method == "GET" and path.endswith("/models"):
            listing = {"object": "list", "data": [{"id": name, "object": "model", "created": 0, "owned_by": "fake"} for name in self.models]}
            return _Prepared(200, {"content-type": "application/json"}, json.dumps(listing).encode(), self.latency)
        if method != "POST" or not path.endswith("/chat/completions"):
            return self._render(_openai_error(404, f"Unknown request URL: {method} {path}", error_type="invalid_request_error"), None)
        try:
            request = ChatRequest.from_body(json.loads(body or b"{}"))
        except (json.JSONDecodeError, AttributeError):
            return self._render(_openai_error(400, "We could not parse the JSON body of your request.", error_type="invalid_request_error"), None)
        with self._lock:
            self.chat_requests.append(request)
        reply = self._rejection(request) or await self._ask_handler(request)
        return self._render(reply, request)

    def _rejection(self, request: ChatRequest) -> FakeReply | None:
        kind = (request.response_format or {}).get("type")
        if (kind == "json_schema" and self.reject_json_schema) or (kind == "json_object" and self.reject_json_object):
            return _openai_error(
                400,
                f"Invalid parameter: 'response_format' of type '{kind}' is not supported with this model.",
                error_type="invalid_request_error", param="response_format",
            )
        refused = sorted(self.unsupported_parameters & request.raw.keys())
        if not refused:
            return None
        parameter = refused[0]
        template = _UNSUPPORTED_PARAMETER_MESSAGES.get(parameter, "Unsupported parameter: '{name}' is not supported with this model.")
        return _openai_error(
            400, template.format(name=parameter, value=request.raw[parameter]),
            error_type="invalid_request_error", param=parameter, code="unsupported_parameter",
        )

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
            return _Prepared(reply.status, headers, json.dumps(body).encode(), delay)
        assert request is not None
        if request.raw.get("stream"):
            first_token = self.time_to_first_token if reply.time_to_first_token is None else reply.time_to_first_token
            return _Prepared(200, {**headers, "content-type": "text/event-stream; charset=utf-8"}, b"", delay,
                             events=self._stream_events(reply, request), first_event_delay=first_token,
                             event_delay=self.chunk_delay)
        return _Prepared(200, headers, json.dumps(self._completion(reply, request)).encode(), delay)

    def _stream_events(self, reply: FakeReply, request: ChatRequest) -> list[bytes]:
        """The answer as OpenAI streams it: a role chunk, content chunks, a finish chunk, usage if asked, `[DONE]`."""
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
        if (request.raw.get("stream_options") or {}).get("include_usage") and "usage" in completion:
            chunks.append({**base, "choices": [], "usage": completion["usage"]})
        return [f"data: {json.dumps(item)}\n\n".encode() for item in chunks] + [b"data: [DONE]\n\n"]

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
            prompt_tokens, completion_tokens = math.ceil(len(request.text) / 4), math.ceil(len(content or "") / 4)
            completion["usage"] = {
                "prompt_tokens": prompt_tokens, "completion_tokens": completion_tokens, "total_tokens": prompt_tokens + completion_tokens,
            }
        elif reply.usage != "omit":
            completion["usage"] = dict(reply.usage)
        return completion

    # -- the two adapters -----------------------------------------------------------------------------------

    def _record(self, method: str, host: str, path: str, query: dict[str, str], headers: dict[str, str], body: bytes) -> RecordedRequest:
        record = RecordedRequest(method=method, host=host, path=path, query=query, headers=headers, body=body)
        self.requests.add(record)
        return record

    async def _handle_httpx(self, request: httpx.Request) -> httpx.Response:
        body = await request.aread()
        headers = {key.lower(): value for key, value in request.headers.items()}
        record = self._record(request.method, request.url.host, request.url.path, dict(request.url.params), headers, body)
        try:
            prepared = await self._prepare(request.method, request.url.path, body)
            read_timeout = (request.extensions.get("timeout") or {}).get("read")
            if read_timeout is not None and prepared.delay > read_timeout:
                await asyncio.sleep(read_timeout)
                raise httpx.ReadTimeout("fake LLM: read timed out", request=request)
            if prepared.delay:
                await asyncio.sleep(prepared.delay)
            if prepared.events is not None:
                return httpx.Response(prepared.status, headers=prepared.headers, content=prepared.paced_events())
            return httpx.Response(prepared.status, headers=prepared.headers, content=prepared.body)
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
        body = bytearray()
        while True:
            message = await receive()
            body += message.get("body", b"")
            if not message.get("more_body"):
                break
        headers = {key.decode("latin-1").lower(): value.decode("latin-1") for key, value in scope["headers"]}
        query = dict(httpx.QueryParams(scope.get("query_string", b"").decode("latin-1")))
        record = self._record(scope["method"], headers.get("host", "").split(":")[0], scope["path"], query, headers, bytes(body))
        try:
            prepared = await self._prepare(scope["method"], scope["path"], bytes(body))
            if prepared.delay:
                await asyncio.sleep(prepared.delay)
            raw_headers = [(key.encode("latin-1"), value.encode("latin-1")) for key, value in prepared.headers.items()]
            if prepared.events is not None:
                await send({"type": "http.response.start", "status": prepared.status, "headers": raw_headers})
                async for event in prepared.paced_events():
                    await send({"type": "http.response.body", "body": event, "more_body": True})
                await send({"type": "http.response.body", "body": b"", "more_body": False})
                return
            raw_headers.append((b"content-length", str(len(prepared.body)).encode()))
            await send({"type": "http.response.start", "status": prepared.status, "headers": raw_headers})
            await send({"type": "http.response.body", "body": prepared.body, "more_body": False})
        finally:
            record.finished_at = time.monotonic()


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
    if name is not None:
        return {}
    if passages_in(request):
        return citing_synthesis(request)
    return f"Here is a short answer about {question}."
