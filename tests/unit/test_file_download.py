"""Downloading shared files from Slack and Discord: only from their file hosts, the Slack token only to Slack's.

The fakes are loopback servers speaking the real APIs: the fake Slack's files.info and file host, the fake Discord's
CDN, and a third server standing for any other host, which records whatever reaches it. The test's HTTP client
records every request it sends, so a test can say where a token went.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable, Iterator
from typing import Any

import httpx
import pytest
from slack_sdk.web.async_client import AsyncWebClient
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from chat.discord.files import DiscordFileDownloader
from chat.slack.files import SlackFileDownloader
from config import Settings, load_settings
from research.file_download import download_from_hosts, origin_of
from research.files import FileRef, FileRefused
from tests.fakes.discord_api import FAKE_TOKEN as DISCORD_TOKEN
from tests.fakes.discord_api import FakeDiscord
from tests.fakes.server import LoopbackFake, RecordedRequest, RequestLog, free_port
from tests.fakes.slack_api import FakeSlack

SLACK_TOKEN = "xoxb-test-file-token"
MIB = 1024 * 1024
PDF = b"%PDF-1.4\n" + b"0" * 2_000


class OtherHost(LoopbackFake):
    """Any host that is not a platform's file host: answers everything with bytes, and records every request."""

    def __init__(self) -> None:
        self.requests = RequestLog()
        self.app = Starlette(routes=[Route("/{path:path}", self._any, methods=["GET", "POST"])])

    async def _any(self, request: Request) -> Response:
        self.requests.add(RecordedRequest(method=request.method, host=request.headers.get("host", ""),
                                          path=request.url.path, query=dict(request.query_params),
                                          headers=dict(request.headers), body=await request.body()))
        return Response(b"not the file", media_type="application/pdf")


@pytest.fixture(scope="module")
def slack() -> Iterator[FakeSlack]:
    with FakeSlack(token=SLACK_TOKEN) as fake:
        yield fake


@pytest.fixture(scope="module")
def discord() -> Iterator[FakeDiscord]:
    with FakeDiscord() as fake:
        yield fake


@pytest.fixture(scope="module")
def elsewhere() -> Iterator[OtherHost]:
    with OtherHost() as fake:
        yield fake


@pytest.fixture(autouse=True)
def fresh_logs(slack: FakeSlack, discord: FakeDiscord, elsewhere: OtherHost) -> None:
    for log in (slack.file_requests, discord.cdn_requests, elsewhere.requests):
        log.clear()


@pytest.fixture
def settings(slack: FakeSlack, discord: FakeDiscord) -> Settings:
    return load_settings(slack_api_url=slack.api_url, slack_file_hosts=[slack.file_host],
                         discord_file_hosts=[discord.cdn_url], file_max_bytes=MIB)


@pytest.fixture
def sent() -> list[httpx.Request]:
    """Every request the downloaders' HTTP client sent, in order."""
    return []


@pytest.fixture
async def http(sent: list[httpx.Request]) -> AsyncIterator[httpx.AsyncClient]:
    async def record(request: httpx.Request) -> None:
        sent.append(request)

    # follow_redirects=True on purpose: the downloader must not let the client follow anything.
    async with httpx.AsyncClient(follow_redirects=True, event_hooks={"request": [record]}) as client:
        yield client


@pytest.fixture
def slack_files(slack: FakeSlack, settings: Settings, http: httpx.AsyncClient) -> SlackFileDownloader:
    client = AsyncWebClient(token=SLACK_TOKEN, base_url=str(settings.slack_api_url))
    return SlackFileDownloader(client, hosts=settings.slack_file_hosts, http=http)


def slack_ref(file: dict, *, workspace: str | None = "T0FAKE") -> FileRef:
    """The FileRef the Slack adapter makes of a shared file (the message event's file object)."""
    return FileRef(file_id=file["id"], name=file["name"], size=file["size"], mimetype=file["mimetype"],
                   link=file["permalink"], shared_by=f"slack:{file['user']}", workspace=workspace)


def assert_token_kept(error: FileRefused, *tokens: str) -> None:
    """No secret in what a person or a log reads of a refusal."""
    for token in (SLACK_TOKEN, DISCORD_TOKEN, *tokens):
        assert token not in str(error)
        assert token not in error.plain_reason
        assert token not in repr(error.args)


async def refused(downloader: SlackFileDownloader | DiscordFileDownloader, ref: FileRef,
                  max_bytes: int = MIB) -> FileRefused:
    with pytest.raises(FileRefused) as caught:
        await downloader.download(ref, max_bytes=max_bytes)
    assert caught.value.name == ref.name
    assert caught.value.plain_reason.startswith(f"{ref.name} was not used: ")
    assert_token_kept(caught.value)
    return caught.value


