"""Downloading a file shared on Slack: `files.info` with the workspace's bot token, then the file's private download
address on Slack's file host, with the same token, and nowhere else.

Refused, in words a person can act on: a file Slack says is gone or hidden from the bot, an app without the
files:read scope, a token Slack no longer accepts, a link to a file stored outside Slack (Google Drive and the like:
`is_external`), a file from another organisation through Slack Connect (its uploader's team is not the workspace's,
or Slack marks it `file_access: check_file_info`), and a file over the size limit (by its `size`, before any
download). The token goes in an Authorization header to the Slack file hosts only: `research.file_download` refuses
any other address and any redirect off those hosts. It is never logged and never in a refusal.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Mapping, Sequence
from typing import Any

import aiohttp
import httpx
from slack_sdk.errors import SlackApiError, SlackClientError
from slack_sdk.web.async_client import AsyncWebClient
from slack_sdk.web.async_slack_response import AsyncSlackResponse

from chat.slack.messenger import REFUSED_TOKEN_ERRORS, WorkspaceClients
from research.file_download import GONE, download_from_hosts
from research.files import too_large
from research.files import FileRef, FileRefused

logger = logging.getLogger(__name__)

HTTP_TIMEOUT_SECONDS = 30.0
CREDENTIALS_REFUSED = "Slack no longer accepts deepthread's credentials for this workspace (reinstall the app)"
# What files.info (and auth.test) answer, in a person's words.
SLACK_FILE_ERRORS: Mapping[str, str] = {
    "file_not_found": GONE,
    "file_deleted": "it was deleted from Slack",
    "not_in_channel": "deepthread is not in the channel it was shared in (invite it there)",
    "access_denied": "Slack refused deepthread access to it",
    "missing_scope": "the Slack app needs the files:read scope to read shared files "
                     "(reinstall it with the current manifest)",
    **{code: CREDENTIALS_REFUSED for code in REFUSED_TOKEN_ERRORS},  # not_authed, invalid_auth, token_revoked, …
}
EXTERNAL_FILE = "it is a link to a file stored outside Slack{where}; share the file itself to use it"
EXTERNAL_PLACES = {"gdrive": "Google Drive", "dropbox": "Dropbox", "box": "Box", "onedrive": "OneDrive"}
SLACK_CONNECT_FILE = "it was shared from another organization through Slack Connect, whose files deepthread does not read"
RESTRICTED_FILE = "Slack restricts who may open it"
NOT_INSTALLED = "deepthread is not installed in the Slack workspace it was shared in"


def slack_error_words(code: str) -> str:
    """What Slack's error `code` means to the person whose file it was."""
    return SLACK_FILE_ERRORS.get(code, f"Slack would not describe it ({code})")


def file_refusal(name: str, file: Mapping[str, Any], *, team_id: str | None, max_bytes: int) -> FileRefused | None:
    """Why the Slack file object `file` (as files.info returns it) may not be downloaded for workspace `team_id`;
    None when it may."""
    if file.get("mode") == "tombstone":
        return FileRefused(name, GONE)
    if file.get("is_external") or file.get("mode") == "external":
        place = EXTERNAL_PLACES.get(str(file.get("external_type") or ""))
        return FileRefused(name, EXTERNAL_FILE.format(where=f" ({place})" if place else ""))
    access = file.get("file_access")
    if access == "check_file_info":
        return FileRefused(name, SLACK_CONNECT_FILE)
    if access not in (None, "visible"):
        return FileRefused(name, RESTRICTED_FILE)
    owner_team = file.get("user_team")
    if owner_team and team_id and owner_team != team_id:
        return FileRefused(name, SLACK_CONNECT_FILE)
    size = file.get("size")
    if isinstance(size, int) and size > max_bytes:
        return too_large(name, max_bytes)
    return None


