"""Many Slack workspaces: the real bolt OAuth install flow over HTTP against the fake Slack's authorize page and
`oauth.v2.access`, the installation stored in our database (its tokens encrypted with DEEPTHREAD_SECRET_KEY, the
install page writing nothing), a run in the installed workspace spoken with that workspace's own bot token (bot and
worker process alike), and uninstalls deleting the installation."""

from __future__ import annotations

import datetime as dt
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest
from cryptography.fernet import Fernet
from sqlalchemy import inspect, select, text
from sqlalchemy.orm import Session, sessionmaker

from bot.cli import platform_core
from bot.slack.app import build_slack_app
from bot.slack.bundle import BUNDLE as SLACK
from bot.slack.dedupe import RedisEventDeduper
from bot.slack.server import build_http_app
from chat.message import Content, MessengerError, Place
from chat.slack.installations import DatabaseInstallationStore, InstalledWorkspaceClients
from chat.slack.messenger import NOT_INSTALLED, SlackMessenger, build_slack_client
from storage.db import make_engine
from storage.encryption import TokenCipher
from storage.installations import slack_bots, slack_installations
from storage.migrate import upgrade
from storage.models import Run
from tests.fakes.corpus import QUESTION, Corpus
from tests.fakes.clock import ManualClock
from tests.fakes.server import LoopbackServer
from tests.fakes.slack_api import FAKE_CLIENT_ID, FAKE_CLIENT_SECRET, FakeSlack
from tests.fakes.slack_events import ResponseUrlCatcher, SlackEventSender
from tests.integration.workers import Cluster

pytestmark = pytest.mark.integration

SECOND_TEAM, SECOND_NAME = "T0SECOND", "Second Workspace"
THIRD_TEAM, THIRD_NAME = "T0THIRD", "Third Workspace"
CHANNEL = "C0OAUTH01"
ASKER = "U0ASKER01"
SECRET_KEY = Fernet.generate_key().decode()


@dataclass
class OAuthWorld:
    cluster: Cluster
    slack: FakeSlack
    bot_url: str

    @property
    def sessions(self) -> sessionmaker[Session]:
        return self.cluster.sessions

    def install(self, team_id: str, team_name: str) -> httpx.Response:
        """What a person's browser does: /slack/install, Slack's approval page, back to /slack/oauth_redirect."""
        self.slack.installing(team_id, team_name)
        with httpx.Client(timeout=10.0, follow_redirects=False) as browser:
            to_slack = browser.get(f"{self.bot_url}/slack/install")
            assert to_slack.status_code == 302, to_slack.text
            # The state cookie is Secure (HTTPS in production); a browser sends it back to the same site.
            state_cookie = to_slack.headers["set-cookie"].split(";", 1)[0]
            back_to_bot = browser.get(to_slack.headers["location"])
            assert back_to_bot.status_code == 302, back_to_bot.text
            return browser.get(back_to_bot.headers["location"], headers={"Cookie": state_cookie})

    def sender(self, team_id: str, response_url: str = "http://127.0.0.1:9/response") -> SlackEventSender:
        return SlackEventSender(f"{self.bot_url}/slack/events", self.cluster.settings.slack_signing_secret.get_secret_value(),
                                team_id=team_id, response_url=response_url)

    def stored_tokens(self, team_id: str) -> list[str]:
        """The workspace's bot tokens as the database holds them: encrypted."""
        with self.sessions() as session:
            installed = session.scalars(select(slack_installations.c.bot_token).where(slack_installations.c.team_id == team_id))
            bots = session.scalars(select(slack_bots.c.bot_token).where(slack_bots.c.team_id == team_id))
            return list(installed) + list(bots)

    def decrypted_tokens(self, team_id: str) -> list[str]:
        return [Fernet(SECRET_KEY).decrypt(token.encode()).decode() for token in self.stored_tokens(team_id)]

    def every_row(self) -> dict[str, list[tuple[object, ...]]]:
        """Every row of every table in the database."""
        engine = self.sessions.kw["bind"]
        with engine.connect() as connection:
            return {table: [tuple(row) for row in connection.execute(text(f'SELECT * FROM "{table}"'))]
                    for table in inspect(engine).get_table_names()}

    def runs(self) -> list[Run]:
        with self.sessions() as session:
            return list(session.scalars(select(Run).order_by(Run.id)))


