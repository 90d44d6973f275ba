"""OpenAI's chat-completions protocol over httpx: one request, answered whole (JSON) or streamed (server-sent events,
read by httpx-sse), and the errors an endpoint answers, read as the official SDK reads them.

The `openai` SDK did this until its import came to a second of a research run's start-up and a tenth of a worker's
memory (3.x imports the types of every API it covers, aiohttp and a second httpx among them), for what deepthread
asks of it: one POST to `{base_url}/chat/completions`, JSON or events back. Its retry loop was already off and its
errors already translated (`research.llm`), so what is kept of it here is its reading of answers and errors:

- an answer that is not 2xx is an `EndpointStatusError` whose `body` is the `error` member of the JSON body (else the
  whole body, else its text) and whose `message` is "Error code: N - {body}", as the SDK makes them;
- a request that could not be sent or whose answer did not begin is an `EndpointConnectionError`
  (`EndpointTimeout` when a time limit fired), with httpx's error as its cause (a connect or pool timeout means the
  request never reached the server);
- a stream ends at `data: [DONE]`; an event whose data holds an `error` is an `EndpointStreamError`.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Mapping
from contextlib import asynccontextmanager
from dataclasses import dataclass
from typing import Any

import httpx
from httpx_sse import EventSource

# The SDK's own client: many connections (runs share one process), redirects followed, proxies from the environment.
_CLIENT_LIMITS = httpx.Limits(max_connections=1000, max_keepalive_connections=100)
_DONE = "[DONE]"


class EndpointError(Exception):
    """Any failure to get an answer from the endpoint (what the SDK calls `OpenAIError`)."""


class EndpointConnectionError(EndpointError):
    """The request could not be sent, or its answer did not begin; httpx's error is the `__cause__`."""


class EndpointTimeout(EndpointConnectionError):
    """A time limit fired before the answer began (connect, pool slot, or the whole answer when not streamed)."""


class EndpointUnreadable(EndpointError):
    """A 2xx answer that is not a chat completion (not JSON, or not an object)."""


class EndpointStreamError(EndpointError):
    """An error sent as an event in the middle of a stream (the answer had begun: its status was 200)."""

    def __init__(self, message: str, *, body: object) -> None:
        super().__init__(message)
        self.message = message
        self.body = body


class EndpointStatusError(EndpointError):
    """An answer with a 4xx or 5xx status: `body` is the error object the server sent, `param` the parameter it
    names (OpenAI's `error.param`), `message` the SDK's "Error code: N - {body}"."""

    def __init__(self, response: httpx.Response, *, text: str | None = None) -> None:
        text = (response.text if text is None else text).strip()
        try:
            whole: object = json.loads(text)
            message = f"Error code: {response.status_code} - {whole}"
        except ValueError:
            whole = text
            message = text or f"Error code: {response.status_code}"
        super().__init__(message)
        self.message = message
        self.response = response
        self.status_code = response.status_code
        self.body: object = whole.get("error", whole) if isinstance(whole, dict) else whole
        param = self.body.get("param") if isinstance(self.body, dict) else None
        self.param = param if isinstance(param, str) else None


@dataclass(frozen=True)
class TokenUsage:
    """What the endpoint counted for one completion."""

    prompt_tokens: int
    completion_tokens: int

    @classmethod
    def read(cls, value: object) -> TokenUsage | None:
        """The usage an answer or a stream's last chunk reports, or None when it reports none we can read."""
        if not isinstance(value, Mapping):
            return None
        prompt, completion = value.get("prompt_tokens"), value.get("completion_tokens")
        if isinstance(prompt, int) and isinstance(completion, int):
            return cls(prompt_tokens=prompt, completion_tokens=completion)
        return None


