"""The OAuth install's state, signed instead of stored: `GET /slack/install` writes nothing anywhere.

The state bolt puts in the authorize URL and in the browser's cookie is `<expiry>.<nonce>.<signature>`, the signature
an HMAC-SHA256 of the rest keyed with the app's client secret (which only we and Slack hold). On the way back bolt
checks that the browser's cookie carries the state it returns (so another browser cannot finish someone's install);
here the state is checked to be ours and unexpired. Anyone can ask for the install page any number of times without
the database growing a row each time. A state can be presented again until it expires, by the same browser only (its
cookie), and Slack's code in the redirect is good for one exchange.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import logging
import secrets
import time
from collections.abc import Callable
from logging import Logger
from typing import Any

from slack_sdk.oauth.state_store.async_state_store import AsyncOAuthStateStore

logger = logging.getLogger(__name__)

STATE_SECONDS = 600
# Kept apart from any other HMAC made with the same secret.
_PURPOSE = b"deepthread oauth state\x00"


class SignedOAuthStateStore(AsyncOAuthStateStore):
    """slack-bolt's state store with nothing stored: each state carries its expiry and a signature made with `secret`."""

    def __init__(self, secret: str, expiration_seconds: int = STATE_SECONDS, *,
                 clock: Callable[[], float] = time.time) -> None:
        self._key = secret.encode()
        self.expiration_seconds = expiration_seconds
        self.clock = clock

    @property
    def logger(self) -> Logger:
        return logger

    def _signature(self, payload: str) -> str:
        digest = hmac.new(self._key, _PURPOSE + payload.encode(), hashlib.sha256).digest()
        return base64.urlsafe_b64encode(digest).rstrip(b"=").decode("ascii")

    async def async_issue(self, *args: Any, **kwargs: Any) -> str:
        """A new state, good for `expiration_seconds`."""
        payload = f"{int(self.clock()) + self.expiration_seconds}.{secrets.token_urlsafe(16)}"
        return f"{payload}.{self._signature(payload)}"

    async def async_consume(self, state: str) -> bool:
        """Whether `state` was signed with our secret and has not expired."""
        expires, _, rest = state.partition(".")
        nonce, _, signature = rest.partition(".")
        if not (expires.isascii() and expires.isdigit() and nonce and signature):
            return False
        if not hmac.compare_digest(signature.encode(), self._signature(f"{expires}.{nonce}").encode()):
            return False
        return int(expires) >= self.clock()