class SlackFileDownloader:
    """A `FileDownloader` for files shared on Slack, with one bot token or each workspace's own."""

    def __init__(self, client: AsyncWebClient | None = None, *, workspaces: WorkspaceClients | None = None,
                 hosts: Sequence[str], http: httpx.AsyncClient | None = None) -> None:
        """Ask Slack with one `client` (one bot token) everywhere, or with each workspace's client from `workspaces`,
        and download from the origins in `hosts` (SLACK_FILE_HOSTS) through `http` (one of its own when None)."""
        if (client is None) == (workspaces is None):
            raise ValueError("give the file downloader either one client or the workspaces' clients")
        self.client = client
        self.workspaces = workspaces
        self.hosts = tuple(hosts)
        # Made at the first download: the Slack adapter builds this bundle too, and never downloads. It lives as
        # long as the worker process.
        self._http = http
        self._own_team_id: str | None = None  # the single client's workspace, from auth.test

    @property
    def http(self) -> httpx.AsyncClient:
        if self._http is None:
            self._http = httpx.AsyncClient(timeout=HTTP_TIMEOUT_SECONDS, follow_redirects=False)
        return self._http

    async def download(self, ref: FileRef, *, max_bytes: int) -> bytes:
        """The file's bytes; raises `FileRefused` (naming the file) when Slack will not describe it, it may not be
        read, it is too large (by files.info's size), or its download fails."""
        client, team_id = await self._client_of(ref)
        file = await self._file_info(client, ref)
        refusal = file_refusal(ref.name, file, team_id=team_id, max_bytes=max_bytes)
        if refusal is not None:
            raise refusal
        url = str(file.get("url_private_download") or file.get("url_private") or "")
        if not url:
            raise FileRefused(ref.name, "Slack offers no download of it")
        if not client.token:
            raise FileRefused(ref.name, CREDENTIALS_REFUSED)
        return await download_from_hosts(self.http, url, name=ref.name, hosts=self.hosts,
                                         headers={"Authorization": f"Bearer {client.token}"}, max_bytes=max_bytes)

    async def _client_of(self, ref: FileRef) -> tuple[AsyncWebClient, str | None]:
        """The client for the file's workspace, and that workspace's team id (None where it cannot be had)."""
        if self.client is not None:
            if ref.workspace:
                return self.client, ref.workspace
            if self._own_team_id is None:
                answer = await self._asked(ref, self.client.auth_test())
                self._own_team_id = str(answer.get("team_id") or "") or None
            return self.client, self._own_team_id
        assert self.workspaces is not None  # __init__ took exactly one of the two
        client = await self.workspaces.client_for(ref.workspace) if ref.workspace else None
        if client is None:
            raise FileRefused(ref.name, NOT_INSTALLED)
        return client, ref.workspace

    async def _file_info(self, client: AsyncWebClient, ref: FileRef) -> Mapping[str, Any]:
        """The file object files.info answers for `ref`."""
        answer = await self._asked(ref, client.files_info(file=ref.file_id))
        file = answer.get("file")
        if not isinstance(file, dict):
            raise FileRefused(ref.name, GONE)
        return file

    async def _asked(self, ref: FileRef, call: Awaitable[AsyncSlackResponse]) -> AsyncSlackResponse:
        """What Slack answered to `call`; raises `FileRefused` in Slack's words when it refused or was unreachable."""
        try:
            return await call
        except SlackApiError as error:
            data = getattr(error.response, "data", None)
            status = getattr(error.response, "status_code", 200)
            code = str(data.get("error") if isinstance(data, dict) and data.get("error") else f"http_{status}")
            logger.info("slack refused to describe a shared file (%s)", code)
            if code in REFUSED_TOKEN_ERRORS and self.workspaces is not None and ref.workspace:
                self.workspaces.forget(ref.workspace)
            raise FileRefused(ref.name, slack_error_words(code)) from None
        except (SlackClientError, aiohttp.ClientError, asyncio.TimeoutError) as error:
            logger.info("slack could not be asked about a shared file (%s)", type(error).__name__)
            raise FileRefused(ref.name, "Slack could not be asked about it (the connection failed)") from None
