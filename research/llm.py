"""LLM access over OpenAI's chat-completions protocol (`research.llm_wire`) against any OpenAI-compatible endpoint:
text, validated JSON, usage and cost.

Time. Every call is streamed where the endpoint streams (free text and structured calls alike). Its limits are a
connect timeout, a time to first token (`first_token_timeout_seconds`, long enough for a local server that reads
the prompt for minutes or a reasoning model that thinks before it writes) and an idle gap between chunks, never a
total for an answer that is still arriving; the run's own budget is the caller's. An endpoint that does not stream
gets one total limit (`timeout_seconds`). A call whose first-token, idle or total limit fired is never sent again
(`LLMTimeout`): the server may still be working on it, and a local server, which works on one request at a time,
would queue the copy behind the abandoned one.

Retries. Connection failures before the request reached the server, and 429 and 5xx answered before any output,
are retried `max_retries` times with exponential backoff (0.5 s doubling to 8 s, with jitter), honouring
`Retry-After` (up to two minutes) and `x-should-retry`, as OpenAI's SDK does.

Quirks. Endpoints differ; a 4xx or 5xx whose body names a parameter the endpoint does not support is learnt for the
endpoint and model, for the whole process (`learnt_quirks`), and worked around: `json_schema` → JSON mode
(`json_object`) → schema in the prompt only; `temperature`, `reasoning_effort`, `stream_options` → left out;
`max_tokens` ↔ `max_completion_tokens`; `stream` → whole answers. The model's context window is the setting when
given, else what the server says (llama.cpp's `/props`, vLLM's `max_model_len`, Ollama's `/api/show`), else what an
overflow error names; the answer's room is capped to fit it, and a prompt that cannot fit raises `ContextOverflow`
for the caller to send less.
"""

from __future__ import annotations

import asyncio
import copy
import email.utils
import ipaddress
import json
import math
import random
import re
import threading
import time
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal, TypeVar
from urllib.parse import urlsplit

import httpx
from pydantic import BaseModel, Field, ValidationError, field_validator

from research.errors import DeepthreadError
from research.llm_wire import (
    ChatEndpoint,
    EndpointConnectionError,
    EndpointError,
    EndpointStatusError,
    EndpointStreamError,
    EndpointTimeout,
    TokenUsage,
)
from research.markdown import read
from research.models import ModelUsage


DEFAULT_LLM_BASE_URL = "https://api.openai.com/v1"
# Sent when no key is set: local servers (Ollama, vLLM, LM Studio) ignore whatever is sent.
NO_API_KEY_PLACEHOLDER = "not-needed"
CHARACTERS_PER_TOKEN = 4
MAX_SCHEMA_NAME_LENGTH = 64
MAX_ERROR_DETAIL_CHARACTERS = 300
MAX_REPAIR_ERRORS_SHOWN = 8

T = TypeVar("T", bound=BaseModel)
Message = dict[str, Any]
ResponseFormatMode = Literal["json_schema", "json_object", "prompt_only"]
AdaptableParameter = Literal["response_format", "temperature", "max_tokens", "max_completion_tokens",
                             "reasoning_effort", "stream_options", "stream"]
ReasoningEffort = Literal["minimal", "low", "medium", "high"]
# What a model is asked when its answer stopped at the output limit: go on, without repeating itself.
CONTINUE_INSTRUCTION = ("Your answer was cut off at the output limit. Continue exactly where it stopped, mid-sentence "
                        "if need be: do not repeat anything, do not start over, add no preamble.")
MAX_CONTINUATIONS = 2
# A continuation that begins with this much of the text so far is the model starting over.
RESTART_PREFIX_CHARS = 80
# A structured answer cut off is asked again with this much room when the first ask set no limit.
STRUCTURED_RETRY_TOKENS = 8_000
# Defaults that suit a cloud API and a local server alike: a laptop may read a long prompt for minutes before the
# first token, and a reasoning model may think as long; once writing, even a slow server sends a chunk a second.
DEFAULT_TIMEOUT_SECONDS = 900.0
DEFAULT_CONNECT_TIMEOUT_SECONDS = 10.0
DEFAULT_FIRST_TOKEN_TIMEOUT_SECONDS = 600.0
DEFAULT_IDLE_TIMEOUT_SECONDS = 120.0
# Retries as OpenAI's SDK spaces them (openai/_constants.py).
INITIAL_RETRY_DELAY = 0.5
MAX_RETRY_DELAY = 8.0
MAX_RETRY_AFTER_SECONDS = 120.0
# Fitting prompts to a context window: a token is taken to be three characters (tokenizers differ, and under-counting
# costs a refused request), and some room is kept for the chat template's own tokens.
FITTING_CHARACTERS_PER_TOKEN = 3
TEMPLATE_TOKENS_PER_MESSAGE = 8
CONTEXT_MARGIN_TOKENS = 64
MIN_ANSWER_TOKENS = 256
# A long answer (a report) is given at most this fraction of a known window: 2,048 tokens of an 8,192 window.
ANSWER_SHARE_OF_WINDOW = 4
# A window learnt from an overflow error that named no size: this share of what was asked for.
UNNAMED_WINDOW_SHARE = 0.75
DISCOVERY_TIMEOUT_SECONDS = 5.0
# Ollama runs a model with this window unless told otherwise (num_ctx), whatever the model was trained for.
OLLAMA_DEFAULT_CONTEXT_TOKENS = 4_096
# Grammar-constrained JSON (llama.cpp's json_object) lets a weak model write white space without end: a structured
# answer that has written this much white space in a row is over, whatever comes after.
RUNAWAY_WHITESPACE = 64