def token_went_only_to(sent: list[httpx.Request], origin: str) -> None:
    """Every request that carried the Slack token went to `origin`; the others carried none."""
    for request in sent:
        if SLACK_TOKEN in request.headers.get("authorization", ""):
            assert origin_of(request.url) == origin_of(origin), request.url


# --- Slack ---------------------------------------------------------------------------------------------------------


async def test_a_slack_file_downloads_with_the_bot_token_from_the_file_host_only(
        slack: FakeSlack, slack_files: SlackFileDownloader, sent: list[httpx.Request]) -> None:
    file = slack.add_file("findings.pdf", PDF, channel="C1", user="U0ALICE")

    assert await slack_files.download(slack_ref(file), max_bytes=MIB) == PDF

    (request,) = slack.file_requests.all()
    assert request.path == f"/files-pri/T0FAKE-{file['id']}/download/findings.pdf"
    assert request.headers["authorization"] == f"Bearer {SLACK_TOKEN}"
    assert [call.params["file"] for call in slack.calls("files.info")][-1] == file["id"]
    assert [str(request.url) for request in sent] == [file["url_private_download"]]
    token_went_only_to(sent, slack.file_host)


async def test_the_single_client_learns_its_workspace_from_auth_test(
        slack: FakeSlack, slack_files: SlackFileDownloader) -> None:
    file = slack.add_file("findings.pdf", PDF, channel="C1")
    assert await slack_files.download(slack_ref(file, workspace=None), max_bytes=MIB) == PDF
    connect_file = slack.add_file("theirs.pdf", PDF, channel="C1", user_team="T0PARTNER")
    assert "Slack Connect" in (await refused(slack_files, slack_ref(connect_file, workspace=None))).why


async def test_the_fake_file_host_sends_a_download_without_a_token_to_the_sign_in_page(slack: FakeSlack) -> None:
    file = slack.add_file("findings.pdf", PDF, channel="C1")
    async with httpx.AsyncClient() as client:
        bare = await client.get(file["url_private_download"])
        forged = await client.get(file["url_private_download"], headers={"Authorization": "Bearer xoxb-forged"})
    assert bare.status_code == forged.status_code == 302
    assert bare.headers["location"].startswith("https://fake-workspace.slack.com/?redir=")


@pytest.mark.parametrize(("error", "words"), [
    ("file_not_found", "it is gone or deepthread may not see it"),
    ("file_deleted", "deleted"),
    ("not_in_channel", "not in the channel it was shared in"),
    ("access_denied", "refused deepthread access"),
    ("missing_scope", "files:read scope"),
    ("not_authed", "no longer accepts deepthread's credentials"),
    ("invalid_auth", "no longer accepts deepthread's credentials"),
    ("ratelimited", "(ratelimited)"),
])
async def test_each_slack_error_is_a_plain_refusal_naming_the_file(
        slack: FakeSlack, slack_files: SlackFileDownloader, error: str, words: str) -> None:
    file = slack.add_file("quarterly report.pdf", PDF, channel="C1")
    slack.error_next("files.info", error)

    refusal = await refused(slack_files, slack_ref(file))

    assert words in refusal.plain_reason
    assert refusal.plain_reason.startswith("quarterly report.pdf was not used: ")
    assert slack.file_requests.all() == []


async def test_slack_answers_for_missing_and_deleted_files_and_a_refused_token(
        slack: FakeSlack, settings: Settings, slack_files: SlackFileDownloader, http: httpx.AsyncClient) -> None:
    missing = await refused(slack_files, FileRef(file_id="F404", name="lost.pdf", workspace="T0FAKE"))
    assert missing.why == "it is gone or deepthread may not see it"

    file = slack.add_file("old.pdf", PDF, channel="C1")
    slack.delete_file(file["id"])
    assert "deleted" in (await refused(slack_files, slack_ref(file))).why

    revoked = AsyncWebClient(token="xoxb-revoked-token", base_url=str(settings.slack_api_url))
    downloader = SlackFileDownloader(revoked, hosts=settings.slack_file_hosts, http=http)
    refusal = await refused(downloader, slack_ref(slack.add_file("a.pdf", PDF, channel="C1")))
    assert "credentials" in refusal.why
    assert_token_kept(refusal, "xoxb-revoked-token")
    assert slack.file_requests.all() == []


