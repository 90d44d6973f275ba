"""LLM access through the official `openai` SDK against any OpenAI-compatible endpoint: text, validated JSON, usage and cost.

Retries: the SDK itself retries connection errors, timeouts, 408, 409, 429 and 5xx `max_retries` times with
exponential backoff (0.5 s doubling to 8 s, with jitter) and honours `retry-after-ms` / `Retry-After` up to
two minutes (`openai/_base_client.py`: `_should_retry`, `_calculate_retry_timeout`); a `Retry-After` of 0 is
treated as absent, so the backoff applies. This module adds nothing to that loop.

Endpoints differ; a 400 that names an unsupported feature is remembered for the client's lifetime and worked
around: `json_schema` → JSON mode (`json_object`) → schema in the prompt only; `temperature` → left out;
`max_tokens` → `max_completion_tokens` (OpenAI's reasoning models).
"""

from __future__ import annotations

import copy
import json
import math
import re
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from typing import Any, Literal, TypeVar

import httpx
import openai
from openai.types.chat import ChatCompletion
from openai.types.completion_usage import CompletionUsage
from pydantic import BaseModel, Field, ValidationError, field_validator

from research.models import ModelUsage

DEFAULT_LLM_BASE_URL = "https://api.openai.com/v1"
# The SDK refuses an empty key, and local servers (Ollama, vLLM, LM Studio) ignore whatever is sent.
NO_API_KEY_PLACEHOLDER = "not-needed"
CHARACTERS_PER_TOKEN = 4
MAX_SCHEMA_NAME_LENGTH = 64
MAX_ERROR_DETAIL_CHARACTERS = 300
MAX_REPAIR_ERRORS_SHOWN = 8

T = TypeVar("T", bound=BaseModel)
Message = dict[str, Any]
ResponseFormatMode = Literal["json_schema", "json_object", "prompt_only"]
AdaptableParameter = Literal["response_format", "temperature", "max_tokens", "reasoning_effort", "stream_options"]
ReasoningEffort = Literal["minimal", "low", "medium", "high"]
# What a model is asked when its answer stopped at the output limit: go on, without repeating itself.
CONTINUE_INSTRUCTION = ("Your answer was cut off at the output limit. Continue exactly where it stopped, mid-sentence "
                        "if need be: do not repeat anything, do not start over, add no preamble.")
MAX_CONTINUATIONS = 2
# A continuation that begins with this much of the text so far is the model starting over.
RESTART_PREFIX_CHARS = 80
# A structured answer cut off is asked again with this much room when the first ask set no limit.
STRUCTURED_RETRY_TOKENS = 8_000


class LLMError(Exception):
    """Any failure to get a usable answer from the LLM endpoint; the message is plain and carries no secrets."""

    def __init__(self, message: str, *, status: int | None = None) -> None:
        super().__init__(message)
        self.status = status


class LLMUnavailable(LLMError):
    """The endpoint could not be reached, timed out, or kept answering 429/5xx after the SDK's retries."""


class LLMAuthError(LLMError):
    """The endpoint refused the credentials (HTTP 401 or 403)."""


class StructuredOutputError(LLMError):
    """The model's answer was not valid JSON for the schema, even after one repair attempt."""

    def __init__(self, message: str, *, task: str, last_answer: str) -> None:
        super().__init__(message)
        self.task = task
        self.last_answer = last_answer


