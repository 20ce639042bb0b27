"""Bearer tokens that rotate: the operator's own API credentials and the token it shows the sidecars.

A projected service-account token lives for an hour or so; the kubelet writes a fresh one into the
same file (an atomic symlink swap) once 80 % of its life has gone, and the old one stops working at
its expiry. A client that reads the file once at start is locked out an hour later. `TokenFile`
re-reads the file whenever it changed (one `stat` per request), and on demand after a 401
(`reload()`), so the next request carries the new token.
"""

from __future__ import annotations

import logging
import os
from pathlib import Path
from typing import Protocol

log = logging.getLogger(__name__)


class BearerAuth(Protocol):
    def token(self) -> str | None:
        """The token to send now (None: send none)."""

    def reload(self) -> bool:
        """Read the source again after the server refused the token; True when the token changed."""


class StaticToken:
    """A token that never changes (a kubeconfig's `token`, a test's)."""

    def __init__(self, value: str | None) -> None:
        self._value = value or None

    def token(self) -> str | None:
        return self._value

    def reload(self) -> bool:
        return False


class TokenFile:
    """A token file re-read whenever its identity (inode, size, mtime) changes, and on `reload()`.

    An unreadable or empty file keeps the previous token (the kubelet may be mid-swap); the first
    read's error is raised, so a wrong path fails at start instead of on every request."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._stamp: tuple[int, int, int] | None = None
        self._value: str | None = None
        self._read(strict=True)

    def _read(self, *, strict: bool = False) -> bool:
        try:
            st = os.stat(self.path)
            value = self.path.read_text().strip()
        except OSError as exc:
            if strict:
                raise ValueError(f"token file {self.path}: {exc.strerror or exc}") from exc
            log.warning("token file %s cannot be read (%s); keeping the previous token", self.path,
                        exc.strerror or exc)
            return False
        if not value:
            if strict:
                raise ValueError(f"token file {self.path} is empty")
            return False
        self._stamp = (st.st_ino, st.st_size, st.st_mtime_ns)
        changed = value != self._value
        if changed and self._value is not None:
            log.info("token file %s: a new token was read", self.path)
        self._value = value
        return changed

    def token(self) -> str | None:
        try:
            st = os.stat(self.path)
            stamp = (st.st_ino, st.st_size, st.st_mtime_ns)
        except OSError:
            stamp = None
        if stamp is not None and stamp != self._stamp:
            self._read()
        return self._value

    def reload(self) -> bool:
        return self._read()
