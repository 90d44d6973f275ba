"""A whole research run in a real worker process logging JSON at DEBUG: no question, report text or secret in its log,
and the run's id, conversation, platform, workspace and phase on every line the run logs."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from storage.redis import connect
from tests.fakes.corpus import Corpus
from tests.fakes.llm import ChatRequest, default_research_model
from tests.fakes.slack_api import FakeSlack
from tests.integration.workers import Cluster

pytestmark = pytest.mark.integration

QUESTION_MARKER = "Quillfeather"
QUESTION = f"What is known about the Zorblax tidal turbines off {QUESTION_MARKER} Point?"
REPORT_MARKER = "Thimbleroot"
SLACK_TOKEN = "xoxb-logtest-slack-bot-93a1"
SEARCH_KEYS = {"tavily": "tvly-logtest-key-51be", "brave": "brave-logtest-key-8d2a", "exa": "exa-logtest-key-c07d"}
SECRET_SETTINGS = {
    "llm_api_key": "sk-logtest-llm-key-4f1c",
    "slack_signing_secret": "logtest-signing-secret-6e2f",
    "slack_app_token": "xapp-logtest-app-token-0b7c",
    "discord_bot_token": "logtest-discord-bot-token-2c8e",
    "discord_application_id": "123456789012345678",
}
SEARXNG_PASSWORD = "logtest-searxng-password-77f0"
DATABASE_PASSWORD = "logtest-database-password-19ad"
RUN_THREADS = ("deepthread-runs", "deepthread-delivery")
ENGINE_PHASES = ("decompose", "search", "fetch", "read", "synthesize", "verify")
OUR_PACKAGES = ("research", "worker", "chat", "storage", "bot", "config")


def report_with_marker(request: ChatRequest) -> Any:
    """The well-behaved model, whose report ends with a paragraph naming the report marker."""
    reply = default_research_model(request)
    if request.schema_name is None and isinstance(reply, str):
        return f"{reply}\n\nThe {REPORT_MARKER} survey of the array found nothing to add."
    return reply


def with_password(url: str, password: str) -> str:
    scheme, rest = url.split("://", 1)
    user, host = rest.split("@", 1) if "@" in rest else ("deepthread", rest)
    return f"{scheme}://{user}:{password}@{host}"


def test_a_runs_json_log_lines_carry_its_context_and_no_question_report_text_or_secret(
        tmp_path: Path, redis_url: str, postgres_url: str) -> None:
    connect(redis_url).flushall()
    with FakeSlack(token=SLACK_TOKEN) as slack, Corpus(llm_handler=report_with_marker) as corpus:
        corpus.search.api_keys.update(SEARCH_KEYS)
        searxng_url = with_password(corpus.search.base_url("searxng"), SEARXNG_PASSWORD)
        cluster = Cluster(
            database_url=with_password(postgres_url, DATABASE_PASSWORD), redis_url=redis_url, corpus=corpus,
            slack=slack, workdir=tmp_path, log_format="json", log_level="DEBUG",
            search_providers="tavily,brave,exa,searxng", search_fanout="true", searxng_url=searxng_url,
            **{f"{provider}_api_key": key for provider, key in SEARCH_KEYS.items()},
            **{f"{provider}_base_url": corpus.search.base_url(provider) for provider in SEARCH_KEYS},
            **SECRET_SETTINGS,
        )
        try:
            cluster.start_worker("w1")
            run_id, _ = cluster.start_run(QUESTION, user="U0ALICE1", workspace="T0LOGS", channel="C0LOGS")
            run = cluster.wait_for_state(run_id, {"done", "failed", "cancelled", "timed_out"}, timeout=90)
            # Celery's last line about the task comes after the delivery and the admission that follows it.
            cluster.wait_for(lambda: "succeeded" in cluster.log("w1"), 30, "the task's end")
        finally:
            cluster.stop()
        log = cluster.log("w1")
        assert run.state == "done", run.error
        thread = run.status_message["thread"]
        reports = [message.text for message in slack.messages("C0LOGS", thread_ts=thread) if REPORT_MARKER in message.text]
        assert reports, "the report marker reached the thread, so its absence from the log means something"
        assert any(QUESTION_MARKER in str(request.query) for request in corpus.search.requests("brave"))
        assert all(request.headers.get("x-subscription-token") == SEARCH_KEYS["brave"]
                   for request in corpus.search.requests("brave"))

    report_paragraphs = [paragraph for paragraph in run.report_markdown.split("\n\n") if len(paragraph) > 40]
    secrets = [SLACK_TOKEN, *SEARCH_KEYS.values(), *(value for name, value in SECRET_SETTINGS.items()
                                                      if name != "discord_application_id"),
               SEARXNG_PASSWORD, DATABASE_PASSWORD]
    for forbidden in [QUESTION, QUESTION_MARKER, REPORT_MARKER, *secrets]:
        assert forbidden not in log, f"{forbidden!r} is in the worker's log"
    leaked = [paragraph for paragraph in report_paragraphs if paragraph in log]
    assert not leaked, f"report text in the worker's log: {leaked[:1]}"

    lines = [json.loads(line) for line in log.splitlines() if line.startswith("{")]
    assert lines, log[-3000:]
    of_the_run = [line for line in lines if "run_id" in line]
    assert {line["run_id"] for line in of_the_run} == {run_id}
    on_run_threads = [line for line in lines if line["thread"].startswith(RUN_THREADS)]
    untagged = [line for line in on_run_threads if "run_id" not in line]
    assert on_run_threads and not untagged, f"lines on the runs' threads without the run id: {untagged[:3]}"
    assert any(line["logger"].startswith("celery") and "succeeded" in line["message"] for line in of_the_run), \
        "Celery's own line about the task names the run"
    assert any(not line["logger"].startswith(OUR_PACKAGES) and not line["logger"].startswith("celery")
               for line in of_the_run), "a library's line inside the run names it"
    for line in of_the_run:
        assert (line.get("conversation_id"), line.get("platform"), line.get("workspace")) == \
            (run.conversation_id, "slack", "T0LOGS"), line

    phase_lines = {line["message"].removeprefix("phase ").removesuffix(" started"): line for line in of_the_run
                   if line["logger"] == "worker.runner" and line["message"].startswith("phase ")}
    assert set(ENGINE_PHASES) <= set(phase_lines), sorted(phase_lines)
    assert [phase_lines[phase].get("phase") for phase in ENGINE_PHASES] == list(ENGINE_PHASES)
    first_phase = of_the_run.index(phase_lines["decompose"])
    assert all("phase" in line for line in of_the_run[first_phase:]), "every line after the first phase names one"
    assert any(line.get("phase") == "deliver" for line in of_the_run), "the delivery's lines say so"