class LLMConfig(BaseModel):
    """Where the OpenAI-compatible endpoint is, which models to ask, how to price tokens, and how patiently to wait."""

    base_url: str = DEFAULT_LLM_BASE_URL
    api_key: str | None = Field(default=None, repr=False)
    model: str
    fast_model: str | None = None
    price_input_per_mtok: float = Field(default=0.0, ge=0)
    price_output_per_mtok: float = Field(default=0.0, ge=0)
    timeout_seconds: float = Field(default=60.0, gt=0)
    max_retries: int = Field(default=3, ge=0)
    max_output_tokens: int = Field(default=16_000, gt=0)
    reasoning_effort: ReasoningEffort | None = None

    @field_validator("base_url", mode="before")
    @classmethod
    def _url_as_text(cls, value: Any) -> Any:
        return value if isinstance(value, str) else str(value)

    @field_validator("api_key", "fast_model", mode="before")
    @classmethod
    def _blank_means_unset(cls, value: Any) -> Any:
        if hasattr(value, "get_secret_value"):
            value = value.get_secret_value()
        if isinstance(value, str) and not value.strip():
            return None
        return value.strip() if isinstance(value, str) else value

    def model_for(self, *, fast: bool) -> str:
        """The model name for a call: the fast model when asked for and configured, else the main model."""
        return (self.fast_model or self.model) if fast else self.model

    def cost(self, prompt_tokens: int, completion_tokens: int) -> float:
        """The price of a call in the configured currency (prices are per million tokens)."""
        return (prompt_tokens * self.price_input_per_mtok + completion_tokens * self.price_output_per_mtok) / 1_000_000


class UsageRecord(BaseModel):
    """Tokens, cost and wall time of one chat completion; `estimated` when the endpoint sent no usage."""

    task: str
    model: str
    prompt_tokens: int
    completion_tokens: int
    cost: float
    seconds: float
    estimated: bool = False


class UsageLedger(BaseModel):
    """Usage accumulated over a client's calls, per model."""

    by_model: dict[str, ModelUsage] = Field(default_factory=dict)

    def add(self, record: UsageRecord) -> None:
        """Count one call's usage under its model."""
        totals = self.by_model.setdefault(record.model, ModelUsage())
        totals.calls += 1
        totals.prompt_tokens += record.prompt_tokens
        totals.completion_tokens += record.completion_tokens
        totals.cost += record.cost
        totals.estimated_calls += int(record.estimated)

    @property
    def calls(self) -> int:
        return sum(totals.calls for totals in self.by_model.values())

    @property
    def prompt_tokens(self) -> int:
        return sum(totals.prompt_tokens for totals in self.by_model.values())

    @property
    def completion_tokens(self) -> int:
        return sum(totals.completion_tokens for totals in self.by_model.values())

    @property
    def total_tokens(self) -> int:
        return self.prompt_tokens + self.completion_tokens

    @property
    def cost(self) -> float:
        return sum(totals.cost for totals in self.by_model.values())


OnUsage = Callable[[UsageRecord], Awaitable[None]]
# Called with the whole visible answer so far (not a delta): a reader that sees it no longer extend what it showed
# knows the model started over (a reasoning prefix ended, or it was asked again).
OnText = Callable[[str], Awaitable[None]]


@dataclass(frozen=True)
class ChatAnswer:
    """One completion's raw content and why it stopped (`length`: cut off at the output limit)."""

    content: str
    finish_reason: str | None

    @property
    def cut_off(self) -> bool:
        return self.finish_reason in ("length", "max_tokens")


@dataclass(frozen=True)
class LongAnswer:
    """A free-text answer, reasoning removed, continued across output limits; `cut_off` if it still did not end."""

    text: str
    cut_off: bool
    continuations: int = 0

# ---------------------------------------------------------------------------------------------------------------
# Reasoning blocks, fences, schemas: pure helpers
# ---------------------------------------------------------------------------------------------------------------

_REASONING_BLOCK = re.compile(r"<(think|thinking)>.*?</\1>", re.DOTALL | re.IGNORECASE)
_ORPHAN_REASONING_END = re.compile(r"^.*</(?:think|thinking)>", re.DOTALL | re.IGNORECASE)
_UNCLOSED_REASONING = re.compile(r"<(?:think|thinking)>.*$", re.DOTALL | re.IGNORECASE)
_CODE_FENCE = re.compile(r"```[a-zA-Z0-9_-]*[ \t]*\n?(.*?)```", re.DOTALL)