@pytest.fixture
def world(tmp_path: Path, redis_url: str) -> Iterator[OAuthWorld]:
    from storage.redis import connect

    connect(redis_url).flushall()
    with Corpus(llm_latency=0.1, page_latency=0.1) as corpus, FakeSlack() as slack:
        cluster = Cluster(database_url=f"sqlite:///{tmp_path}/deepthread.db", redis_url=redis_url, corpus=corpus,
                          slack=slack, workdir=tmp_path, slack_bot_token="", slack_client_id=FAKE_CLIENT_ID,
                          slack_client_secret=FAKE_CLIENT_SECRET, slack_authorize_url=slack.authorize_url,
                          deepthread_secret_key=SECRET_KEY)
        app = build_slack_app(cluster.settings, platform_core(SLACK, cluster.settings),
                              client=build_slack_client("", slack.api_url), dedupe=RedisEventDeduper.from_url(redis_url))
        try:
            with LoopbackServer(build_http_app(app)) as server:
                slack.oauth_redirect_url = f"{server.url}/slack/oauth_redirect"
                yield OAuthWorld(cluster, slack, server.url)
        finally:
            cluster.stop()


def test_an_install_through_the_oauth_flow_stores_the_workspace_s_bot_token_encrypted(world: OAuthWorld) -> None:
    finished = world.install(SECOND_TEAM, SECOND_NAME)
    assert finished.status_code == 200, finished.text
    [token] = world.slack.tokens_of(SECOND_TEAM)
    assert token.startswith("xoxb-")
    stored = world.stored_tokens(SECOND_TEAM)
    assert len(stored) == 2 and not any("xoxb" in value or token in value for value in stored), stored
    assert world.decrypted_tokens(SECOND_TEAM) == [token, token]  # the installation and its bot
    [exchange] = world.slack.calls("oauth.v2.access")
    assert exchange.error is None and exchange.token is None  # the app's client id and secret, no token
    [approval] = world.slack.calls("oauth.v2.authorize")
    assert set(approval.params["scope"].split(",")) >= {"commands", "chat:write", "app_mentions:read"}


def test_opening_the_install_page_writes_nothing_to_the_database(world: OAuthWorld) -> None:
    before = world.every_row()
    with httpx.Client(timeout=10.0, follow_redirects=False) as browser:
        for _ in range(3):
            to_slack = browser.get(f"{world.bot_url}/slack/install")
            assert to_slack.status_code == 302 and "state=" in to_slack.headers["location"], to_slack.text
    after = world.every_row()
    assert {table: rows for table, rows in after.items() if before.get(table) != rows} == {}, "rows written"


def test_a_redirect_without_the_state_cookie_installs_nothing(world: OAuthWorld) -> None:
    world.slack.installing(SECOND_TEAM, SECOND_NAME)
    with httpx.Client(timeout=10.0, follow_redirects=False) as browser:
        to_slack = browser.get(f"{world.bot_url}/slack/install")
        back_to_bot = browser.get(to_slack.headers["location"])
        refused = browser.get(back_to_bot.headers["location"])  # another browser: no cookie
    assert refused.status_code == 400
    assert world.slack.calls("oauth.v2.access") == [] and world.stored_tokens(SECOND_TEAM) == []


