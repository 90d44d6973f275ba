"""The OAuth install's state is signed, not stored: one we issued is accepted until it expires, and nothing else is."""

from __future__ import annotations

from bot.slack.oauth_state import STATE_SECONDS, SignedOAuthStateStore
from tests.fakes.clock import FakeClock


def store(clock: FakeClock, secret: str = "client-secret") -> SignedOAuthStateStore:
    return SignedOAuthStateStore(secret, clock=clock)


async def test_a_state_we_issued_is_accepted_until_it_expires() -> None:
    clock = FakeClock()
    states = store(clock)
    state = await states.async_issue()
    assert await states.async_consume(state)
    clock.advance(STATE_SECONDS - 1)
    assert await states.async_consume(state)
    clock.advance(2)
    assert not await states.async_consume(state), "an expired state"


async def test_a_state_altered_or_signed_with_another_secret_is_refused() -> None:
    clock = FakeClock()
    states = store(clock)
    state = await states.async_issue()
    expires, nonce, signature = state.split(".")
    later = f"{int(expires) + 3600}.{nonce}.{signature}"
    forged = await store(clock, secret="someone-else").async_issue()
    for refused in (later, f"{expires}.{nonce}x.{signature}", forged, f"{expires}.{nonce}", "", "..", "²³.a.b"):
        assert not await states.async_consume(refused), refused


async def test_each_state_is_new_and_fits_a_cookie() -> None:
    states = store(FakeClock())
    issued = {await states.async_issue() for _ in range(20)}
    assert len(issued) == 20
    assert all(state.replace(".", "").replace("-", "").replace("_", "").isalnum() for state in issued)
