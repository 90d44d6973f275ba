"""Secrets at rest: the Slack tokens of OAuth installs, encrypted with DEEPTHREAD_SECRET_KEY.

A key is a Fernet key (cryptography's authenticated symmetric encryption); the setting is a comma-separated list so
that a key can be rotated: the first key encrypts, every key decrypts (cryptography's `MultiFernet`). `EncryptedText`
is the column type that does it on the way into and out of the database, so a dump or a backup of the tables holds
no token anyone can use without the key.
"""

from __future__ import annotations

import base64
import binascii
from typing import Any

from sqlalchemy import Text
from sqlalchemy.types import TypeDecorator

from config import SettingsError

KEY_SETTING = "DEEPTHREAD_SECRET_KEY"
KEY_REQUIRED = (f"{KEY_SETTING} is required for OAuth installs: Slack tokens are stored encrypted with it "
                "(the README says how to make one)")
# A Fernet token is base64 of: version byte 0x80, an 8-byte timestamp, a 16-byte IV, the ciphertext (whole AES
# blocks) and a 32-byte HMAC.
_FERNET_VERSION = 0x80
_FERNET_OVERHEAD_BYTES = 1 + 8 + 16 + 32


class TokenCipher:
    """Encrypts with the first of DEEPTHREAD_SECRET_KEY's keys and decrypts with any of them."""

    def __init__(self, keys: list[str]) -> None:
        # Imported here: every process loads this module with the schema, few make a cipher.
        from cryptography.fernet import Fernet, MultiFernet

        if not keys:
            raise ValueError("at least one key is needed")
        self._first = Fernet(keys[0])
        self._all = MultiFernet([Fernet(key) for key in keys])

    def encrypt(self, plain: str) -> str:
        """`plain`, encrypted with the first key."""
        return self._all.encrypt(plain.encode()).decode("ascii")

    def decrypt(self, stored: str) -> str:
        """The plain text of a value this cipher's keys encrypted; raises SettingsError (naming the setting, never
        the value) when none of them did."""
        from cryptography.fernet import InvalidToken

        try:
            return self._all.decrypt(stored.encode("ascii")).decode()
        except (InvalidToken, UnicodeEncodeError):
            raise SettingsError(f"{KEY_SETTING} cannot decrypt a stored Slack token: put the key that encrypted it "
                                "back in the list (after the new one)") from None

    def renewed(self, stored: str) -> str | None:
        """What `stored` should become: encrypted when it is plain text, encrypted again with the first key when an
        older key encrypted it; None when it is already the first key's, or when no key of ours can read it."""
        from cryptography.fernet import InvalidToken

        if not is_encrypted(stored):
            return self.encrypt(stored)
        token = stored.encode("ascii")
        try:
            self._first.decrypt(token)
            return None
        except InvalidToken:
            pass
        try:
            return self._all.rotate(token).decode("ascii")
        except InvalidToken:
            return None

    def can_read(self, stored: str) -> bool:
        """Whether `stored` is encrypted with one of this cipher's keys."""
        from cryptography.fernet import InvalidToken

        if not is_encrypted(stored):
            return False
        try:
            self._all.decrypt(stored.encode("ascii"))
        except InvalidToken:
            return False
        return True


def is_encrypted(stored: str) -> bool:
    """Whether `stored` has the shape of a Fernet token (a Slack token or a webhook URL in plain text does not)."""
    try:
        raw = base64.urlsafe_b64decode(stored.encode("ascii"))
    except (binascii.Error, ValueError):
        return False
    body = len(raw) - _FERNET_OVERHEAD_BYTES
    return bool(raw) and raw[0] == _FERNET_VERSION and body > 0 and body % 16 == 0


def token_cipher(secret_key: str | None) -> TokenCipher | None:
    """The cipher of DEEPTHREAD_SECRET_KEY's value (checked by `config.Settings`), or None when it is unset or blank."""
    keys = [key.strip() for key in (secret_key or "").split(",") if key.strip()]
    return TokenCipher(keys) if keys else None


class EncryptedText(TypeDecorator[str]):
    """A text column whose values are stored encrypted with `cipher` and read back in plain text."""

    impl = Text
    cache_ok = True

    def __init__(self, cipher: TokenCipher) -> None:
        super().__init__()
        self.cipher = cipher  # named as the argument: SQLAlchemy's statement cache key reads it

    def process_bind_param(self, value: str | None, dialect: Any) -> str | None:
        return None if value is None else self.cipher.encrypt(value)

    def process_result_value(self, value: str | None, dialect: Any) -> str | None:
        return None if value is None else self.cipher.decrypt(value)
