"""Which load failures are transient (R-LOAD-1): worth another attempt after a wait
(`domain/worker/load_retries.py` says how many and when).

Transient:
- the package changed while it was read: its files (names, sizes, modification times) differ
  from what they were when the attempt began, so a file was still being written or replaced
  (`PackageSnapshot`); whatever the error said, a package that does not stay still is read again;
- the filesystem said "try again": EIO, EAGAIN, EBUSY, ETXTBSY, ESTALE, EINTR, ENFILE, EMFILE;
- the device was busy or out of memory (torch's `OutOfMemoryError`, a CUDA/HIP/MPS "out of
  memory", "busy or unavailable"), and the host out of memory (`MemoryError`).

Everything else is final: a package no family reads or that refuses its settings (`DomainError`,
`ValueError`), a missing capability, an engine or device refused, a golden check that failed
(that one never raises: the runtime ends the model itself).

`public_reason` is how a failure reads to clients (the card, /health): no filesystem path.
"""

from __future__ import annotations

import errno
import os
import re
from dataclasses import dataclass
from pathlib import Path

from vllm_srun.adapters.serving.served import ServedModel
from vllm_srun.domain.errors import DomainError, without_paths

TRANSIENT_ERRNOS = frozenset(
    {errno.EIO, errno.EAGAIN, errno.EBUSY, errno.ETXTBSY, errno.ESTALE, errno.EINTR, errno.ENFILE, errno.EMFILE}
)
# what torch and the GPU runtimes say when a device has no memory left or is taken
_DEVICE_BUSY = re.compile(r"out of memory|busy or unavailable|device or resource busy|resource busy", re.IGNORECASE)
_MAX_FILES = 10_000  # a snapshot lists at most this many files (a package is a few dozen)


@dataclass(frozen=True)
class PackageSnapshot:
    """A package folder's files as (relative path, size, modification time in ns), read without
    opening any of them; a file that cannot be read is listed with size -1."""

    files: frozenset[tuple[str, int, int]]

    @classmethod
    def of(cls, folder: Path | None) -> PackageSnapshot:
        if folder is None:
            return cls(frozenset())
        listed: set[tuple[str, int, int]] = set()
        try:
            for root, _dirs, names in os.walk(folder, followlinks=False):
                for name in names:
                    path = os.path.join(root, name)
                    relative = os.path.relpath(path, folder)
                    try:
                        found = os.stat(path)  # follows a Hub snapshot's links to its blobs
                        listed.add((relative, found.st_size, found.st_mtime_ns))
                    except OSError:
                        listed.add((relative, -1, 0))
                    if len(listed) >= _MAX_FILES:
                        return cls(frozenset(listed))
        except OSError:
            pass
        return cls(frozenset(listed))


def transient_cause(exc: BaseException, changed: bool = False) -> str | None:
    """Why EXC (raised while a model loaded) is worth another attempt, or None when it is final.
    CHANGED: the package's files changed during the attempt (`PackageSnapshot`)."""
    if changed:
        return "the package changed while it was read (a file still being written?)"
    seen: set[int] = set()
    current: BaseException | None = exc
    while current is not None and id(current) not in seen:
        seen.add(id(current))
        if isinstance(current, DomainError):
            return None  # the package or the settings: final
        why = _own_cause(current)
        if why is not None:
            return why
        current = current.__cause__
    return None


def _own_cause(exc: BaseException) -> str | None:
    if isinstance(exc, MemoryError):
        return "the host is out of memory"
    if type(exc).__name__ == "OutOfMemoryError":  # torch.cuda.OutOfMemoryError (and MPS's), without importing torch
        return "the device is out of memory"
    if isinstance(exc, OSError) and exc.errno in TRANSIENT_ERRNOS:
        return f"the filesystem said {errno.errorcode.get(exc.errno, exc.errno)}"
    if isinstance(exc, RuntimeError) and _DEVICE_BUSY.search(str(exc)):
        return "the device is busy or out of memory"
    return None


def public_reason(exc: BaseException, served: ServedModel) -> str:
    """Why a model failed, as clients see it (the card, /health, 503 bodies): the model's name
    for its folder and no other filesystem path; the log keeps the full text (R-API-9)."""
    text = f"{type(exc).__name__}: {exc}"
    places = {str(served.folder) if served.folder else "", served.artifact} - {"", served.name}
    for place in sorted(places, key=len, reverse=True):  # the longest first: one may hold the other
        if "/" in place:
            text = text.replace(place.rstrip("/"), served.name)
    return without_paths(text)[:500]