def strip_reasoning(text: str) -> str:
    """Remove `<think>…</think>` blocks, a reasoning prefix whose `<think>` the chat template swallowed, and an unclosed `<think>` tail."""
    text = _REASONING_BLOCK.sub("", text)
    # Some templates (DeepSeek-R1, MiniMax) put `<think>` in the prompt, so only `</think>` reaches us.
    text = _ORPHAN_REASONING_END.sub("", text)
    # A `<think>` never closed means the answer was cut off mid-reasoning: none of it is for users.
    text = _UNCLOSED_REASONING.sub("", text)
    return text.strip()


_REASONING_TAGS = ("<think>", "</think>", "<thinking>", "</thinking>")
_OPENING_FENCE = re.compile(r"^```[a-zA-Z0-9_-]*[ \t]*\n")


def visible_streamed_text(raw: str) -> str:
    """What may be shown of an answer still arriving: reasoning removed as `strip_reasoning` does, a tag or fence
    still being written held back, an opening Markdown fence dropped (the finished answer is cleaned in full later)."""
    cut = raw.rfind("<")
    if cut != -1 and any(tag.startswith(raw[cut:].lower()) for tag in _REASONING_TAGS):
        raw = raw[:cut]  # maybe the start of a reasoning tag: wait for the rest
    text = strip_reasoning(raw)
    if text.startswith("```"):
        if "\n" not in text:
            return ""  # the fence's opening line is still being written
        text = _OPENING_FENCE.sub("", text, count=1)
    # Backticks at the end may be a closing fence on its way.
    return text.rstrip("`").rstrip()


def _continuation_text(raw: str) -> str:
    """A continuation's visible text, keeping the white space it starts with (it joins the text before it)."""
    visible = strip_reasoning(raw)
    start = raw.find(visible) if visible else -1
    return (raw[start - 1] + visible) if start > 0 and raw[start - 1].isspace() else visible


def extract_json_text(answer: str) -> str:
    """The JSON part of a model's answer: reasoning removed, a Markdown code fence or surrounding prose dropped."""
    text = strip_reasoning(answer)
    fenced = _CODE_FENCE.search(text)
    if fenced:
        return fenced.group(1).strip()
    start, end = text.find("{"), text.rfind("}")
    if start != -1 and end > start:
        return text[start : end + 1]
    return text


def schema_name(task: str) -> str:
    """`task` as a json_schema name: only `[a-zA-Z0-9_-]`, at most 64 characters, never empty."""
    name = re.sub(r"[^a-zA-Z0-9_-]+", "_", task).strip("_")[:MAX_SCHEMA_NAME_LENGTH]
    return name or "response"


# What OpenAI's strict Structured Outputs accept (platform.openai.com/docs/guides/structured-outputs,
# "Supported schemas"); anything else is sent with strict=false and validated on our side.
_STRICT_UNSUPPORTED_KEYWORDS = frozenset({
    "allOf", "oneOf", "not", "if", "then", "else", "patternProperties", "unevaluatedProperties", "propertyNames",
    "minProperties", "maxProperties", "dependentRequired", "dependentSchemas", "minLength", "maxLength",
    "uniqueItems", "contains", "prefixItems",
})
_STRICT_STRING_FORMATS = frozenset({"date-time", "time", "date", "duration", "email", "hostname", "ipv4", "ipv6", "uuid"})
_SCHEMA_MAPS = ("properties", "$defs", "definitions")
_SCHEMA_CHILDREN = ("items", "anyOf", "allOf", "oneOf", "prefixItems", "additionalProperties", "not")


def _resolve_reference(root: dict[str, Any], reference: str) -> dict[str, Any]:
    node: Any = root
    for key in reference.removeprefix("#/").split("/"):
        node = node[key]
    return dict(node)