async def test_a_link_to_a_file_outside_slack_is_refused_without_a_download(
        slack: FakeSlack, slack_files: SlackFileDownloader, sent: list[httpx.Request]) -> None:
    file = slack.add_file("Roadmap", b"", channel="C1", external=True, external_type="gdrive")
    assert file["is_external"] and "url_private_download" not in file

    refusal = await refused(slack_files, slack_ref(file))

    assert refusal.why.startswith("it is a link to a file stored outside Slack (Google Drive)")
    assert sent == []


@pytest.mark.parametrize("shared", [{"user_team": "T0PARTNER"}, {"file_access": "check_file_info"}],
                         ids=["other organisation", "check_file_info"])
async def test_a_slack_connect_file_is_refused_without_a_download(
        slack: FakeSlack, slack_files: SlackFileDownloader, sent: list[httpx.Request], shared: dict) -> None:
    file = slack.add_file("partner.pdf", PDF, channel="C1", **shared)

    refusal = await refused(slack_files, slack_ref(file))

    assert "Slack Connect" in refusal.why
    assert sent == []


async def test_a_slack_file_over_the_limit_is_refused_before_its_download(
        slack: FakeSlack, slack_files: SlackFileDownloader, sent: list[httpx.Request]) -> None:
    # The size the event declared is checked before the downloader is asked (research.phases.files.SharedFiles);
    # one the event did not declare, by files.info's.
    file = slack.add_file("big.pdf", PDF, channel="C1")
    undeclared = slack_ref(file).model_copy(update={"size": None})
    by_info = await refused(slack_files, undeclared, max_bytes=1_024)
    assert by_info.why == "it is larger than the 1 KB limit"
    assert sent == [] and slack.file_requests.all() == []


async def test_a_redirect_off_the_file_host_is_refused_and_the_other_host_gets_nothing(
        slack: FakeSlack, elsewhere: OtherHost, slack_files: SlackFileDownloader, sent: list[httpx.Request]) -> None:
    file = slack.add_file("findings.pdf", PDF, channel="C1")
    slack.redirect_downloads(f"{elsewhere.url}/collect?from=slack")

    refusal = await refused(slack_files, slack_ref(file))

    assert "redirected away from the platform's file host" in refusal.why
    assert len(slack.file_requests) == 1
    assert elsewhere.requests.all() == []
    token_went_only_to(sent, slack.file_host)


async def test_a_redirect_that_stays_on_the_file_host_is_followed_with_the_token(
        slack: FakeSlack, slack_files: SlackFileDownloader, sent: list[httpx.Request]) -> None:
    file = slack.add_file("findings.pdf", PDF, channel="C1")
    slack.redirect_downloads(file["url_private"])

    assert await slack_files.download(slack_ref(file), max_bytes=MIB) == PDF

    assert [request.path.rsplit("/", 2)[-2] for request in slack.file_requests.all()] == ["download", f"T0FAKE-{file['id']}"]
    assert all(request.headers["authorization"] == f"Bearer {SLACK_TOKEN}" for request in slack.file_requests.all())
    token_went_only_to(sent, slack.file_host)


async def test_the_token_goes_to_no_host_but_the_slack_file_host(
        slack: FakeSlack, elsewhere: OtherHost, slack_files: SlackFileDownloader, sent: list[httpx.Request]) -> None:
    # A files.info answer whose download address is on another host, then a redirect there: neither is requested.
    pointing_away = slack.add_file("away.pdf", PDF, channel="C1", download_url=f"{elsewhere.url}/files-pri/away.pdf")
    assert "not on the platform's file host" in (await refused(slack_files, slack_ref(pointing_away))).why
    redirected = slack.add_file("findings.pdf", PDF, channel="C1")
    slack.redirect_downloads(f"{elsewhere.url}/collect")
    await refused(slack_files, slack_ref(redirected))
    # The same server under another name is another origin: not requested either.
    slack.redirect_downloads(f"http://localhost:{slack.file_host.rsplit(':', 1)[-1]}/files-pri/other-name")
    await refused(slack_files, slack_ref(redirected))
    assert await slack_files.download(slack_ref(redirected), max_bytes=MIB) == PDF

    assert elsewhere.requests.all() == []
    token_went_only_to(sent, slack.file_host)
    assert {request.host for request in slack.file_requests.all()} == {slack.file_host.removeprefix("http://")}


class Workspaces:
    """WorkspaceClients over the fake Slack: one client per installed workspace, and which were forgotten."""

    def __init__(self, clients: dict[str, AsyncWebClient]) -> None:
        self.clients = clients
        self.forgotten: list[str] = []

    async def client_for(self, workspace: str) -> AsyncWebClient | None:
        return self.clients.get(workspace)

    def forget(self, workspace: str) -> None:
        self.forgotten.append(workspace)


