"""Listening sockets of the worker and the front: Unix sockets that only their user can reach,
stale ones cleaned at start and removed at exit, and enough file descriptors for the
connection cap (R-API-9; docs/hardening.md). TLS on a TCP listener (`TlsFiles`, R-AUTH-4), and
the one refusal of a listener anyone may reach with no key asked for (`open_to_anyone`, R-AUTH-3).
"""

from __future__ import annotations

import contextlib
import errno
import ipaddress
import logging
import os
import socket
import ssl
import stat
from dataclasses import dataclass
from typing import Any

log = logging.getLogger("vllm_srun.listeners")
DESCRIPTOR_HEADROOM = 256  # beyond the connection cap: worker sockets, model files, logs, pipes


@dataclass(frozen=True)
class Listener:
    """A bound socket (uvicorn listens on it) and where it is, for the log."""

    sock: socket.socket
    where: str
    path: str | None = None  # a Unix socket's file
    identity: tuple[int, int, int] = (0, 0, 0)  # its device, inode and change time: inodes are reused

    def remove(self) -> None:
        """Remove a Unix socket's file if it is still this listener's (not a newer server's)."""
        if self.path is None:
            return
        with contextlib.suppress(OSError):
            if _identity(self.path) == self.identity:
                os.unlink(self.path)


@dataclass(frozen=True)
class TlsFiles:
    """A server certificate (PEM, with its chain) and its private key (in the same file when
    `keyfile` is None), for uvicorn's `ssl_certfile`/`ssl_keyfile`."""

    certfile: str
    keyfile: str | None = None

    def check(self) -> None:
        """Load them once, so a bad file refuses the start (ValueError, one line saying what is
        missing or wrong, never key bytes)."""
        context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        try:
            context.load_cert_chain(self.certfile, self.keyfile)
        except OSError as exc:
            raise ValueError(self._diagnosis(exc)) from None

    def _diagnosis(self, exc: OSError) -> str:
        """What is wrong with the files, in words (OpenSSL says "[SSL] PEM lib" for most of it)."""
        cert_flag = f"--ssl-certfile {self.certfile}"
        key_flag = f"--ssl-keyfile {self.keyfile}" if self.keyfile is not None else cert_flag
        if exc.strerror and not isinstance(exc, ssl.SSLError):  # unreadable: no such file, no permission
            return f"{cert_flag}{'' if self.keyfile is None else f' / --ssl-keyfile {self.keyfile}'}: {exc.strerror}"
        cert, key = _read_pem(self.certfile), _read_pem(self.keyfile) if self.keyfile is not None else None
        if cert is not None and b"-----BEGIN CERTIFICATE-----" not in cert:
            return f"{cert_flag} holds no PEM certificate (-----BEGIN CERTIFICATE-----)"
        key_text = cert if self.keyfile is None else key
        if key_text is not None and b"PRIVATE KEY-----" not in key_text:
            if self.keyfile is None:
                return f"{cert_flag} holds a certificate but no private key: name the key with --ssl-keyfile"
            return f"{key_flag} holds no PEM private key (-----BEGIN PRIVATE KEY-----)"
        if key_text is not None and b"ENCRYPTED" in key_text:
            return f"{key_flag}: the private key is encrypted (a key with a passphrase cannot be read at start)"
        reason = getattr(exc, "reason", None)
        if reason == "KEY_VALUES_MISMATCH":
            return f"{key_flag}: the private key does not belong to the certificate of {cert_flag}"
        text = exc.strerror or (str(exc.args[-1]) if exc.args else type(exc).__name__)
        return f"{cert_flag}{'' if self.keyfile is None else f' / --ssl-keyfile {self.keyfile}'}: {text}"

    def uvicorn_options(self) -> dict[str, Any]:
        return {"ssl_certfile": self.certfile, "ssl_keyfile": self.keyfile}


def _read_pem(path: str) -> bytes | None:
    try:
        with open(path, "rb") as f:
            return f.read(1 << 20)
    except OSError:
        return None


def tls_files(certfile: str | None, keyfile: str | None) -> TlsFiles | None:
    """`--ssl-certfile`/`--ssl-keyfile` as TlsFiles (checked), None without them; a key without
    a certificate is refused (ValueError, one line)."""
    if certfile is None:
        if keyfile is not None:
            raise ValueError("--ssl-keyfile needs --ssl-certfile")
        return None
    files = TlsFiles(certfile, keyfile)
    files.check()
    return files


