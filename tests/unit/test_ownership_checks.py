"""A worker's status edits and posts check that their attempt still owns the run without a query while the attempt's
lease is kept (and lately renewed) or its outcome stored (issue 23: at a thousand runs, one query per status edit
crowded the database's threads and delayed reports by seconds). An attempt that does not know asks the database:
`tests/unit/test_delivery.py::test_a_stale_attempt_cannot_deliver`."""

from __future__ import annotations

import pytest
from sqlalchemy.orm import Session, sessionmaker

from storage.models import Run
from tests.attempts import worker_chat_run
from tests.fakes.messenger import RecordingMessenger
from worker import delivery as delivery_module
from worker.attempt import WorkerLoops
from worker.leases import LeaseKeeper

PATIENCE_SECONDS = 20.0


@pytest.mark.parametrize("process_keeper", [True, False], ids=["worker's keeper", "the attempt's own keeper"])
def test_an_attempt_holding_its_lease_edits_and_posts_without_asking_the_database_whether_it_owns_the_run(
        file_sessions: sessionmaker[Session], worker_loops: WorkerLoops, monkeypatch: pytest.MonkeyPatch,
        process_keeper: bool) -> None:
    sessions, loops = file_sessions, worker_loops  # a file: the keeper's thread and the attempt each connect
    asked: list[int] = []
    ask = delivery_module.ais_current_attempt

    async def counted(sessions_: object, run_id: int, attempt: int) -> bool:
        asked.append(attempt)
        return await ask(sessions_, run_id, attempt)  # type: ignore[arg-type]

    monkeypatch.setattr(delivery_module, "ais_current_attempt", counted)
    keeper = LeaseKeeper(sessions, 30.0) if process_keeper else None
    messenger = RecordingMessenger()
    run = worker_chat_run(sessions, loops, messenger, leases=keeper)
    worker = run.start(loops)
    worker.join(PATIENCE_SECONDS)
    if keeper is not None:
        keeper.stop()
    assert not worker.is_alive()
    with sessions() as session:
        stored = session.get_one(Run, run.run_id)
        assert stored.state == "done" and stored.delivered_at is not None
    assert len(messenger.edits) >= 3, "the first state, the engine's, and the final one were shown"
    assert any("evaporation" in content.text for _, content, _ in messenger.posts), "the answer was posted"
    assert asked == []
