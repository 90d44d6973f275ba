"""Downloading a shared file from its platform's own file hosts, and from nowhere else.

A file shared on Slack sits behind the bot token on Slack's file host; one shared on Discord sits on Discord's CDN.
`download_from_hosts` goes only to the origins it is given (scheme, host and port): an address elsewhere is refused
before any request, and redirects are followed by hand, one hop at a time, only while they stay on those origins, so
the credentials in `headers` never leave them. The client's own Authorization header and auth are not sent at all:
the only credentials are the ones the caller passes. The body is streamed and cut at `max_bytes`.

Everything that goes wrong is a `FileRefused` naming the file, in words a person can act on, never with the URL (a
signed CDN address) or a header in it. This is not the page fetcher (research.fetch): that one goes anywhere public
on a person's behalf; this one goes only to a platform, with the platform's token.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Mapping, Sequence

import httpx

from research.files import FileRefused, too_large
from research.netguard import url_origin

logger = logging.getLogger(__name__)

# A whole download, redirects included: the client's timeouts bound each read, this bounds a slow drip.
DOWNLOAD_TIMEOUT_SECONDS = 120.0
# Headers that carry credentials: sent only when the caller passes them, never from the client's defaults.
CREDENTIAL_HEADERS = ("authorization", "proxy-authorization", "cookie")

GONE = "it is gone or deepthread may not see it"
ACCESS_REFUSED = "the file host refused deepthread access to it"
NOT_ON_FILE_HOST = "its address is not on the platform's file host"
REDIRECTED_AWAY = "its download was redirected away from the platform's file host, which deepthread does not follow"

Origin = tuple[str, str, int]


def origin_of(url: str | httpx.URL) -> Origin | None:
    """`url`'s scheme, host and port (`research.netguard.url_origin`); None for anything but a plain http(s) address
    with a host, and for one carrying a user name or password."""
    text = str(url)
    try:
        if httpx.URL(text).userinfo:
            return None
    except (httpx.InvalidURL, TypeError):
        return None
    return url_origin(text)


def status_refusal(name: str, status: int) -> FileRefused:
    """The refusal of a download the file host answered with a non-2xx `status`."""
    if status in (404, 410):
        return FileRefused(name, GONE)
    if status in (401, 403):
        return FileRefused(name, ACCESS_REFUSED)
    return FileRefused(name, f"it could not be downloaded (the file host answered HTTP {status})")


async def download_from_hosts(http: httpx.AsyncClient, url: str, *, name: str, hosts: Sequence[str],
                              headers: Mapping[str, str] | None = None, max_bytes: int, max_redirects: int = 5,
                              timeout_seconds: float = DOWNLOAD_TIMEOUT_SECONDS) -> bytes:
    """The bytes at `url`, fetched only from the origins in `hosts` (redirects too) with `headers`; raises
    `FileRefused` naming the file `name` for an address off those hosts, a redirect away from them, a non-2xx
    answer, a body over `max_bytes`, a failed connection or a download past `timeout_seconds`."""
    allowed = {origin for host in hosts if (origin := origin_of(host)) is not None}
    try:
        async with asyncio.timeout(timeout_seconds):
            return await _follow(http, url, name=name, allowed=allowed, headers=dict(headers or {}),
                                 max_bytes=max_bytes, max_redirects=max_redirects)
    except (TimeoutError, httpx.TimeoutException) as error:
        logger.info("a file download timed out (%s)", type(error).__name__)
        raise FileRefused(name, "it could not be downloaded (the file host took too long)") from None
    except httpx.ConnectError as error:
        logger.info("a file host could not be reached (%s)", type(error).__name__)
        raise FileRefused(name, "it could not be downloaded (the file host could not be reached)") from None
    except (httpx.HTTPError, httpx.InvalidURL, httpx.StreamError) as error:
        logger.info("a file download failed (%s)", type(error).__name__)
        raise FileRefused(name, "it could not be downloaded (the connection failed)") from None


async def _follow(http: httpx.AsyncClient, url: str, *, name: str, allowed: set[Origin], headers: dict[str, str],
                  max_bytes: int, max_redirects: int) -> bytes:
    """Request `url` and each redirect after it, checking every hop's origin before its request is sent."""
    target: str | httpx.URL = url
    for hop in range(max_redirects + 1):
        origin = origin_of(target)
        if origin is None or origin not in allowed:
            if hop == 0:
                raise FileRefused(name, NOT_ON_FILE_HOST)
            logger.warning("a file download was redirected off the file hosts, to %s; not followed",
                           origin[1] if origin else "an address that is not http(s)")
            raise FileRefused(name, REDIRECTED_AWAY)
        request = _request(http, target, headers)
        # The client must not follow redirects (nor add its own auth): every hop is checked above.
        response = await http.send(request, stream=True, follow_redirects=False, auth=None)
        try:
            if response.has_redirect_location:
                target = response.url.join(response.headers["location"])
                continue
            if not 200 <= response.status_code < 300:
                raise status_refusal(name, response.status_code)
            return await _capped_body(response, name=name, max_bytes=max_bytes)
        finally:
            await response.aclose()
    raise FileRefused(name, "it could not be downloaded (too many redirects)")


def _request(http: httpx.AsyncClient, url: str | httpx.URL, headers: dict[str, str]) -> httpx.Request:
    """A GET of `url` carrying `headers`, and of the client's defaults none that carry credentials."""
    request = http.build_request("GET", url, headers={"Accept-Encoding": "identity", **headers})
    given = {key.lower() for key in headers}
    for header in CREDENTIAL_HEADERS:
        if header not in given:
            request.headers.pop(header, None)
    return request


async def _capped_body(response: httpx.Response, *, name: str, max_bytes: int) -> bytes:
    """The response's body; raises `FileRefused` when its declared length or what arrives passes `max_bytes`."""
    declared = response.headers.get("content-length", "")
    if declared.isdigit() and int(declared) > max_bytes:
        raise too_large(name, max_bytes)
    body = bytearray()
    async for chunk in response.aiter_bytes():
        body += chunk
        if len(body) > max_bytes:
            raise too_large(name, max_bytes)
    return bytes(body)