def is_loopback(host: str) -> bool:
    """Whether HOST is reachable only from this machine (`localhost`, 127.0.0.0/8, ::1)."""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False  # a name: it may resolve to anything


def open_to_anyone(host: str, uds: str | None, keys_asked: bool, allowed: bool) -> str | None:
    """The refusal (one line) of a TCP listener beyond loopback that asks no key, unless
    `--allow-unauthenticated` (ALLOWED); None when the listener may start."""
    if uds or keys_asked or allowed or is_loopback(host):
        return None
    return (
        f"--host {host} is reachable from other machines and no key is asked for: "
        "give --api-key-file FILE (or an internal token), or --allow-unauthenticated"
    )


def open_listener(host: str, port: int, uds: str | None, tls: TlsFiles | None = None) -> Listener:
    """The worker's socket: `--uds` when given, else TCP on `--host`/`--port`."""
    if uds:
        return bind_unix(uds)
    sock = bind_tcp(host, port)
    scheme = "https" if tls is not None else "http"
    return Listener(sock, f"{scheme}://[{host}]:{port}" if ":" in host else f"{scheme}://{host}:{port}")


def bind_tcp(host: str, port: int) -> socket.socket:
    """A TCP socket bound to HOST:PORT; ValueError (one line) when that is not possible."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind((host, port))
    except OSError as exc:
        sock.close()
        raise ValueError(f"--host {host} --port {port}: {exc.strerror or exc}") from None
    sock.set_inheritable(False)
    return sock


def bind_unix(path: str) -> Listener:
    """A Unix socket at PATH, mode 0600, ready to listen. A socket file left by a server that is gone
    is removed first; anything else at PATH (a live server, a regular file) is refused
    (ValueError, one line)."""
    _clear_stale(path)
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    old_mask = os.umask(0o177)  # the file is created 0600: no window in which others may connect
    try:
        sock.bind(path)
    except OSError as exc:
        sock.close()
        raise ValueError(f"--uds {path}: {exc.strerror or exc}") from None
    finally:
        os.umask(old_mask)
    os.chmod(path, 0o600)
    sock.set_inheritable(False)
    return Listener(sock, f"unix:{path}", path, _identity(path))


def _identity(path: str) -> tuple[int, int, int]:
    info = os.lstat(path)
    return info.st_dev, info.st_ino, info.st_ctime_ns


def _clear_stale(path: str) -> None:
    try:
        mode = os.lstat(path).st_mode
    except FileNotFoundError:
        return
    except OSError as exc:
        raise ValueError(f"--uds {path}: {exc.strerror or exc}") from None
    if not stat.S_ISSOCK(mode):
        raise ValueError(f"--uds {path}: the path exists and is not a socket")
    probe = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        probe.connect(path)
    except OSError as exc:
        if exc.errno not in (errno.ECONNREFUSED, errno.ENOENT):
            raise ValueError(f"--uds {path}: {exc.strerror or exc}") from None
        log.info("removing the stale socket %s (no server listens on it)", path)
        with contextlib.suppress(FileNotFoundError):
            os.unlink(path)
    else:
        raise ValueError(f"--uds {path}: another server is listening on it")
    finally:
        probe.close()


def ensure_descriptors(max_connections: int, explicit: bool) -> tuple[int, str | None]:
    """Raise the soft RLIMIT_NOFILE so MAX_CONNECTIONS (+ headroom) fit. Returns the cap to use
    and a warning; a cap the user set that cannot fit raises ValueError (one line)."""
    try:
        import resource
    except ImportError:  # pragma: no cover - not POSIX
        return max_connections, None
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    needed = max_connections + DESCRIPTOR_HEADROOM
    if soft == resource.RLIM_INFINITY or soft >= needed:
        return max_connections, None
    target = needed if hard == resource.RLIM_INFINITY else min(needed, hard)
    with contextlib.suppress(ValueError, OSError):
        resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))
        soft = target
    if soft >= needed:
        return max_connections, None
    fits = max(1, soft - DESCRIPTOR_HEADROOM)
    message = (
        f"--max-connections {max_connections} needs {needed} file descriptors; "
        f"the limit is {soft} (ulimit -n): lower --max-connections or raise the limit"
    )
    if explicit:
        raise ValueError(message)
    return fits, f"{message}; serving at most {fits} connections"
