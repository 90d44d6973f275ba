"""Files shared in a conversation are kept as references of that conversation only: its runs read them, a run of any
other conversation (another thread, another channel, a private one) never does, and deleting the conversation deletes
them."""

from __future__ import annotations

from sqlalchemy import delete, func, select
from sqlalchemy.orm import Session, sessionmaker

from storage.attempts import run_inputs
from storage.conversations import NewRun, SharedFile, ThreadKey, remember_files, store_run, thread_view
from storage.models import Conversation, ConversationFile, Run

PRIVATE = ThreadKey("slack", "T1", "G0PRIVATE", "100.1")
PUBLIC = ThreadKey("slack", "T1", "C0PUBLIC", "200.1")
REPORT = SharedFile(file_id="F1", name="board-minutes.pdf", size=1200, mimetype="application/pdf",
                    url="https://files.slack.com/files-pri/T1-F1/download/board-minutes.pdf",
                    link="https://example.slack.com/files/U1/F1/board-minutes.pdf", shared_by="slack:U1")
NOTES = SharedFile(file_id="F2", name="notes.md", size=40, shared_by="slack:U1")


def conversation_of(sessions: sessionmaker[Session], run_id: int) -> int:
    with sessions() as session:
        return session.get_one(Run, run_id).conversation_id


def test_a_file_shared_in_a_private_thread_is_read_by_its_runs_and_by_no_run_elsewhere(
        file_sessions: sessionmaker[Session]) -> None:
    assert remember_files(file_sessions, PRIVATE, [REPORT], shared_by="slack:U1", visibility="private") == [REPORT]
    # Shared again (the same platform id): kept once.
    assert remember_files(file_sessions, PRIVATE, [REPORT, NOTES], shared_by="slack:U1") == [NOTES]
    private_run = store_run(file_sessions, NewRun(key=PRIVATE, mode="research", question="what was decided?",
                                                  requested_by="slack:U1"))
    public_run = store_run(file_sessions, NewRun(key=PUBLIC, mode="research", question="what was decided?",
                                                 requested_by="slack:U1", files=(NOTES,)))

    private_inputs = run_inputs(file_sessions, conversation_of(file_sessions, private_run), history_messages=10,
                                answer_from_run=None, max_files=10)
    public_inputs = run_inputs(file_sessions, conversation_of(file_sessions, public_run), history_messages=10,
                               answer_from_run=None, max_files=10)
    assert private_inputs.files == [REPORT, NOTES]
    assert public_inputs.files == [NOTES], "the private thread's file is no source of a run in another channel"
    view = thread_view(file_sessions, PRIVATE)
    assert view is not None and view.shared_files == 2 and view.newest_file_at is not None
    # The newest files first when a run may read fewer than the thread holds.
    assert run_inputs(file_sessions, conversation_of(file_sessions, private_run), history_messages=10,
                      answer_from_run=None, max_files=1).files == [NOTES]


def test_deleting_a_conversation_deletes_its_files(file_sessions: sessionmaker[Session]) -> None:
    remember_files(file_sessions, PRIVATE, [REPORT, NOTES], shared_by="slack:U1")
    with file_sessions.begin() as session:
        session.execute(delete(Conversation))
    with file_sessions() as session:
        assert session.scalar(select(func.count()).select_from(ConversationFile)) == 0