class EventStream:
    """A streamed completion's chunks (each a JSON object) as they arrive; `response` is the answer's head."""

    def __init__(self, response: httpx.Response) -> None:
        self.response = response

    @property
    def is_event_stream(self) -> bool:
        return "text/event-stream" in self.response.headers.get("content-type", "")

    async def chunks(self) -> AsyncIterator[dict[str, Any]]:
        """Each chunk until `[DONE]`; raises EndpointStreamError for an error event, EndpointUnreadable for data
        that is not JSON; an answer that is not an event stream has no chunks."""
        if not self.is_event_stream:
            return
        async for event in EventSource(self.response).aiter_sse():
            if event.data.startswith(_DONE):
                return
            if not event.data:
                continue
            try:
                data = json.loads(event.data)
            except ValueError:
                raise EndpointUnreadable("a streamed chunk was not JSON") from None
            if isinstance(data, dict) and data.get("error"):
                error = data["error"]
                message = error.get("message") if isinstance(error, dict) else None
                raise EndpointStreamError(message if isinstance(message, str) and message
                                          else "An error occurred during streaming", body=error)
            if isinstance(data, dict):
                yield data


class ChatEndpoint:
    """One OpenAI-compatible endpoint's chat completions, on a caller's httpx client or one made on first use."""

    def __init__(self, base_url: str, api_key: str, *, http_client: httpx.AsyncClient | None = None) -> None:
        self.url = f"{base_url.rstrip('/')}/chat/completions"
        self._headers = {"Authorization": f"Bearer {api_key}", "Accept": "application/json"}
        self._http = http_client
        self.owns_client = http_client is None

    @property
    def http(self) -> httpx.AsyncClient:
        """The client requests go through (the endpoint's other paths, such as `/props`, are asked on it too)."""
        if self._http is None:
            self._http = httpx.AsyncClient(limits=_CLIENT_LIMITS, follow_redirects=True)
        return self._http

    async def aclose(self) -> None:
        """Close the client if this endpoint made it."""
        if self.owns_client and self._http is not None:
            await self._http.aclose()

    async def complete(self, arguments: dict[str, Any], *, timeout: httpx.Timeout) -> tuple[dict[str, Any], TokenUsage | None]:
        """One completion asked for whole: its JSON object and usage."""
        response = await self._send(arguments, timeout=timeout, stream=False)
        try:
            completion = response.json()
        except ValueError:
            raise EndpointUnreadable("the answer was not JSON") from None
        if not isinstance(completion, dict):
            raise EndpointUnreadable("the answer was not a JSON object")
        return completion, TokenUsage.read(completion.get("usage"))

    @asynccontextmanager
    async def stream(self, arguments: dict[str, Any], *, timeout: httpx.Timeout) -> AsyncIterator[EventStream]:
        """One completion streamed: its events, the connection closed on leaving (a request no longer read is one
        the server sees closed)."""
        response = await self._send({**arguments, "stream": True}, timeout=timeout, stream=True)
        try:
            yield EventStream(response)
        finally:
            await response.aclose()

    async def _send(self, arguments: dict[str, Any], *, timeout: httpx.Timeout, stream: bool) -> httpx.Response:
        """The answer's head (and, when not streamed, its body); raises EndpointStatusError for a 4xx or 5xx."""
        headers = {**self._headers, "Accept": "text/event-stream"} if stream else self._headers
        request = self.http.build_request("POST", self.url, json=arguments, headers=headers, timeout=timeout)
        try:
            response = await self.http.send(request, stream=stream)
        except httpx.TimeoutException as error:
            raise EndpointTimeout(f"timed out ({type(error).__name__})") from error
        except httpx.HTTPError as error:
            raise EndpointConnectionError(f"connection error ({type(error).__name__})") from error
        if response.is_success:
            return response
        try:
            await response.aread()
        except httpx.HTTPError as error:
            # The server answered: its status decides (a retry only for 429 and 5xx), though its body was lost.
            raise EndpointStatusError(response, text="") from error
        finally:
            await response.aclose()
        raise EndpointStatusError(response)
