"""Keys and TLS on the command line (R-AUTH-1, R-AUTH-3, R-AUTH-4).

- `vllm-srun key add TENANT --api-key-file FILE`: a new random key for TENANT, printed once,
  alone on stdout, and stored nowhere: the file gets its SHA-256 (a line `TENANT sha256hex`,
  appended; the file is created 0600 when missing). A running worker or front reads the file
  again within a second (`adapters/config/api_keys.py`). A tenant's weight, queue limit and
  token rate are columns the operator adds to one of its lines (docs/security.md).
- the flags of both `serve` commands: `--api-key-file`, `--metrics-need-key`,
  `--allow-unauthenticated`, `--ssl-certfile`, `--ssl-keyfile` (and the worker's
  `--internal-token-file`; else `$VLLM_SRUN_INTERNAL_TOKEN`), made into a `Security` here: the
  key check for the app and the TLS files for the listener, or a one-line refusal. These are the
  process's own door, not serving settings: the front never passes them to its workers, which
  listen on their private Unix sockets.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from vllm_srun.adapters.config.api_keys import TOKEN_ENV, KeyFile, read_key_file, read_token
from vllm_srun.adapters.http.auth import Authenticator
from vllm_srun.adapters.http.listeners import TlsFiles, open_to_anyone, tls_files
from vllm_srun.domain.scheduling.tenants import DEFAULT_TENANTS, TenantTable
from vllm_srun.domain.security.api_keys import KeyFileError


@dataclass(frozen=True)
class Security:
    """What the flags made: the key check (never None: without keys it asks none) and TLS."""

    auth: Authenticator
    tls: TlsFiles | None = None
    tenants: TenantTable = DEFAULT_TENANTS  # the key file's tenant policies, as read at start


def add_security_flags(parser: argparse.ArgumentParser, *, worker: bool) -> None:
    """The key and TLS flags of `vllm-srun serve` (WORKER) or `vllm-sr serve`."""
    parser.add_argument(
        "--api-key-file",
        metavar="FILE",
        default=None,
        help="require 'Authorization: Bearer KEY' with a key of FILE (lines: tenant sha256 [weight] "
        "[max_queued_tokens] [rate]; `vllm-srun key add`) on every route but /health, /health/live "
        "and /metrics (default: no key asked for)",
    )
    parser.add_argument(
        "--metrics-need-key", action="store_true", help="/metrics needs a key too (default: it needs none)"
    )
    parser.add_argument(
        "--allow-unauthenticated",
        action="store_true",
        help="serve on a non-loopback --host without --api-key-file (default: refused)",
    )
    parser.add_argument(
        "--ssl-certfile",
        metavar="FILE",
        default=None,
        help="serve HTTPS with this PEM certificate chain (default: plain HTTP)",
    )
    parser.add_argument(
        "--ssl-keyfile", metavar="FILE", default=None, help="the certificate's private key (default: in --ssl-certfile)"
    )
    if worker:
        parser.add_argument(
            "--internal-token-file",
            metavar="FILE",
            default=None,
            help=f"over TCP, take requests with this token (the front's, naming its tenants) besides the keys "
            f"(default: ${TOKEN_ENV} when set; a token never goes on a command line)",
        )


def security(
    ns: argparse.Namespace, host: str, uds: str | None = None, environ: Mapping[str, str] | None = None
) -> Security:
    """The Security of NS's flags for a listener on HOST (or the Unix socket UDS); ValueError
    (one line) for a file that cannot be used, a non-loopback listener that asks no key (unless
    `--allow-unauthenticated`), or TLS on a Unix socket."""
    keys = None
    if ns.api_key_file is not None:
        try:
            keys = KeyFile(ns.api_key_file)
        except KeyFileError as exc:
            raise ValueError(str(exc)) from None
    token = None
    worker = hasattr(ns, "internal_token_file")  # the front's own listener takes no token
    if worker and uds is None:  # a managed worker's socket is private: the front needs no token there
        if ns.internal_token_file is not None:
            token = read_token(file=ns.internal_token_file)
        elif (environ or {}).get(TOKEN_ENV):
            token = read_token(env=TOKEN_ENV, environ=environ)
    auth = Authenticator(keys.table if keys else None, token, metrics_open=not ns.metrics_need_key)
    refusal = open_to_anyone(host, uds, auth.required, ns.allow_unauthenticated)
    if refusal:
        raise ValueError(refusal)
    if uds is not None and ns.ssl_certfile is not None:
        raise ValueError("--ssl-certfile serves TCP (--host/--port); a --uds socket is private already")
    tenants = keys.table().tenants if keys is not None else DEFAULT_TENANTS
    policies = getattr(ns, "tenant_policies", None)  # a managed worker: the front's key file (R-FAIR-1)
    if policies is not None:
        if keys is not None:
            raise ValueError("--tenant-policies is for a worker behind a front; with --api-key-file it is not needed")
        try:
            tenants = read_key_file(policies, "--tenant-policies").tenants
        except KeyFileError as exc:
            raise ValueError(str(exc)) from None
    return Security(auth, tls_files(ns.ssl_certfile, ns.ssl_keyfile), tenants)


def add_parser(sub: Any) -> None:
    """The `key` command and its `add` subcommand, on SUB (`vllm-srun`'s subparsers)."""
    key = sub.add_parser("key", help="manage API keys (a key file of tenant and key digest lines)")
    actions = key.add_subparsers(dest="key_command", required=True, parser_class=type(key))
    add = actions.add_parser("add", help="print a new random key for TENANT once and append its digest to FILE")
    add.add_argument(
        "tenant", metavar="TENANT", help="the tenant the key's requests count for: letters, digits, . _ - (required)"
    )
    add.add_argument(
        "--api-key-file", required=True, metavar="FILE", help="the key file, created 0600 when missing (required)"
    )
    add.add_argument(
        "--weight",
        type=_positive(float),
        default=None,
        help="the tenant's share of the forwards against other tenants' (default: 1, or its other lines')",
    )
    add.add_argument(
        "--max-queued-tokens",
        type=_positive(int),
        default=None,
        metavar="N",
        help="the most tokens the tenant may have queued per model (default: the model's, or its other lines')",
    )
    add.add_argument(
        "--rate",
        type=_positive(float),
        default=None,
        metavar="TOKENS_PER_S",
        help="the tenant's token rate per second (default: none, or its other lines')",
    )


def _positive(kind: type[float] | type[int]) -> Any:
    def parse(text: str) -> float | int:
        try:
            value = kind(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r} is not {'an integer' if kind is int else 'a number'}") from None
        if not (value > 0 and value < float("inf")):
            raise argparse.ArgumentTypeError(f"{text!r}: above 0 is required")
        return value

    return parse


def run(ns: argparse.Namespace) -> int:
    """Add the key; one line on stdout (the key) or one refusal on stderr (exit status 2)."""
    from vllm_srun.adapters.config.api_keys import add_key

    try:
        key = add_key(ns.api_key_file, ns.tenant, policy=(ns.weight, ns.max_queued_tokens, ns.rate))
    except KeyFileError as exc:
        return _refuse(str(exc))
    except OSError as exc:
        return _refuse(f"--api-key-file {ns.api_key_file}: {exc.strerror or exc}")
    except ValueError as exc:
        return _refuse(str(exc))
    print(key, flush=True)
    return 0


def _refuse(message: str) -> int:
    print(f"vllm-srun: error: {message}", file=sys.stderr, flush=True)
    return 2