class LLMError(DeepthreadError):
    """Any failure to get a usable answer from the LLM endpoint; the message is plain and carries no secrets."""

    def __init__(self, message: str, *, status: int | None = None) -> None:
        super().__init__(message)
        self.status = status

    @property
    def plain_reason(self) -> str:
        return f"The language model failed: {self}"


class LLMUnavailable(LLMError):
    """The endpoint could not be reached, timed out, or kept answering 429/5xx after the retries."""

    @property
    def plain_reason(self) -> str:
        return f"The language model could not be reached: {self}"


class LLMTimeout(LLMUnavailable):
    """The endpoint took the request but sent no first token in time, went quiet in the middle of its answer, or (not
    streaming) did not finish in time. The server may still be working on it, so it was not sent again; `limit` names
    the setting that fired (`LLM_FIRST_TOKEN_TIMEOUT`, `LLM_IDLE_TIMEOUT`, `LLM_TIMEOUT`)."""

    def __init__(self, message: str, *, limit: str) -> None:
        super().__init__(message)
        self.limit = limit

    @property
    def plain_reason(self) -> str:
        return f"The language model was too slow: {self}."


class ContextOverflow(LLMError):
    """The prompt, with room kept for the answer, does not fit the model's context window: send less and ask again.
    `context_tokens` is the window as now known (learnt from the server's error when it named it)."""

    def __init__(self, message: str, *, context_tokens: int | None, status: int | None = None) -> None:
        super().__init__(message, status=status)
        self.context_tokens = context_tokens

    @property
    def plain_reason(self) -> str:
        return f"The request is too long for the language model: {self} (LLM_CONTEXT_TOKENS)."


class LLMAuthError(LLMError):
    """The endpoint refused the credentials (HTTP 401 or 403)."""

    @property
    def plain_reason(self) -> str:
        return "The language model refused our credentials (check LLM_API_KEY)."


class StructuredOutputError(LLMError):
    """The model's answer was not valid JSON for the schema, even after one repair attempt."""

    def __init__(self, message: str, *, task: str, last_answer: str) -> None:
        super().__init__(message)
        self.task = task
        self.last_answer = last_answer

    @property
    def plain_reason(self) -> str:
        return f"The language model did not return a valid answer: {self}"


class LLMConfig(BaseModel):
    """Where the OpenAI-compatible endpoint is, which models to ask, how to price tokens, and how patiently to wait."""

    base_url: str = DEFAULT_LLM_BASE_URL
    api_key: str | None = Field(default=None, repr=False)
    model: str
    fast_model: str | None = None
    price_input_per_mtok: float = Field(default=0.0, ge=0)
    price_output_per_mtok: float = Field(default=0.0, ge=0)
    # The whole of a call to an endpoint that does not stream (LLM_TIMEOUT).
    timeout_seconds: float = Field(default=DEFAULT_TIMEOUT_SECONDS, gt=0)
    connect_timeout_seconds: float = Field(default=DEFAULT_CONNECT_TIMEOUT_SECONDS, gt=0)
    # From sending a streamed request to its first token, answer or reasoning (LLM_FIRST_TOKEN_TIMEOUT).
    first_token_timeout_seconds: float = Field(default=DEFAULT_FIRST_TOKEN_TIMEOUT_SECONDS, gt=0)
    # The longest gap between two chunks once the answer has begun (LLM_IDLE_TIMEOUT).
    idle_timeout_seconds: float = Field(default=DEFAULT_IDLE_TIMEOUT_SECONDS, gt=0)
    max_retries: int = Field(default=3, ge=0)
    max_output_tokens: int = Field(default=16_000, gt=0)
    reasoning_effort: ReasoningEffort | None = None
    # The model's whole context window in tokens (LLM_CONTEXT_TOKENS); None: asked of the server, else learnt.
    context_tokens: int | None = Field(default=None, gt=0)
    # Whether the endpoint answers two calls at once (LLM_PARALLEL_REQUESTS); None: judged by its host.
    parallel_requests: bool | None = None

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

    def serves_in_parallel(self) -> bool:
        """Whether two calls may be in flight at once without one waiting for the other: as set, else unless the
        endpoint's host is this machine or a private network, where a local server works on one request at a time."""
        if self.parallel_requests is not None:
            return self.parallel_requests
        host = (urlsplit(self.base_url).hostname or "").lower()
        if host == "localhost" or host.endswith(".local"):
            return False
        try:
            address = ipaddress.ip_address(host)
        except ValueError:
            return True  # a name: a cloud API (a local server is reached by its address or as localhost)
        return not (address.is_loopback or address.is_private or address.is_link_local)

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