def _tighten_for_strict(node: Any, root: dict[str, Any]) -> bool:
    """Rewrite `node` in place toward OpenAI's strict subset; False when some part cannot be made strict."""
    if isinstance(node, list):
        return all([_tighten_for_strict(item, root) for item in node])
    if not isinstance(node, dict):
        return True
    node.pop("default", None)
    if "$ref" in node and len(node) > 1:
        # Strict mode refuses `$ref` with sibling keywords (pydantic adds `description`), so inline the target.
        for key, value in _resolve_reference(root, node.pop("$ref")).items():
            node.setdefault(key, copy.deepcopy(value))
        node.pop("default", None)
    strict = not (_STRICT_UNSUPPORTED_KEYWORDS & node.keys())
    if "format" in node and node["format"] not in _STRICT_STRING_FORMATS:
        strict = False
    if node.get("type") == "object" or "properties" in node:
        if node.setdefault("additionalProperties", False) is not False:
            strict = False
        node["required"] = list(node.get("properties", {}))
    for key in _SCHEMA_MAPS:
        if isinstance(node.get(key), dict):
            strict = all([_tighten_for_strict(child, root) for child in node[key].values()]) and strict
    for key in _SCHEMA_CHILDREN:
        if key in node:
            strict = _tighten_for_strict(node[key], root) and strict
    return strict


def json_schema_response_format(schema: type[BaseModel], task: str) -> dict[str, Any]:
    """The `response_format` for `schema`: strict (every property required, no extras, no defaults) when OpenAI allows, else pydantic's schema non-strict."""
    original = schema.model_json_schema()
    tightened = copy.deepcopy(original)
    strict = _tighten_for_strict(tightened, tightened)
    return {
        "type": "json_schema",
        "json_schema": {"name": schema_name(task), "schema": tightened if strict else original, "strict": strict},
    }


def schema_instruction(schema: type[BaseModel], task: str) -> str:
    """The prompt text that asks for one JSON object matching `schema` (used where `response_format` cannot carry it)."""
    schema_json = json.dumps(schema.model_json_schema(), separators=(",", ":"), ensure_ascii=False)
    return (
        f"Reply with a single JSON object (schema name: {schema_name(task)}) that matches this JSON Schema, "
        f"and nothing else: no prose, no Markdown fence.\n{schema_json}"
    )


def _validation_summary(error: ValidationError) -> str:
    lines = []
    for problem in error.errors(include_url=False, include_input=False)[:MAX_REPAIR_ERRORS_SHOWN]:
        location = ".".join(str(part) for part in problem["loc"]) or "(the whole answer)"
        lines.append(f"- {location}: {problem['msg']}")
    if error.error_count() > MAX_REPAIR_ERRORS_SHOWN:
        lines.append(f"- … and {error.error_count() - MAX_REPAIR_ERRORS_SHOWN} more")
    return "\n".join(lines)


def parse_answer(answer: str, schema: type[T]) -> T:
    """Validate a model's answer against `schema` after removing reasoning and fences; raises pydantic's ValidationError."""
    return schema.model_validate_json(extract_json_text(answer))


def _repair_messages(
    messages: Sequence[Message], answer: str, error: ValidationError, schema: type[BaseModel], task: str,
) -> list[Message]:
    repair_request = (
        "Your previous reply could not be used:\n"
        f"{_validation_summary(error)}\n\n"
        f"{schema_instruction(schema, task)}"
    )
    return [*messages, {"role": "assistant", "content": answer}, {"role": "user", "content": repair_request}]


def _with_instruction(messages: Sequence[Message], instruction: str) -> list[Message]:
    """`messages` with `instruction` appended to the first system message (or a new one first): templates such as Mistral's allow only one, at the start."""
    result = [dict(message) for message in messages]
    for message in result:
        if message.get("role") == "system" and isinstance(message.get("content"), str):
            message["content"] = f"{message['content']}\n\n{instruction}"
            return result
    return [{"role": "system", "content": instruction}, *result]


def message_text(message: Message) -> str:
    """The text of a chat message whose content is a string or a list of parts."""
    content = message.get("content")
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "\n".join(str(part.get("text", "")) for part in content if isinstance(part, dict))
    return ""


def estimate_tokens(text: str) -> int:
    """A rough token count (four characters a token) for endpoints that report no usage."""
    return math.ceil(len(text) / CHARACTERS_PER_TOKEN)


