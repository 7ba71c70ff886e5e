"""Encryption of stored secrets (access-key secrets) with a server key, and keys derived from it.

The server key is a Fernet key kept in a file with mode 0600 (created on first start). Secrets are
encrypted, not hashed, because HMAC verification needs the secret itself.
"""

from __future__ import annotations

import hashlib
import hmac
import os
from pathlib import Path

from cryptography.fernet import Fernet, InvalidToken


class SecretBox:
    def __init__(self, key: bytes):
        self._fernet = Fernet(key)
        self._key = key

    @classmethod
    def from_file(cls, path: Path, *, create: bool = True) -> SecretBox:
        if not path.exists():
            if not create:
                raise FileNotFoundError(f"server key file {path} does not exist")
            path.parent.mkdir(parents=True, exist_ok=True)
            key = Fernet.generate_key()
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
            with os.fdopen(fd, "wb") as f:
                f.write(key)
        mode = path.stat().st_mode & 0o777
        if mode & 0o077:
            raise PermissionError(
                f"server key file {path} must not be readable by others (mode {mode:o}); chmod 600 it"
            )
        return cls(path.read_bytes().strip())

    def derive_key(self, purpose: str) -> bytes:
        """A 32-byte key for ``purpose`` alone (e.g. signing job tokens), derived from the server key: a value
        made with one purpose's key means nothing under another's, nor to ``decrypt``."""
        return hmac.new(self._key, b"dlcloud-derived-key/" + purpose.encode(), hashlib.sha256).digest()

    def encrypt(self, plaintext: str) -> bytes:
        return self._fernet.encrypt(plaintext.encode())

    def decrypt(self, token: bytes) -> str:
        try:
            return self._fernet.decrypt(token).decode()
        except InvalidToken as exc:
            raise ValueError("stored secret cannot be decrypted with this server key") from exc