def test_a_run_in_an_installed_workspace_speaks_with_that_workspace_s_token(world: OAuthWorld) -> None:
    world.cluster.start_worker("w1")
    assert world.install(SECOND_TEAM, SECOND_NAME).status_code == 200
    [token] = world.slack.tokens_of(SECOND_TEAM)
    sender = world.sender(SECOND_TEAM)
    assert sender.send(sender.command("/research", QUESTION, user=ASKER, channel=CHANNEL)).status_code == 200
    run = world.cluster.wait_for(lambda: world.runs(), 20, "the run")[0]
    run = world.cluster.wait_for_state(run.id, {"done", "failed", "cancelled", "timed_out"}, 60)
    assert run.state == "done" and run.workspace == SECOND_TEAM, run.error
    thread = run.status_message["thread"]
    world.cluster.wait_for(lambda: any("here is your report" in message.visible_text
                                       for message in world.slack.messages(CHANNEL, thread_ts=thread)), 20, "the report")
    spoken = [call for call in world.slack.calls() if call.params.get("channel") == CHANNEL]
    methods = {call.method for call in spoken}
    assert {"conversations.info", "chat.postMessage", "chat.update"} <= methods, methods
    assert {call.token for call in spoken} == {token}, "the bot and the worker both used the installed token"
    sender.close()


def test_uninstalling_the_app_deletes_the_workspace_s_installation(world: OAuthWorld) -> None:
    assert world.install(SECOND_TEAM, SECOND_NAME).status_code == 200
    assert world.install(THIRD_TEAM, THIRD_NAME).status_code == 200
    world.slack.uninstall(SECOND_TEAM)
    sender = world.sender(SECOND_TEAM)
    uninstalled = sender.event({"type": "app_uninstalled", "event_ts": sender.next_ts()})
    assert sender.send(uninstalled).status_code == 200
    world.cluster.wait_for(lambda: world.stored_tokens(SECOND_TEAM) == [], 10, "the installation to be deleted")
    assert world.decrypted_tokens(THIRD_TEAM) == world.slack.tokens_of(THIRD_TEAM) * 2, "other workspaces keep theirs"
    with ResponseUrlCatcher() as catcher:
        asking = world.sender(SECOND_TEAM, response_url=catcher.url)
        assert asking.send(asking.command("/research", QUESTION, user=ASKER, channel=CHANNEL)).status_code == 200
        [told] = catcher.responses()
    assert "reinstall" in told.payload["text"] and world.runs() == []
    sender.close()
    asking.close()


def test_a_revoked_bot_token_deletes_the_workspace_s_installation(world: OAuthWorld) -> None:
    assert world.install(THIRD_TEAM, THIRD_NAME).status_code == 200
    sender = world.sender(THIRD_TEAM)
    revoked = sender.event({"type": "tokens_revoked", "tokens": {"bot": [world.slack.bot_user_id]}})
    assert sender.send(revoked).status_code == 200
    world.cluster.wait_for(lambda: world.stored_tokens(THIRD_TEAM) == [], 10, "the installation to be deleted")
    sender.close()


# --- the worker's side: a messenger that finds each workspace's token --------------------------------

@pytest.fixture
def store(tmp_path: Path) -> DatabaseInstallationStore:
    url = f"sqlite:///{tmp_path}/installations.db"
    engine = make_engine(url)
    upgrade(url, engine=engine)
    return DatabaseInstallationStore(engine, FAKE_CLIENT_ID, TokenCipher([SECRET_KEY]))