# ---------------------------------------------------------------------------------------------------------------
# Errors from the SDK to ours
# ---------------------------------------------------------------------------------------------------------------

_SECRET_LOOKING = re.compile(r"\b(sk|pk|rk|key)-[A-Za-z0-9_\-*]{6,}")


def _redacted(text: str, secret: str | None) -> str:
    if secret:
        text = text.replace(secret, "[redacted]")
    return _SECRET_LOOKING.sub("[redacted]", text)


def _server_message(error: openai.APIStatusError) -> str:
    body = error.body
    if isinstance(body, dict) and isinstance(body.get("message"), str):
        return body["message"]
    if isinstance(body, str):
        return body
    return ""


def _rejected_parameter(error: openai.APIStatusError) -> AdaptableParameter | None:
    """Which request parameter a 400/422 says the endpoint does not support, if it is one we can do without."""
    if error.status_code not in (400, 422):
        return None
    parameter = (error.param or "").lower()
    text = f"{_server_message(error)} {error.message}".lower()
    if parameter.startswith("response_format") or "response_format" in text or "json_schema" in text:
        return "response_format"
    unsupported = "support" in text
    if parameter == "temperature" or (unsupported and "temperature" in text):
        return "temperature"
    if parameter == "max_tokens" or (unsupported and "max_tokens" in text and "max_completion_tokens" in text):
        return "max_tokens"
    if parameter in ("reasoning_effort", "reasoning") or "reasoning_effort" in text:
        return "reasoning_effort"
    if parameter.startswith("stream_options") or "stream_options" in text:
        return "stream_options"
    return None


def translate_error(error: openai.OpenAIError, config: LLMConfig, model: str) -> LLMError:
    """Our plain, secret-free error for an SDK error."""
    if isinstance(error, openai.APITimeoutError):
        return LLMUnavailable(f"the LLM endpoint did not answer within {config.timeout_seconds:g} s")
    if isinstance(error, openai.APIConnectionError):
        return LLMUnavailable("could not connect to the LLM endpoint")
    if isinstance(error, openai.AuthenticationError | openai.PermissionDeniedError):
        return LLMAuthError(
            f"the LLM endpoint refused the API key (HTTP {error.status_code}); check LLM_API_KEY", status=error.status_code,
        )
    if isinstance(error, openai.RateLimitError):
        return LLMUnavailable(
            f"the LLM endpoint is rate limiting (HTTP 429), still after {config.max_retries} retries", status=429,
        )
    if isinstance(error, openai.APIStatusError) and error.status_code >= 500:
        return LLMUnavailable(
            f"the LLM endpoint failed (HTTP {error.status_code}), still after {config.max_retries} retries",
            status=error.status_code,
        )
    if isinstance(error, openai.NotFoundError):
        return LLMError(f"the LLM endpoint answered HTTP 404: is the model name {model!r} right?", status=404)
    if isinstance(error, openai.APIStatusError):
        detail = _redacted(_server_message(error), config.api_key)[:MAX_ERROR_DETAIL_CHARACTERS]
        suffix = f": {detail}" if detail else ""
        return LLMError(f"the LLM endpoint rejected the request (HTTP {error.status_code}){suffix}", status=error.status_code)
    return LLMError("the LLM endpoint sent a response that could not be read")


class _ResponseFormatRejected(Exception):
    """The endpoint refused the response_format we sent."""


@dataclass
class EndpointQuirks:
    """What this endpoint has refused so far, learnt from its 400s and shared by every view of a client."""

    response_format_mode: ResponseFormatMode = "json_schema"
    send_temperature: bool = True
    send_reasoning_effort: bool = True
    send_stream_options: bool = True
    token_limit_parameter: Literal["max_tokens", "max_completion_tokens"] = "max_tokens"

    def adapt_to(self, rejected: AdaptableParameter) -> bool:
        """Stop sending what the endpoint refused; False when there is nothing left to change."""
        if rejected == "temperature" and self.send_temperature:
            self.send_temperature = False
            return True
        if rejected == "reasoning_effort" and self.send_reasoning_effort:
            self.send_reasoning_effort = False
            return True
        if rejected == "stream_options" and self.send_stream_options:
            self.send_stream_options = False
            return True
        if rejected == "max_tokens" and self.token_limit_parameter == "max_tokens":
            self.token_limit_parameter = "max_completion_tokens"
            return True
        return False

    def step_down_response_format(self) -> None:
        """Use the next, less demanding way of asking for JSON."""
        self.response_format_mode = "json_object" if self.response_format_mode == "json_schema" else "prompt_only"


