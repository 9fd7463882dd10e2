"""Certificates made by the tests (R-AUTH-4): a private CA and a server certificate it signs for
127.0.0.1 and localhost, plus a second CA that signed nothing here, as PEM files made with the
`openssl` command (the `cryptography` package is not in the environment)."""

from __future__ import annotations

import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path

import pytest


@dataclass(frozen=True)
class Pki:
    ca: Path  # the CA certificate clients verify with
    cert: Path  # the server's certificate (signed by the CA)
    key: Path  # the server's private key
    other_ca: Path  # a CA that signed nothing here


def _openssl(*args: str | Path, cwd: Path) -> None:
    done = subprocess.run(["openssl", *map(str, args)], cwd=cwd, capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr


def _ca(folder: Path, name: str, common: str) -> None:
    _openssl(
        "req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes",
        "-keyout", f"{name}.key", "-out", f"{name}.pem", "-days", "2", "-subj", f"/CN={common}",
        "-addext", "basicConstraints=critical,CA:TRUE", "-addext", "keyUsage=critical,keyCertSign,cRLSign",
        cwd=folder,
    )  # fmt: skip


def make_pki(folder: Path) -> Pki:
    if shutil.which("openssl") is None:
        pytest.skip("no openssl command to make test certificates")
    folder.mkdir(parents=True, exist_ok=True)
    _ca(folder, "ca", "vllm-srun test CA")
    _ca(folder, "other-ca", "another CA")
    (folder / "server.ext").write_text(
        "subjectAltName=DNS:localhost,IP:127.0.0.1\nextendedKeyUsage=serverAuth\n"
        "basicConstraints=CA:FALSE\nkeyUsage=critical,digitalSignature\n"
    )
    _openssl(
        "req", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes",
        "-keyout", "server.key", "-out", "server.csr", "-subj", "/CN=vllm-srun test server",
        cwd=folder,
    )  # fmt: skip
    _openssl(
        "x509", "-req", "-in", "server.csr", "-CA", "ca.pem", "-CAkey", "ca.key", "-CAcreateserial",
        "-out", "server.pem", "-days", "2", "-extfile", "server.ext",
        cwd=folder,
    )  # fmt: skip
    (folder / "server.key").chmod(0o600)
    return Pki(folder / "ca.pem", folder / "server.pem", folder / "server.key", folder / "other-ca.pem")