async def test_with_per_workspace_tokens_the_files_workspace_picks_the_token(
        slack: FakeSlack, settings: Settings, http: httpx.AsyncClient) -> None:
    workspaces = Workspaces({"T0FAKE": AsyncWebClient(token=SLACK_TOKEN, base_url=str(settings.slack_api_url)),
                             "T0GONE": AsyncWebClient(token="xoxb-gone", base_url=str(settings.slack_api_url))})
    downloader = SlackFileDownloader(workspaces=workspaces, hosts=settings.slack_file_hosts, http=http)
    file = slack.add_file("findings.pdf", PDF, channel="C1")

    assert await downloader.download(slack_ref(file, workspace="T0FAKE"), max_bytes=MIB) == PDF
    assert "not installed" in (await refused(downloader, slack_ref(file, workspace="T0ELSE"))).why
    assert "not installed" in (await refused(downloader, slack_ref(file, workspace=None))).why
    await refused(downloader, slack_ref(file, workspace="T0GONE"))
    assert workspaces.forgotten == ["T0GONE"]
    with pytest.raises(ValueError):
        SlackFileDownloader(hosts=settings.slack_file_hosts)


# --- Discord -------------------------------------------------------------------------------------------------------


def discord_ref(attachment: dict) -> FileRef:
    """The FileRef the Discord adapter makes of an attachment."""
    return FileRef(file_id=attachment["id"], name=attachment["filename"], size=attachment["size"],
                   mimetype=attachment["content_type"], url=attachment["url"])


async def test_a_discord_attachment_downloads_from_the_cdn_without_a_token(
        discord: FakeDiscord, settings: Settings) -> None:
    attachment = discord.add_attachment("notes.pdf", PDF, content_type="application/pdf")
    # The bot's own API client, with its token as a default header: the CDN still gets no token.
    async with httpx.AsyncClient(headers={"Authorization": f"Bot {DISCORD_TOKEN}"}) as bot_http:
        downloader = DiscordFileDownloader(settings.discord_file_hosts, bot_http)
        assert await downloader.download(discord_ref(attachment), max_bytes=MIB) == PDF

    (request,) = discord.cdn_requests.all()
    assert request.path == f"/attachments/{discord.channel_id}/{attachment['id']}/notes.pdf"
    assert "authorization" not in request.headers
    assert set(request.query) == {"ex", "is", "hm"}


async def test_a_discord_attachment_on_another_host_is_refused_without_a_request(
        discord: FakeDiscord, elsewhere: OtherHost, settings: Settings, http: httpx.AsyncClient) -> None:
    attachment = discord.add_attachment("notes.pdf", PDF)
    moved = {**attachment, "url": attachment["url"].replace(discord.cdn_url, elsewhere.url)}
    downloader = DiscordFileDownloader(settings.discord_file_hosts, http)

    refusal = await refused(downloader, discord_ref(moved))

    assert refusal.why == "its address is not on the platform's file host"
    assert elsewhere.requests.all() == [] and discord.cdn_requests.all() == []


async def test_a_discord_attachment_over_the_limit_is_refused(
        discord: FakeDiscord, settings: Settings, http: httpx.AsyncClient) -> None:
    attachment = discord.add_attachment("big.pdf", PDF)
    downloader = DiscordFileDownloader(settings.discord_file_hosts, http)

    # Declared larger than the limit, it is refused before the downloader is asked (SharedFiles);
    # declared smaller than it is: the CDN's Content-Length refuses it, before the body is read.
    understated = discord_ref(attachment).model_copy(update={"size": 10})
    assert "larger than" in (await refused(downloader, understated, max_bytes=1_000)).why
    assert len(discord.cdn_requests) == 1
    assert "no address" in (await refused(downloader, FileRef(file_id="1", name="x.pdf"))).why


# --- the download itself -------------------------------------------------------------------------------------------


def transport(handler: Callable[[httpx.Request], httpx.Response]) -> httpx.AsyncClient:
    return httpx.AsyncClient(transport=httpx.MockTransport(handler))


HOST = "https://files.example"


async def download(client: httpx.AsyncClient, url: str = f"{HOST}/f", max_bytes: int = MIB, **options: Any) -> bytes:
    return await download_from_hosts(client, url, name="f.pdf", hosts=[HOST], max_bytes=max_bytes,
                                     headers={"Authorization": f"Bearer {SLACK_TOKEN}"}, **options)


async def refused_download(client: httpx.AsyncClient, url: str = f"{HOST}/f", **options: Any) -> FileRefused:
    with pytest.raises(FileRefused) as caught:
        await download(client, url, **options)
    assert_token_kept(caught.value)
    return caught.value