def strip_reasoning(text: str) -> str:
    """Remove `<think>…</think>` blocks, a reasoning prefix whose `<think>` the chat template swallowed, and an unclosed `<think>` tail."""
    text = _REASONING_BLOCK.sub("", text)
    # Some templates (DeepSeek-R1, MiniMax) put `<think>` in the prompt, so only `</think>` reaches us.
    text = _ORPHAN_REASONING_END.sub("", text)
    # A `<think>` never closed means the answer was cut off mid-reasoning: none of it is for users.
    text = _UNCLOSED_REASONING.sub("", text)
    return text.strip()


_REASONING_TAGS = ("<think>", "</think>", "<thinking>", "</thinking>")


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
        opening, _, rest = text.partition("\n")
        if [token.type for token in read(opening).tokens[:1]] == ["fence"]:
            text = rest
    # Backticks at the end may be a closing fence on its way.
    return text.rstrip("`").rstrip()


def _continuation_text(raw: str) -> str:
    """A continuation's visible text, keeping the white space it starts with (it joins the text before it)."""
    visible = strip_reasoning(raw)
    start = raw.find(visible) if visible else -1
    return (raw[start - 1] + visible) if start > 0 and raw[start - 1].isspace() else visible


# A fence as a model writes one, not as CommonMark reads it: "```json" after text on its line, the closing "```"
# glued to the JSON or followed by more text on its line.
_LOOSE_FENCE = re.compile(r"```[a-zA-Z0-9_-]*[ \t]*\n?(.*?)```", re.DOTALL)


def extract_json_text(answer: str) -> str:
    """The JSON part of a model's answer: reasoning removed, a Markdown code fence or surrounding prose dropped.

    The first of these that is JSON: the first fenced block as CommonMark reads it, the text between the first two
    "```" wherever they are written, the text from the first `{` to the last `}`. When none is, the first fenced
    block, else that braced text, else the whole text (and validating it says what is wrong)."""
    text = strip_reasoning(answer)
    fenced = next((token.content.strip() for token in read(text).tokens if token.type == "fence"), None)
    loose = _LOOSE_FENCE.search(text)
    start, end = text.find("{"), text.rfind("}")
    braced = text[start : end + 1] if start != -1 and end > start else None
    candidates = [fenced, loose.group(1).strip() if loose else None, braced]
    found = next((candidate for candidate in candidates if candidate is not None and _is_json(candidate)), None)
    if found is not None:
        return found
    return next((candidate for candidate in (fenced, braced) if candidate is not None), text)


def _is_json(text: str) -> bool:
    try:
        json.loads(text)
    except (ValueError, RecursionError):
        return False
    return True


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


def estimate_prompt_tokens(messages: Sequence[Message]) -> int:
    """A cautious token count of a prompt, for fitting it to a context window (over-counting is the safe side)."""
    characters = sum(len(message_text(message)) for message in messages)
    return math.ceil(characters / FITTING_CHARACTERS_PER_TOKEN) + TEMPLATE_TOKENS_PER_MESSAGE * len(messages)


# ---------------------------------------------------------------------------------------------------------------
# Errors from the endpoint to ours
# ---------------------------------------------------------------------------------------------------------------

_SECRET_LOOKING = re.compile(r"\b(sk|pk|rk|key)-[A-Za-z0-9_\-*]{6,}")


def _redacted(text: str, secret: str | None) -> str:
    if secret:
        text = text.replace(secret, "[redacted]")
    return _SECRET_LOOKING.sub("[redacted]", text)


def _server_message(error: EndpointStatusError) -> str:
    body = error.body
    if isinstance(body, dict) and isinstance(body.get("message"), str):
        return body["message"]
    if isinstance(body, str):
        return body
    return ""


def _error_text(error: EndpointStatusError) -> str:
    """Everything the server said, lower case: its message, the SDK's, and the rest of the error body."""
    body = error.body if isinstance(error.body, dict) else {}
    extra = json.dumps({key: value for key, value in body.items() if key != "message"}, default=str)
    return f"{_server_message(error)} {error.message} {extra}".lower()


# Words with which servers say a parameter is not theirs to take: OpenAI ("unsupported parameter", "unrecognized
# request argument"), vLLM and pydantic-based servers ("extra inputs are not permitted", "input should be"),
# llama-cpp-python's 500 ("validation error … literal_error").
_REFUSAL_WORDS = ("support", "unrecognized", "unknown", "not permitted", "not allowed", "invalid", "unexpected",
                  "validation error", "input should be", "extra_forbidden", "literal_error")


