"""Key files and internal tokens on disk (R-AUTH-1, R-AUTH-3).

- `KeyFile`: a key file (`domain/security/api_keys.py` has the format) read at start, where a problem
  refuses the start in one line, and read again when it changes while serving (checked at most
  once a second), so `vllm-srun key add` takes effect without a restart; a change that does not
  parse keeps the keys that did, and says so in the log.
- `add_key`: a new random key for a tenant, its digest appended to the file (created 0600,
  appended under an exclusive lock); the key itself is returned once and stored nowhere.
- `read_token`: the per-deployment internal token the front sends its TCP replicas, from a file
  or an environment variable; never from a command line, where `ps` would show it.
"""

from __future__ import annotations

import fcntl
import logging
import os
import secrets
import stat
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path

from vllm_srun.domain.security.api_keys import KeyFileError, KeyTable, key_digest, key_line, parse_key_file

log = logging.getLogger("vllm_srun.auth")
KEY_PREFIX = "srk-"  # recognisable in a leaked-secret scan
KEY_BYTES = 32  # 256 random bits
TOKEN_ENV = "VLLM_SRUN_INTERNAL_TOKEN"  # the worker's internal token, when not in a file
MIN_TOKEN_CHARS = 16
RECHECK_S = 1.0


def read_key_file(path: str, flag: str = "--api-key-file") -> KeyTable:
    """The keys of PATH; KeyFileError (one line) when it cannot be read or a line is bad."""
    try:
        text = Path(path).read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        reason = exc.strerror if isinstance(exc, OSError) and exc.strerror else type(exc).__name__
        raise KeyFileError(f"{flag} {path}: {reason}") from None
    table = parse_key_file(text, source=f"{flag} {path}")
    if not table.entries:
        raise KeyFileError(f"{flag} {path}: no keys (add one: vllm-srun key add TENANT --api-key-file {path})")
    return table


class KeyFile:
    """A key file as it is now: read at construction (refusing a bad one), then again when its
    size, time or inode change, looked at most once per RECHECK_S of CLOCK."""

    def __init__(self, path: str, *, flag: str = "--api-key-file", clock: Callable[[], float] = time.monotonic) -> None:
        self.path = path
        self.flag = flag
        self.clock = clock
        self._stamp = self._stat()
        self._table = read_key_file(path, flag)
        self._checked = clock()

    def _stat(self) -> tuple[int, int, int, int] | None:
        try:
            info = os.stat(self.path)
        except OSError:
            return None
        return info.st_ino, info.st_size, info.st_mtime_ns, info.st_ctime_ns

    def table(self) -> KeyTable:
        now = self.clock()
        if now - self._checked >= RECHECK_S:
            self._checked = now
            stamp = self._stat()
            if stamp != self._stamp:
                self._stamp = stamp
                self._reload()
        return self._table

    def _reload(self) -> None:
        try:
            table = read_key_file(self.path, self.flag)
        except KeyFileError as exc:
            log.error("%s; serving the %d key(s) read before", exc, len(self._table))
            return
        log.warning("%s %s changed: %d key(s) now", self.flag, self.path, len(table))
        self._table = table


def new_key() -> str:
    return KEY_PREFIX + secrets.token_urlsafe(KEY_BYTES)


def add_key(
    path: str,
    tenant: str,
    *,
    policy: Sequence[float | int | None] = (),
    make_key: Callable[[], str] = new_key,
) -> str:
    """Append a new key of TENANT to the key file at PATH (created 0600 when missing) and return
    the key; POLICY: its line's weight, max_queued_tokens and rate (None: not set). Refuses
    (ValueError, one line) a bad tenant name, a file that does not parse, or a policy the file's
    other lines of the tenant contradict."""
    key = make_key()
    line = key_line(tenant, key_digest(key), policy)  # ValueError on a bad tenant name
    fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_APPEND | getattr(os, "O_CLOEXEC", 0), 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode):
            raise ValueError(f"--api-key-file {path}: not a regular file")
        with os.fdopen(os.dup(fd), "r", encoding="utf-8") as existing:
            text = existing.read()
        table = parse_key_file(text, source=f"--api-key-file {path}")  # never append to a broken file
        if table.tenant_of(key) is not None:  # pragma: no cover - 256 random bits
            raise ValueError("the new key collides with one in the file; run the command again")
        prefix = "" if not text or text.endswith("\n") else "\n"
        parse_key_file(text + prefix + line, source=f"--api-key-file {path}")  # the new line agrees with the rest
        os.write(fd, (prefix + line).encode())
        os.fsync(fd)
    finally:
        os.close(fd)  # releases the lock
    return key


def read_token(*, file: str | None = None, env: str | None = None, environ: Mapping[str, str] | None = None) -> str:
    """An internal token from FILE, else from the environment variable ENV; ValueError (one
    line, never the token) when neither gives one of at least MIN_TOKEN_CHARS printable,
    non-space characters."""
    environ = os.environ if environ is None else environ
    if file is not None:
        try:
            token = Path(file).read_text(encoding="utf-8").strip()
        except (OSError, UnicodeDecodeError) as exc:
            reason = exc.strerror if isinstance(exc, OSError) and exc.strerror else type(exc).__name__
            raise ValueError(f"internal token file {file}: {reason}") from None
        where = f"internal token file {file}"
    elif env is not None:
        token = environ.get(env, "").strip()
        where = f"environment variable {env}"
        if not token:
            raise ValueError(f"{where} is not set")
    else:
        raise ValueError("an internal token needs a file or an environment variable")
    if len(token) < MIN_TOKEN_CHARS or not token.isprintable() or any(c.isspace() for c in token):
        raise ValueError(f"{where}: the token must be at least {MIN_TOKEN_CHARS} printable characters without spaces")
    return token