@pytest.mark.parametrize("url", [
    "http://files.example/f",             # another scheme
    "https://files.example:8443/f",       # another port
    "https://files.example.evil/f",       # another host
    "https://user:pw@files.example/f",    # credentials in the address
    "ftp://files.example/f", "", "not a url",
])
async def test_an_address_off_the_origins_is_refused_without_a_request(url: str) -> None:
    seen: list[httpx.Request] = []
    async with transport(lambda request: seen.append(request) or httpx.Response(200)) as client:
        refusal = await refused_download(client, url)
    assert refusal.why == "its address is not on the platform's file host"
    assert seen == []


async def test_the_default_port_and_case_are_the_same_origin() -> None:
    async with transport(lambda request: httpx.Response(200, content=b"ok")) as client:
        assert await download(client, "HTTPS://Files.Example:443/f") == b"ok"


@pytest.mark.parametrize(("status", "words"), [
    (404, "it is gone or deepthread may not see it"), (410, "it is gone or deepthread may not see it"),
    (401, "the file host refused deepthread access to it"), (403, "the file host refused deepthread access to it"),
    (500, "it could not be downloaded (the file host answered HTTP 500)"),
])
async def test_an_error_status_is_a_plain_refusal(status: int, words: str) -> None:
    async with transport(lambda request: httpx.Response(status)) as client:
        assert (await refused_download(client)).why == words


async def test_a_body_past_the_limit_is_cut_off_even_without_a_length() -> None:
    chunks_sent: list[int] = []

    async def endless() -> AsyncIterator[bytes]:
        for _ in range(1_000):
            chunks_sent.append(1)
            yield b"x" * 1_024

    async with transport(lambda request: httpx.Response(200, content=endless())) as client:
        refusal = await refused_download(client, max_bytes=10 * 1_024)
    assert refusal.why == "it is larger than the 10 KB limit"
    assert len(chunks_sent) < 20


async def test_a_declared_length_past_the_limit_is_refused_before_the_body() -> None:
    async with transport(lambda request: httpx.Response(200, content=b"x" * 3 * MIB)) as client:
        assert (await refused_download(client, max_bytes=2 * MIB)).why == "it is larger than the 2 MB limit"


async def test_redirects_on_the_hosts_are_followed_a_bounded_number_of_times() -> None:
    hops: list[str] = []

    def loop(request: httpx.Request) -> httpx.Response:
        hops.append(request.url.path)
        return httpx.Response(302, headers={"Location": f"/hop{len(hops)}"})

    async with transport(loop) as client:
        assert (await refused_download(client, max_redirects=3)).why == "it could not be downloaded (too many redirects)"
    assert hops == ["/f", "/hop1", "/hop2", "/hop3"]


async def test_a_relative_redirect_keeps_the_token_and_an_absolute_one_elsewhere_is_not_requested() -> None:
    seen: list[httpx.Request] = []

    def answer(request: httpx.Request) -> httpx.Response:
        seen.append(request)
        if request.url.path == "/f":
            return httpx.Response(307, headers={"Location": "/g"})
        return httpx.Response(302, headers={"Location": "https://attacker.example/steal"})

    async with transport(answer) as client:
        refusal = await refused_download(client)
    assert refusal.why.startswith("its download was redirected away")
    assert [str(request.url) for request in seen] == [f"{HOST}/f", f"{HOST}/g"]
    assert all(request.headers["authorization"] == f"Bearer {SLACK_TOKEN}" for request in seen)


async def test_connection_failures_and_timeouts_are_refusals() -> None:
    port = free_port()
    async with httpx.AsyncClient() as client:
        with pytest.raises(FileRefused) as caught:
            await download_from_hosts(client, f"http://127.0.0.1:{port}/f", name="f.pdf",
                                      hosts=[f"http://127.0.0.1:{port}"], max_bytes=MIB)
    assert caught.value.why == "it could not be downloaded (the file host could not be reached)"

    def slow(request: httpx.Request) -> httpx.Response:
        raise httpx.ReadTimeout("timed out", request=request)

    async with transport(slow) as client:
        assert (await refused_download(client)).why == "it could not be downloaded (the file host took too long)"


async def test_the_clients_own_credentials_are_not_sent() -> None:
    seen: list[httpx.Request] = []
    async with httpx.AsyncClient(transport=httpx.MockTransport(lambda r: seen.append(r) or httpx.Response(200)),
                                 headers={"Authorization": "Bot secret"}, auth=("user", "pw")) as client:
        await download_from_hosts(client, f"{HOST}/f", name="f.pdf", hosts=[HOST], max_bytes=MIB)
    assert "authorization" not in seen[0].headers