def _rejected_parameter(error: EndpointStatusError) -> AdaptableParameter | None:
    """Which request parameter a 4xx or 5xx says the endpoint does not support, if it is one we can do without."""
    if error.status_code < 400 or error.status_code in (401, 403, 404, 429):
        return None
    parameter = (error.param or "").lower()
    text = _error_text(error)
    refusal = error.status_code in (400, 422) or any(word in text for word in _REFUSAL_WORDS)
    if not refusal:
        return None
    if parameter.startswith("response_format") or "response_format" in text or "json_schema" in text:
        return "response_format"
    unsupported = any(word in text for word in _REFUSAL_WORDS)
    if parameter == "temperature" or (unsupported and "temperature" in text):
        return "temperature"
    if parameter == "max_completion_tokens" or (unsupported and "max_completion_tokens" in text
                                                 and "use 'max_completion_tokens'" not in text):
        return "max_completion_tokens"
    if parameter == "max_tokens" or (unsupported and "max_tokens" in text and "max_completion_tokens" in text):
        return "max_tokens"
    if parameter in ("reasoning_effort", "reasoning") or "reasoning_effort" in text:
        return "reasoning_effort"
    if parameter.startswith("stream_options") or "stream_options" in text:
        return "stream_options"
    if parameter == "stream" or (unsupported and re.search(r"\bstream(ing)?\b", text)):
        return "stream"
    return None


_OVERFLOW_WORDS = ("context length", "context window", "context size", "context_length", "exceed_context",
                   "prompt is too long", "input is too long", "too many tokens", "reduce the length")
_WINDOW_SIZES = (
    re.compile(r"maximum context length is (\d+)"),         # OpenAI, vLLM, llama-cpp-python
    re.compile(r'"n_ctx":\s*(\d+)'),                         # llama.cpp's exceed_context_size_error
    re.compile(r"context window of (\d+)"),                  # llama-cpp-python's "exceed context window of N"
    re.compile(r"context (?:size|length|window) (?:is |of )?\(?(\d+)"),
)


def context_overflow_window(error: EndpointStatusError) -> int | None | Literal[False]:
    """For an error that says the prompt did not fit: the window it names, or None when it names none; False when
    the error is about something else."""
    if error.status_code not in (400, 413, 422, 500):
        return False
    text = _error_text(error)
    if not any(word in text for word in _OVERFLOW_WORDS):
        return False
    for pattern in _WINDOW_SIZES:
        found = pattern.search(text)
        if found and int(found.group(1)) > 0:
            return int(found.group(1))
    return None


def translate_error(error: EndpointError, config: LLMConfig, model: str) -> LLMError:
    """Our plain, secret-free error for an endpoint's error."""
    if isinstance(error, EndpointTimeout):
        return LLMUnavailable(f"the LLM endpoint could not be connected to within {config.connect_timeout_seconds:g} s")
    if isinstance(error, EndpointConnectionError):
        return LLMUnavailable("could not connect to the LLM endpoint")
    if isinstance(error, EndpointStatusError) and error.status_code in (401, 403):
        return LLMAuthError(
            f"the LLM endpoint refused the API key (HTTP {error.status_code}); check LLM_API_KEY", status=error.status_code,
        )
    if isinstance(error, EndpointStatusError) and error.status_code == 429:
        return LLMUnavailable(
            f"the LLM endpoint is rate limiting (HTTP 429), still after {config.max_retries} retries", status=429,
        )
    if isinstance(error, EndpointStatusError) and error.status_code >= 500:
        return LLMUnavailable(
            f"the LLM endpoint failed (HTTP {error.status_code}), still after {config.max_retries} retries",
            status=error.status_code,
        )
    if isinstance(error, EndpointStatusError) and error.status_code == 404:
        return LLMError(f"the LLM endpoint answered HTTP 404: is the model name {model!r} right?", status=404)
    if isinstance(error, EndpointStatusError):
        detail = _redacted(_server_message(error), config.api_key)[:MAX_ERROR_DETAIL_CHARACTERS]
        suffix = f": {detail}" if detail else ""
        return LLMError(f"the LLM endpoint rejected the request (HTTP {error.status_code}){suffix}", status=error.status_code)
    return LLMError("the LLM endpoint sent a response that could not be read")


def _retry_after(headers: httpx.Headers | Mapping[str, str]) -> float | None:
    """Seconds a `retry-after-ms` or `Retry-After` header asks to wait (a number, or an HTTP date); None if absent."""
    milliseconds = headers.get("retry-after-ms")
    if milliseconds:
        try:
            return float(milliseconds) / 1000
        except ValueError:
            pass
    value = headers.get("retry-after")
    if not value:
        return None
    try:
        return float(value)
    except ValueError:
        try:
            when = email.utils.parsedate_to_datetime(value)
        except (TypeError, ValueError):
            return None
        return when.timestamp() - time.time()


def retry_delay(error: EndpointError, attempt: int) -> float | None:
    """How long to wait before sending a failed request again, or None when it must not be sent again: only a
    request that never reached the server, a 408/409/429 or a 5xx (an answer, so the server is done with it)."""
    backoff = min(INITIAL_RETRY_DELAY * 2.0 ** attempt, MAX_RETRY_DELAY) * (1 - 0.25 * random.random())
    if isinstance(error, EndpointTimeout):
        # A connection or a pool slot not had in time: never sent. A read timeout: the server may be working on it.
        return backoff if _never_sent(error) else None
    if isinstance(error, EndpointConnectionError):
        return backoff
    if not isinstance(error, EndpointStatusError):
        return None
    should_retry = error.response.headers.get("x-should-retry")
    if should_retry == "false":
        return None
    if should_retry != "true" and error.status_code not in (408, 409, 429) and error.status_code < 500:
        return None
    asked = _retry_after(error.response.headers)
    if asked is not None and asked > MAX_RETRY_AFTER_SECONDS:
        return None
    return asked if asked is not None and asked > 0 else backoff


