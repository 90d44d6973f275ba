"""An in-memory messenger that records what would have been posted, for tests of the core."""

from __future__ import annotations

import itertools

from chat.message import Content, FileUpload, MessageRef, OpenedThread, Place, open_thread_under_title


class RecordingMessenger:
    """Posts, edits and uploads kept in lists; message ids are `m1`, `m2`, …"""

    def __init__(self, platform: str = "slack") -> None:
        self.platform = platform
        self.posts: list[tuple[Place, Content, MessageRef]] = []
        self.edits: list[tuple[MessageRef, Content]] = []
        self.uploads: list[tuple[Place, FileUpload]] = []
        self.directs: list[tuple[str, str, Content]] = []
        self._ids = itertools.count(1)

    async def post(self, place: Place, content: Content) -> MessageRef:
        ref = MessageRef(platform=place.platform, workspace=place.workspace, channel=place.channel,
                         message_id=f"m{next(self._ids)}", thread=place.thread)
        self.posts.append((place, content, ref))
        return ref

    async def edit(self, ref: MessageRef, content: Content) -> None:
        self.edits.append((ref, content))

    async def open_thread(self, place: Place, *, title: Content, status: Content) -> OpenedThread:
        """The title in the channel, the status message in its thread."""
        return await open_thread_under_title(self, place, title=title, status=status)

    async def upload(self, place: Place, upload: FileUpload) -> MessageRef | None:
        self.uploads.append((place, upload))
        return None

    async def direct(self, workspace: str, user: str, content: Content) -> MessageRef:
        """A direct message, kept in `directs` as (workspace, user, content)."""
        self.directs.append((workspace, user, content))
        return MessageRef(platform=self.platform, workspace=workspace, channel=f"D-{user}",
                          message_id=f"m{next(self._ids)}")