async def install_through_slack(slack: FakeSlack, store: DatabaseInstallationStore, team_id: str, team_name: str,
                                installed_at: dt.datetime | None = None) -> str:
    """Approve on the fake's authorize page, exchange the code with oauth.v2.access, store it; the bot token."""
    from slack_sdk.oauth.installation_store.models.installation import Installation

    slack.installing(team_id, team_name)
    async with httpx.AsyncClient() as browser:
        approved = await browser.get(slack.authorize_url, params={"client_id": FAKE_CLIENT_ID, "state": "s",
                                                                  "redirect_uri": "http://127.0.0.1:9/back"})
    code = httpx.URL(approved.headers["location"]).params["code"]
    answer = await build_slack_client("", slack.api_url).oauth_v2_access(client_id=FAKE_CLIENT_ID,
                                                                         client_secret=FAKE_CLIENT_SECRET, code=code)
    installed_at = installed_at or dt.datetime.now(dt.timezone.utc)
    await store.async_save(Installation(
        app_id=answer["app_id"], enterprise_id=None, team_id=answer["team"]["id"], team_name=answer["team"]["name"],
        bot_token=answer["access_token"], bot_id="B0BOT", bot_user_id=answer["bot_user_id"], bot_scopes=answer["scope"],
        user_id=answer["authed_user"]["id"], installed_at=installed_at.timestamp()))
    return answer["access_token"]


async def test_the_messenger_posts_with_each_workspace_s_token_and_refuses_an_uninstalled_one(
        store: DatabaseInstallationStore) -> None:
    with FakeSlack() as slack:
        second = await install_through_slack(slack, store, SECOND_TEAM, SECOND_NAME)
        third = await install_through_slack(slack, store, THIRD_TEAM, THIRD_NAME)
        messenger = SlackMessenger(workspaces=InstalledWorkspaceClients(
            store, lambda token: build_slack_client(token, slack.api_url)))
        for team in (SECOND_TEAM, THIRD_TEAM):
            await messenger.post(Place(platform="slack", workspace=team, channel=f"C{team}"), Content(text="hello"))
        assert [(call.params["channel"], call.token) for call in slack.calls("chat.postMessage")] == [
            (f"C{SECOND_TEAM}", second), (f"C{THIRD_TEAM}", third)]
        with pytest.raises(MessengerError) as refused:
            await messenger.post(Place(platform="slack", workspace="T0NEVER", channel="C1"), Content(text="hello"))
        assert refused.value.reason == NOT_INSTALLED and not refused.value.retryable


class CountingStore(DatabaseInstallationStore):
    """The store, counting the worker's token look-ups."""

    looked_up = 0

    async def bot_of_workspace(self, team_id: str):
        self.looked_up += 1
        return await super().bot_of_workspace(team_id)


async def test_a_workspace_s_token_is_remembered_for_a_while_and_looked_up_again_when_refused(
        store: DatabaseInstallationStore) -> None:
    clock = ManualClock()
    counting = CountingStore(store.store.engine, FAKE_CLIENT_ID, TokenCipher([SECRET_KEY]))
    with FakeSlack() as slack:
        first = await install_through_slack(slack, store, SECOND_TEAM, SECOND_NAME,
                                            dt.datetime(2026, 1, 1, tzinfo=dt.timezone.utc))
        messenger = SlackMessenger(workspaces=InstalledWorkspaceClients(
            counting, lambda token: build_slack_client(token, slack.api_url), cache_seconds=60, clock=clock))
        place = Place(platform="slack", workspace=SECOND_TEAM, channel="C1")
        await messenger.post(place, Content(text="one"))
        await messenger.post(place, Content(text="two"))
        assert counting.looked_up == 1, "the token is remembered between calls"
        clock.advance(61)
        await messenger.post(place, Content(text="three"))
        assert counting.looked_up == 2, "and read again once it is old"
        slack.uninstall(SECOND_TEAM)
        with pytest.raises(MessengerError) as refused:
            await messenger.post(place, Content(text="four"))
        assert refused.value.reason == "invalid_auth"
        reinstalled = await install_through_slack(slack, store, SECOND_TEAM, SECOND_NAME,
                                                  dt.datetime(2026, 2, 1, tzinfo=dt.timezone.utc))
        await messenger.post(place, Content(text="five"))  # within the minute: the refusal made it look again
        assert counting.looked_up == 3
        assert [call.token for call in slack.calls("chat.postMessage") if call.error is None] == [
            first, first, first, reinstalled]
