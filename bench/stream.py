"""How soon a quick answer's first words appear in Slack: from the request to the first streamed words.

A real `deepthread worker` process against SQLite in a temporary directory, a real Redis on 127.0.0.1, the fake
Slack Web API, and the fake model streaming its answers (server-sent events) with a fixed time to first token
(`--ttft`, 1.5 s by default) and a word every 20 ms after it. Each trial starts one chat run the way the bot does
(a root message, a status message in its thread, a Run row, `Queue.submit`) and measures from just before that to
the fake Slack receiving the run's `chat.startStream`. One warm-up run goes first (first imports) and is not counted.

Target: first words within the time to first token + 0.5 s.

    .venv/bin/python bench/stream.py [--trials N] [--ttft SECONDS]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from storage.redis import connect  # noqa: E402
from tests.fakes.corpus import Corpus  # noqa: E402
from tests.fakes.slack_api import FakeSlack  # noqa: E402
from tests.integration.workers import Cluster  # noqa: E402
from tests.services import redis_server  # noqa: E402

ANSWER = ("Tides come twice a day because the Moon pulls the near ocean toward it while the Earth is pulled away "
          "from the far ocean, so two bulges of water stay under the Moon as the planet turns.")
WORD_SECONDS = 0.02
TIMEOUT_SECONDS = 60.0
TARGET_MARGIN_SECONDS = 0.5


def first_words_seconds(cluster: Cluster, slack: FakeSlack, question: str) -> float:
    """Seconds from starting one chat run to its first `chat.startStream` reaching the fake Slack."""
    requested = time.monotonic()
    run_id, _ = cluster.start_run(question, mode="chat")
    thread = cluster.run(run_id).status_message["thread"]
    start = cluster.wait_for(
        lambda: next((call for call in slack.calls("chat.startStream") if call.params.get("thread_ts") == thread), None),
        TIMEOUT_SECONDS, f"the first words of run {run_id}")
    cluster.wait_for_state(run_id, {"done", "failed"}, TIMEOUT_SECONDS)
    return start.at - requested


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--trials", type=int, default=5)
    parser.add_argument("--ttft", type=float, default=1.5, help="the fake model's time to first token, in seconds")
    arguments = parser.parse_args()
    with tempfile.TemporaryDirectory() as directory, redis_server() as redis_url, FakeSlack() as slack, \
            Corpus(llm_handler=lambda request: ANSWER) as corpus:
        connect(redis_url).flushall()
        corpus.llm.time_to_first_token = arguments.ttft
        corpus.llm.chunk_delay = WORD_SECONDS
        workdir = Path(directory)
        cluster = Cluster(database_url=f"sqlite:///{workdir}/deepthread.db", redis_url=redis_url, corpus=corpus,
                          slack=slack, workdir=workdir)
        cluster.start_worker("bench")
        try:
            first_words_seconds(cluster, slack, "warm-up: why is the sky blue")
            timings = [first_words_seconds(cluster, slack, f"question {trial}: why do tides happen twice a day")
                       for trial in range(arguments.trials)]
        finally:
            cluster.stop()
    median = statistics.median(timings)
    print(f"first words after {', '.join(f'{seconds:.3f}' for seconds in timings)} s "
          f"(time to first token {arguments.ttft:g} s, target {arguments.ttft + TARGET_MARGIN_SECONDS:g} s)")
    print(f"first_words_s={median:.3f} first_words_max_s={max(timings):.3f} ttft_s={arguments.ttft:g}")


if __name__ == "__main__":
    main()