# ---------------------------------------------------------------------------------------------------------------
# The client
# ---------------------------------------------------------------------------------------------------------------


class LLMClient:
    """Chat completions against one OpenAI-compatible endpoint: free text, validated JSON, usage recorded per call."""

    def __init__(
        self,
        config: LLMConfig,
        *,
        http_client: httpx.AsyncClient | None = None,
        on_usage: OnUsage | None = None,
    ) -> None:
        self.config = config
        self.ledger = UsageLedger()
        self.quirks = EndpointQuirks()
        self._on_usage = on_usage
        self._owns_http_client = http_client is None
        self._sdk = openai.AsyncOpenAI(
            api_key=config.api_key or NO_API_KEY_PLACEHOLDER,
            base_url=config.base_url,
            timeout=config.timeout_seconds,
            max_retries=config.max_retries,
            http_client=http_client,  # type: ignore[arg-type]  # the SDK accepts httpx as well as httpx2 clients
        )

    @property
    def response_format_mode(self) -> ResponseFormatMode:
        """How structured calls currently ask for JSON: `json_schema`, `json_object`, or `prompt_only`."""
        return self.quirks.response_format_mode

    def with_usage_callback(self, on_usage: OnUsage | None) -> "LLMClient":
        """A view of this client (same connection pool and learnt quirks, its own ledger) reporting usage to `on_usage`."""
        view = copy.copy(self)
        view.ledger = UsageLedger()
        view._on_usage = on_usage
        view._owns_http_client = False
        return view

    async def aclose(self) -> None:
        """Close the HTTP client if this client created it (a caller's client stays open; views never close)."""
        if self._owns_http_client:
            await self._sdk.close()

    async def __aenter__(self) -> "LLMClient":
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()

    async def complete(
        self,
        messages: Sequence[Message],
        *,
        task: str,
        fast: bool = False,
        max_tokens: int | None = None,
        temperature: float = 0.2,
    ) -> str:
        """The model's text answer with reasoning removed; raises LLMError (LLMUnavailable, LLMAuthError) on failure."""
        answer = await self._chat(
            messages, task=task, fast=fast, max_tokens=max_tokens, temperature=temperature, response_format=None,
        )
        return strip_reasoning(answer.content)

    async def complete_long(
        self,
        messages: Sequence[Message],
        *,
        task: str,
        fast: bool = False,
        max_tokens: int | None = None,
        temperature: float = 0.2,
        on_text: OnText | None = None,
    ) -> LongAnswer:
        """A free-text answer that may need the whole output budget (a report): one cut off while still thinking is
        asked again with twice the room, one cut off mid-text is continued (up to `MAX_CONTINUATIONS` times);
        `cut_off` says it still did not end. Given `on_text`, the answer is streamed and `on_text` gets the visible
        text so far as it grows (never a reasoning block). Raises LLMError as `complete`."""
        limit = max_tokens or self.config.max_output_tokens
        answer = await self._chat(messages, task=task, fast=fast, max_tokens=limit, temperature=temperature,
                                  response_format=None, on_text=on_text)
        if answer.cut_off and not strip_reasoning(answer.content):
            # It spent the whole budget thinking: thinking needs room, so ask once more with twice as much.
            answer = await self._chat(messages, task=task, fast=fast, max_tokens=limit * 2, temperature=temperature,
                                      response_format=None, on_text=on_text)
        text = strip_reasoning(answer.content)
        continuations = 0
        while answer.cut_off and text and continuations < MAX_CONTINUATIONS:
            continued = [*messages, {"role": "assistant", "content": text},
                         {"role": "user", "content": CONTINUE_INSTRUCTION}]
            answer = await self._chat(continued, task=f"{task}_continued", fast=fast, max_tokens=limit,
                                      temperature=temperature, response_format=None, on_text=on_text,
                                      shown_before=text)
            piece = _continuation_text(answer.content)
            continuations += 1
            if piece.strip() and text.lstrip().startswith(piece.strip()[:RESTART_PREFIX_CHARS]):
                break  # it started over instead of going on: keep the text once, still cut off
            text += piece
        return LongAnswer(text=text, cut_off=answer.cut_off, continuations=continuations)

    async def structured(
        self,
        messages: Sequence[Message],
        schema: type[T],
        *,
        task: str,
        fast: bool = False,
        max_tokens: int | None = None,
        temperature: float = 0.2,
    ) -> T:
        """The model's answer validated as `schema`, with one repair attempt; raises StructuredOutputError when still invalid, or LLMError.

        An answer cut off at the output limit is asked again with more room before it is judged."""
        answer = await self._structured_answer(messages, schema, task=task, fast=fast, max_tokens=max_tokens, temperature=temperature)
        try:
            return parse_answer(answer, schema)
        except ValidationError as error:
            repair = _repair_messages(messages, answer, error, schema, task)
        answer = await self._structured_answer(repair, schema, task=task, fast=fast, max_tokens=max_tokens, temperature=temperature)
        try:
            return parse_answer(answer, schema)
        except ValidationError as error:
            raise StructuredOutputError(
                f"{task}: the model's answer did not match the {schema.__name__} schema after one repair attempt "
                f"({error.error_count()} problem(s))",
                task=task,
                last_answer=answer,
            ) from None

    async def _structured_answer(
        self,
        messages: Sequence[Message],
        schema: type[BaseModel],
        *,
        task: str,
        fast: bool,
        max_tokens: int | None,
        temperature: float,
    ) -> str:
        """One answer in the best response-format mode the endpoint accepts, stepping down (and remembering) on rejection."""
        while True:
            mode = self.quirks.response_format_mode
            if mode == "json_schema":
                request_messages, response_format = list(messages), json_schema_response_format(schema, task)
            else:
                request_messages = _with_instruction(messages, schema_instruction(schema, task))
                response_format = {"type": "json_object"} if mode == "json_object" else None
            try:
                answer = await self._chat(
                    request_messages, task=task, fast=fast, max_tokens=max_tokens,
                    temperature=temperature, response_format=response_format,
                )
                if answer.cut_off:
                    roomier = max(STRUCTURED_RETRY_TOKENS, (max_tokens or 0) * 2)
                    answer = await self._chat(
                        request_messages, task=task, fast=fast, max_tokens=roomier,
                        temperature=temperature, response_format=response_format,
                    )
                return answer.content
            except _ResponseFormatRejected:
                if mode == "prompt_only":
                    raise LLMError("the LLM endpoint refused every way of asking for JSON") from None
                self.quirks.step_down_response_format()

    async def _chat(
        self,
        messages: Sequence[Message],
        *,
        task: str,
        fast: bool,
        max_tokens: int | None,
        temperature: float,
        response_format: dict[str, Any] | None,
        on_text: OnText | None = None,
        shown_before: str = "",
    ) -> ChatAnswer:
        """One chat completion's raw content and finish reason (streamed to `on_text` when given); adapts to
        parameters the endpoint refuses, records usage, translates errors."""
        model = self.config.model_for(fast=fast)
        started = time.monotonic()
        while True:
            arguments = self._arguments(messages, model, max_tokens, temperature, response_format)
            try:
                if on_text is not None:
                    answer, usage = await self._streamed(arguments, on_text, shown_before)
                    await self._record_usage(usage, messages, answer.content, task=task, model=model,
                                             seconds=time.monotonic() - started)
                    return answer
                completion = await self._sdk.chat.completions.create(**arguments)
                break
            except openai.APIStatusError as error:
                rejected = _rejected_parameter(error)
                if rejected == "response_format" and response_format is not None:
                    raise _ResponseFormatRejected from None
                if rejected is not None and self.quirks.adapt_to(rejected):
                    continue
                translated = translate_error(error, self.config, model)
                raise translated from (None if isinstance(translated, LLMAuthError) else error)
            except openai.OpenAIError as error:
                raise translate_error(error, self.config, model) from error
        answer = _completion_answer(completion)
        await self._record_usage(completion.usage, messages, answer.content, task=task, model=model,
                                 seconds=time.monotonic() - started)
        return answer

    async def _streamed(self, arguments: dict[str, Any], on_text: OnText,
                        shown_before: str) -> tuple[ChatAnswer, CompletionUsage | None]:
        """One completion streamed (server-sent events), `on_text` told each time the visible text (after
        `shown_before`, for a continuation) grows or changes; `reasoning_content` deltas are never read, as in
        `_completion_answer`."""
        streaming = {**arguments, "stream": True}
        if self.quirks.send_stream_options:
            streaming["stream_options"] = {"include_usage": True}
        raw, shown, finish_reason, usage = "", "", None, None
        stream = await self._sdk.chat.completions.create(**streaming)
        async with stream:
            async for chunk in stream:
                usage = chunk.usage or usage
                if not chunk.choices:
                    continue
                choice = chunk.choices[0]
                finish_reason = choice.finish_reason or finish_reason
                if not choice.delta.content:
                    continue
                raw += choice.delta.content
                visible = shown_before + _streamed_continuation(raw) if shown_before else visible_streamed_text(raw)
                if visible != shown:
                    shown = visible
                    await on_text(visible)
        return ChatAnswer(content=raw, finish_reason=finish_reason), usage

    def _arguments(
        self,
        messages: Sequence[Message],
        model: str,
        max_tokens: int | None,
        temperature: float,
        response_format: dict[str, Any] | None,
    ) -> dict[str, Any]:
        arguments: dict[str, Any] = {"model": model, "messages": list(messages)}
        if self.quirks.send_temperature:
            arguments["temperature"] = temperature
        if max_tokens is not None:
            arguments[self.quirks.token_limit_parameter] = max_tokens
        if response_format is not None:
            arguments["response_format"] = response_format
        if self.config.reasoning_effort and self.quirks.send_reasoning_effort:
            arguments["reasoning_effort"] = self.config.reasoning_effort
        return arguments

    async def _record_usage(
        self, usage: CompletionUsage | None, messages: Sequence[Message], answer: str, *, task: str, model: str,
        seconds: float,
    ) -> None:
        if usage is not None:
            prompt_tokens, completion_tokens, estimated = usage.prompt_tokens, usage.completion_tokens, False
        else:
            prompt_text = "\n".join(message_text(message) for message in messages)
            prompt_tokens, completion_tokens, estimated = estimate_tokens(prompt_text), estimate_tokens(answer), True
        record = UsageRecord(
            task=task, model=model, prompt_tokens=prompt_tokens, completion_tokens=completion_tokens,
            cost=self.config.cost(prompt_tokens, completion_tokens), seconds=seconds, estimated=estimated,
        )
        self.ledger.add(record)
        if self._on_usage is not None:
            await self._on_usage(record)


def _streamed_continuation(raw: str) -> str:
    """A continuation's visible text so far, keeping the white space it starts with (it joins the text before it)."""
    visible = visible_streamed_text(raw)
    return raw[:1] + visible if visible and raw[:1].isspace() and raw.lstrip().startswith(visible[:1]) else visible


def _completion_answer(completion: ChatCompletion) -> ChatAnswer:
    """The first choice's content and finish reason; `reasoning_content`/`reasoning` fields are deliberately never read."""
    if not completion.choices:
        raise LLMError("the LLM endpoint returned no answer (no choices)")
    choice = completion.choices[0]
    return ChatAnswer(content=choice.message.content or "", finish_reason=choice.finish_reason)