def _never_sent(error: EndpointTimeout) -> bool:
    """Whether the time limit that fired was for a connection or a pool slot: the request never reached the server."""
    return isinstance(error.__cause__, httpx.ConnectTimeout | httpx.PoolTimeout)


class _ResponseFormatRejected(Exception):
    """The endpoint refused the response_format we sent."""


class _NotStreamed(Exception):
    """The endpoint answered a streamed request with no server-sent events: it does not stream."""


# ---------------------------------------------------------------------------------------------------------------
# What each endpoint and model has taught us, for the whole process
# ---------------------------------------------------------------------------------------------------------------


@dataclass
class EndpointQuirks:
    """What one endpoint and model has refused or said so far, learnt from its errors and shared by every client of
    the process (every run after the first asks the way that works)."""

    response_format_mode: ResponseFormatMode = "json_schema"
    send_temperature: bool = True
    send_reasoning_effort: bool = True
    send_stream_options: bool = True
    token_limit_parameter: Literal["max_tokens", "max_completion_tokens"] = "max_tokens"
    streams: bool = True
    # The context window in tokens, as the server told it (its props, its model listing, or an overflow error).
    context_tokens: int | None = None
    context_looked_up: bool = False
    # False once a report came back without any inline citation and the model cited through JSON claims instead.
    cites_inline: bool = True

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
        if rejected == "stream" and self.streams:
            self.streams = False
            return True
        if rejected == "max_tokens" and self.token_limit_parameter == "max_tokens":
            self.token_limit_parameter = "max_completion_tokens"
            return True
        if rejected == "max_completion_tokens" and self.token_limit_parameter == "max_completion_tokens":
            self.token_limit_parameter = "max_tokens"
            return True
        return False

    def step_down_response_format(self) -> None:
        """Use the next, less demanding way of asking for JSON."""
        self.response_format_mode = "json_object" if self.response_format_mode == "json_schema" else "prompt_only"

    def learn_window(self, named: int | None, asked_tokens: int) -> int:
        """The window after an overflow: the one the server named, else a share of what was asked (never larger)."""
        learnt = named if named is not None else max(MIN_ANSWER_TOKENS * 4, int(asked_tokens * UNNAMED_WINDOW_SHARE))
        self.context_tokens = min(learnt, self.context_tokens) if self.context_tokens else learnt
        return self.context_tokens


_LEARNT: dict[tuple[str, str], EndpointQuirks] = {}
_LEARNT_LOCK = threading.Lock()


def learnt_quirks(base_url: str, model: str) -> EndpointQuirks:
    """The quirks learnt so far for `model` at `base_url` in this process (new ones start from the most capable)."""
    with _LEARNT_LOCK:
        return _LEARNT.setdefault((base_url.rstrip("/"), model), EndpointQuirks())


def forget_learnt_quirks() -> None:
    """Forget every endpoint's quirks (tests start each case from a new process's knowledge)."""
    with _LEARNT_LOCK:
        _LEARNT.clear()


def _answer_share(window: int) -> int:
    """The room a long answer is given in a window of `window` tokens."""
    return max(MIN_ANSWER_TOKENS, window // ANSWER_SHARE_OF_WINDOW)


def _positive_int(value: Any) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) and value > 0 else None


def _window_in_props(data: Any) -> int | None:
    """llama.cpp's `GET /props`: `default_generation_settings.n_ctx` (older builds: a top-level `n_ctx`)."""
    if not isinstance(data, dict):
        return None
    settings = data.get("default_generation_settings")
    return _positive_int(settings.get("n_ctx") if isinstance(settings, dict) else None) or _positive_int(data.get("n_ctx"))


def _window_in_models(data: Any, model: str) -> int | None:
    """A `/v1/models` listing's entry for `model`: vLLM's `max_model_len`, or a `context_length` some servers add."""
    entries = data.get("data") if isinstance(data, dict) else None
    for entry in entries if isinstance(entries, list) else []:
        if isinstance(entry, dict) and entry.get("id") == model:
            for key in ("max_model_len", "context_length", "context_window", "max_context_length"):
                if found := _positive_int(entry.get(key)):
                    return found
    return None


def _window_in_ollama_show(data: Any) -> int | None:
    """Ollama's `POST /api/show`: the `num_ctx` it runs the model with, else its default window, never more than the
    model was trained for."""
    if not isinstance(data, dict):
        return None
    parameters = data.get("parameters")
    configured = re.search(r"^\s*num_ctx\s+(\d+)", parameters, re.MULTILINE) if isinstance(parameters, str) else None
    info = data.get("model_info")
    trained = next((_positive_int(value) for key, value in info.items() if key.endswith(".context_length")),
                   None) if isinstance(info, dict) else None
    if configured:
        return int(configured.group(1))
    if trained is None:
        return None
    return min(trained, OLLAMA_DEFAULT_CONTEXT_TOKENS)


