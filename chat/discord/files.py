"""Downloading a file shared on Discord: the attachment's CDN address, as the interaction or message gave it, with
no token, from Discord's CDN origins only (`research.file_download` refuses any other address and any redirect off
them, and sends none of the client's own credentials, so even the bot's API client could be handed in safely).
"""

from __future__ import annotations

from collections.abc import Sequence

import httpx

from research.file_download import download_from_hosts
from research.files import FileRef, FileRefused

HTTP_TIMEOUT_SECONDS = 30.0


class DiscordFileDownloader:
    """A `FileDownloader` for attachments shared on Discord."""

    def __init__(self, hosts: Sequence[str], http: httpx.AsyncClient | None = None) -> None:
        """Download from the origins in `hosts` (DISCORD_FILE_HOSTS) through `http` (one of its own when None)."""
        self.hosts = tuple(hosts)
        # Made at the first download: the Discord adapter builds this bundle too, and never downloads.
        self._http = http

    @property
    def http(self) -> httpx.AsyncClient:
        if self._http is None:
            self._http = httpx.AsyncClient(timeout=HTTP_TIMEOUT_SECONDS, follow_redirects=False)
        return self._http

    async def download(self, ref: FileRef, *, max_bytes: int) -> bytes:
        """The attachment's bytes; raises `FileRefused` (naming it) when its address is not on Discord's CDN, or its
        download fails."""
        if not ref.url:
            raise FileRefused(ref.name, "Discord gave no address to download it from")
        return await download_from_hosts(self.http, ref.url, name=ref.name, hosts=self.hosts, max_bytes=max_bytes)