async def discover_context_tokens(http: httpx.AsyncClient, base_url: str, model: str, api_key: str | None) -> int | None:
    """The context window the server at `base_url` says `model` has, or None when it says nothing we can read. The
    three ways servers say it are asked at once (one round trip), and read in this order of trust."""
    base = base_url.rstrip("/")
    root = base.removesuffix("/v1")
    headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
    asks: list[tuple[str, str, dict[str, Any] | None, Callable[[Any], int | None]]] = [
        ("GET", f"{root}/props", None, _window_in_props),
        ("GET", f"{base}/models", None, lambda data: _window_in_models(data, model)),
        ("POST", f"{root}/api/show", {"model": model}, _window_in_ollama_show),
    ]

    async def ask(method: str, url: str, body: dict[str, Any] | None, read: Callable[[Any], int | None]) -> int | None:
        try:
            response = await http.request(method, url, json=body, headers=headers, timeout=DISCOVERY_TIMEOUT_SECONDS)
            return read(response.json()) if response.status_code == 200 else None
        except (httpx.HTTPError, ValueError):
            return None  # a server that does not know the path, or says it in a way we cannot read

    found = await asyncio.gather(*(ask(*parts) for parts in asks))
    return next((window for window in found if window), None)


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
        sleep: Callable[[float], Awaitable[None]] = asyncio.sleep,
    ) -> None:
        self.config = config
        self.ledger = UsageLedger()
        self._on_usage = on_usage
        self._sleep = sleep
        # Shared with every view of this client (`with_usage_callback`): one connection pool for all.
        self._endpoint = ChatEndpoint(config.base_url, config.api_key or NO_API_KEY_PLACEHOLDER,
                                      http_client=http_client)
        self._closes_endpoint = True

    @property
    def quirks(self) -> EndpointQuirks:
        """What the main model's endpoint has taught this process."""
        return self.quirks_for(self.config.model)

    def quirks_for(self, model: str) -> EndpointQuirks:
        return learnt_quirks(self.config.base_url, model)

    @property
    def response_format_mode(self) -> ResponseFormatMode:
        """How structured calls currently ask for JSON: `json_schema`, `json_object`, or `prompt_only`."""
        return self.quirks.response_format_mode

    def with_usage_callback(self, on_usage: OnUsage | None) -> "LLMClient":
        """A view of this client (same connection pool and learnt quirks, its own ledger) reporting usage to `on_usage`."""
        view = copy.copy(self)
        view.ledger = UsageLedger()
        view._on_usage = on_usage
        view._closes_endpoint = False
        return view

    async def aclose(self) -> None:
        """Close the HTTP client if this client created it (a caller's client stays open; views never close)."""
        if self._closes_endpoint:
            await self._endpoint.aclose()

    async def __aenter__(self) -> "LLMClient":
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()

    # -- the context window -------------------------------------------------------------------------------------

    def known_context_tokens(self, *, fast: bool = False) -> int | None:
        """The model's context window as configured or learnt so far (None: not known, so prompts are not cut)."""
        return self._window(self.config.model_for(fast=fast))

    def _window(self, model: str) -> int | None:
        return self.config.context_tokens or self.quirks_for(model).context_tokens

    async def context_tokens(self, *, fast: bool = False) -> int | None:
        """The model's context window: the setting, else what the server says (asked once per process), else learnt."""
        if self.config.context_tokens:
            return self.config.context_tokens
        model = self.config.model_for(fast=fast)
        quirks = self.quirks_for(model)
        if not quirks.context_looked_up:
            quirks.context_looked_up = True
            found = await discover_context_tokens(self._endpoint.http, self.config.base_url, model, self.config.api_key)
            quirks.context_tokens = min(found, quirks.context_tokens or found) if found else quirks.context_tokens
        return quirks.context_tokens

    def prompt_room(self, answer_tokens: int, *, fast: bool = False) -> int | None:
        """Tokens a prompt may take so that `answer_tokens` still fit the window (None: no known window)."""
        window = self.known_context_tokens(fast=fast)
        return None if window is None else max(0, window - answer_tokens - CONTEXT_MARGIN_TOKENS)

    def answer_room(self, max_tokens: int | None, *, fast: bool = False) -> int | None:
        """`max_tokens`, made to leave the prompt three quarters of the known window (the passages are what answers)."""
        window = self.known_context_tokens(fast=fast)
        if window is None:
            return max_tokens
        share = _answer_share(window)
        return min(max_tokens or share, share)

    def _fitted_max_tokens(self, messages: Sequence[Message], model: str, max_tokens: int | None) -> int | None:
        """The answer's room within the known window; raises ContextOverflow when the prompt leaves too little."""
        window = self._window(model)
        if window is None:
            return max_tokens
        prompt = estimate_prompt_tokens(messages)
        room = window - prompt - CONTEXT_MARGIN_TOKENS
        if room < MIN_ANSWER_TOKENS:
            raise ContextOverflow(
                f"the prompt (about {prompt:,} tokens) leaves no room for an answer in the model's {window:,}-token "
                "context window", context_tokens=window)
        return min(max_tokens, room) if max_tokens else room

    def _fits_with_room(self, messages: Sequence[Message], model: str, max_tokens: int | None,
                        sent: int | None) -> bool:
        """Whether, in the window now known, the prompt still leaves the answer the room it deserves (its share of
        the window, or all it asked for) and less than was sent: then it is worth asking again as it is."""
        deserved = _answer_share(self._window(model) or 0)
        try:
            fitted = self._fitted_max_tokens(messages, model, max_tokens)
        except ContextOverflow:
            return False
        return fitted != sent and (fitted or 0) >= min(max_tokens or deserved, deserved)

    # -- calls ----------------------------------------------------------------------------------------------

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
            try:
                answer = await self._chat(continued, task=f"{task}_continued", fast=fast, max_tokens=limit,
                                          temperature=temperature, response_format=None, on_text=on_text,
                                          shown_before=text)
            except ContextOverflow:
                break  # the window has no room left to go on: what was written stands, cut off
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
        quirks = self.quirks_for(self.config.model_for(fast=fast))
        while True:
            mode = quirks.response_format_mode
            response_format: dict[str, Any] | None
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
                quirks.step_down_response_format()

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
        """One chat completion's raw content and finish reason, streamed where the endpoint streams (`on_text` told
        the visible text as it grows); adapts to what the endpoint refuses, retries what never reached it or was
        answered with 429/5xx, records usage, translates errors."""
        model = self.config.model_for(fast=fast)
        quirks = self.quirks_for(model)
        started = time.monotonic()
        attempt = 0
        while True:
            limit = self._fitted_max_tokens(messages, model, max_tokens)
            arguments = self._arguments(quirks, messages, model, limit, temperature, response_format)
            try:
                if quirks.streams:
                    answer, usage = await self._streamed(quirks, arguments, on_text, shown_before,
                                                         structured=response_format is not None)
                else:
                    answer, usage = await self._whole(arguments)
                break
            except _NotStreamed:
                quirks.streams = False
                continue
            except EndpointStatusError as error:
                rejected = _rejected_parameter(error)
                if rejected == "response_format" and response_format is not None:
                    raise _ResponseFormatRejected from None
                if rejected is not None and quirks.adapt_to(rejected):
                    continue
                window = context_overflow_window(error)
                if window is not False:
                    learnt = quirks.learn_window(window or None, estimate_prompt_tokens(messages) + (limit or 0))
                    if self.config.context_tokens is None and self._fits_with_room(messages, model, max_tokens, limit):
                        continue  # the prompt fits the window now known once the answer's room is cut to match
                    raise ContextOverflow(
                        f"the prompt does not fit the model's context window ({learnt:,} tokens)",
                        context_tokens=learnt, status=error.status_code) from None
                delay = retry_delay(error, attempt) if attempt < self.config.max_retries else None
                if delay is not None:
                    attempt += 1
                    await self._sleep(delay)
                    continue
                translated = translate_error(error, self.config, model)
                raise translated from (None if isinstance(translated, LLMAuthError) else error)
            except EndpointError as error:
                delay = retry_delay(error, attempt) if attempt < self.config.max_retries else None
                if delay is not None:
                    attempt += 1
                    await self._sleep(delay)
                    continue
                if isinstance(error, EndpointTimeout) and not _never_sent(error):
                    raise self._timeout("total") from None
                raise translate_error(error, self.config, model) from error
        await self._record_usage(usage, messages, answer.content, task=task, model=model,
                                 seconds=time.monotonic() - started)
        return answer

    def _timeout(self, limit: Literal["first_token", "idle", "total"]) -> LLMTimeout:
        """The error for a limit that fired on a request the server took (and may still be working on)."""
        config = self.config
        if limit == "first_token":
            return LLMTimeout(
                f"the model sent nothing for {config.first_token_timeout_seconds:g} s (LLM_FIRST_TOKEN_TIMEOUT); it was "
                "not asked again, since it may still be working on the request", limit="LLM_FIRST_TOKEN_TIMEOUT")
        if limit == "idle":
            return LLMTimeout(
                f"the model stopped sending for {config.idle_timeout_seconds:g} s in the middle of its answer "
                "(LLM_IDLE_TIMEOUT)", limit="LLM_IDLE_TIMEOUT")
        return LLMTimeout(
            f"the model did not answer within {config.timeout_seconds:g} s (LLM_TIMEOUT, for endpoints that do not "
            "stream); it was not asked again, since it may still be working on the request", limit="LLM_TIMEOUT")

    async def _whole(self, arguments: dict[str, Any]) -> tuple[ChatAnswer, TokenUsage | None]:
        """One completion asked for whole, within the total limit."""
        timeout = httpx.Timeout(self.config.timeout_seconds, connect=self.config.connect_timeout_seconds)
        try:
            async with asyncio.timeout(self.config.timeout_seconds + self.config.connect_timeout_seconds):
                completion, usage = await self._endpoint.complete(arguments, timeout=timeout)
        except TimeoutError:
            raise self._timeout("total") from None
        return _completion_answer(completion), usage

    async def _streamed(self, quirks: EndpointQuirks, arguments: dict[str, Any], on_text: OnText | None,
                        shown_before: str, *, structured: bool = False) -> tuple[ChatAnswer, TokenUsage | None]:
        """One completion streamed (server-sent events) within the first-token and idle limits; `on_text` told each
        time the visible text (after `shown_before`, for a continuation) grows or changes; `reasoning_content` deltas
        count as the model working but are never read, as in `_completion_answer`."""
        if quirks.send_stream_options:
            arguments = {**arguments, "stream_options": {"include_usage": True}}
        timeout = httpx.Timeout(None, connect=self.config.connect_timeout_seconds)
        raw, shown, finish_reason, usage = "", "", None, None
        chunks, writing, event_stream = 0, False, True
        loop = asyncio.get_running_loop()
        try:
            async with asyncio.timeout(self.config.first_token_timeout_seconds) as limit, \
                    self._endpoint.stream(arguments, timeout=timeout) as events:
                event_stream = events.is_event_stream
                async for chunk in events.chunks():
                    chunks += 1
                    usage = TokenUsage.read(chunk.get("usage")) or usage
                    choices = chunk.get("choices")
                    choice = choices[0] if isinstance(choices, list) and choices and isinstance(choices[0], dict) \
                        else None
                    if choice is not None:
                        finish_reason = choice.get("finish_reason") or finish_reason
                        delta = choice.get("delta")
                        delta = delta if isinstance(delta, dict) else {}
                        content = delta.get("content") if isinstance(delta.get("content"), str) else ""
                        writing = writing or bool(content or delta.get("reasoning_content") or delta.get("reasoning"))
                        if content:
                            raw += content
                            visible = shown_before + _streamed_continuation(raw) if shown_before else visible_streamed_text(raw)
                            if on_text is not None and visible != shown:
                                shown = visible
                                await on_text(visible)
                            if structured and len(raw) > RUNAWAY_WHITESPACE and not raw[-RUNAWAY_WHITESPACE:].strip():
                                finish_reason = finish_reason or "stop"
                                break  # JSON mode writing white space without end: what came before is the answer
                    if writing:
                        limit.reschedule(loop.time() + self.config.idle_timeout_seconds)
        except TimeoutError:
            if finish_reason is None:
                raise self._timeout("idle" if writing else "first_token") from None
            # The answer was whole; only its tail (a usage chunk, the end of the stream) was slow to come.
        except (EndpointStreamError, httpx.HTTPError) as error:
            if chunks == 0 and isinstance(error, EndpointStreamError):
                raise
            # The answer broke off once the server had the request: it is no longer working on it (or may still be,
            # so it is not asked again), and what came is unusable.
            raise LLMUnavailable(f"the LLM endpoint broke off its answer ({type(error).__name__})") from None
        if chunks == 0 and not event_stream:
            raise _NotStreamed
        if writing and finish_reason is None:
            # Ended without saying why: llama-cpp-python's server, for one, cuts a stream short when another request
            # arrives. What came is not the model's whole answer.
            raise LLMUnavailable("the LLM endpoint ended its answer before it was finished (another request may "
                                 "have interrupted it: run one request at a time, WORKER_CONCURRENCY=1)")
        return ChatAnswer(content=raw, finish_reason=finish_reason), usage

    def _arguments(
        self,
        quirks: EndpointQuirks,
        messages: Sequence[Message],
        model: str,
        max_tokens: int | None,
        temperature: float,
        response_format: dict[str, Any] | None,
    ) -> dict[str, Any]:
        arguments: dict[str, Any] = {"model": model, "messages": list(messages)}
        if quirks.send_temperature:
            arguments["temperature"] = temperature
        if max_tokens is not None:
            arguments[quirks.token_limit_parameter] = max_tokens
        if response_format is not None:
            arguments["response_format"] = response_format
        if self.config.reasoning_effort and quirks.send_reasoning_effort:
            arguments["reasoning_effort"] = self.config.reasoning_effort
        return arguments

    async def _record_usage(
        self, usage: TokenUsage | None, messages: Sequence[Message], answer: str, *, task: str, model: str,
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


def _completion_answer(completion: dict[str, Any]) -> ChatAnswer:
    """The first choice's content and finish reason; `reasoning_content`/`reasoning` fields are deliberately never read."""
    choices = completion.get("choices")
    choice = choices[0] if isinstance(choices, list) and choices else None
    if not isinstance(choice, dict):
        raise LLMError("the LLM endpoint returned no answer (no choices)")
    message = choice.get("message")
    content = message.get("content") if isinstance(message, dict) else None
    finish_reason = choice.get("finish_reason")
    return ChatAnswer(content=content if isinstance(content, str) else "",
                      finish_reason=finish_reason if isinstance(finish_reason, str) else None)
