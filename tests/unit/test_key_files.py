"""Key files and tokens on disk (`adapters/config/api_keys.py`), the listener refusals and TLS
files (`adapters/http/listeners.py`), R-AUTH-1, R-AUTH-3, R-AUTH-4."""

from __future__ import annotations

import hashlib
import os
import threading
from pathlib import Path

import pytest

from vllm_srun.adapters.config.api_keys import KeyFile, add_key, read_key_file, read_token
from vllm_srun.adapters.http.listeners import TlsFiles, is_loopback, open_to_anyone, tls_files
from vllm_srun.domain.security.api_keys import KeyFileError


class Clock:
    now = 0.0

    def __call__(self) -> float:
        return self.now


def test_add_key_creates_0600_appends_and_returns_a_fresh_key(tmp_path: Path) -> None:
    file = tmp_path / "keys"
    first = add_key(str(file), "acme")
    assert os.stat(file).st_mode & 0o777 == 0o600
    file.write_text(file.read_text().rstrip("\n"))  # a file edited by hand, without the last newline
    second = add_key(str(file), "beta")
    table = read_key_file(str(file))
    assert table.tenant_of(first) == "acme" and table.tenant_of(second) == "beta"
    assert first.startswith("srk-") and first != second
    assert first not in file.read_text() and hashlib.sha256(first.encode()).hexdigest() in file.read_text()


def test_add_key_writes_the_tenant_policy_and_refuses_a_contradiction(tmp_path: Path) -> None:
    file = tmp_path / "keys"
    first = add_key(str(file), "acme", policy=(2.5, None, 1000.0))
    add_key(str(file), "acme")  # the tenant's other line keeps its policy
    add_key(str(file), "beta", policy=(None, 4096, None))
    lines = file.read_text().splitlines()
    assert lines[0].split()[2:] == ["2.5", "-", "1000"] and lines[1].split()[2:] == []
    assert lines[2].split()[2:] == ["-", "4096"]
    table = read_key_file(str(file)).tenants
    assert table.policy("acme").weight == 2.5 and table.policy("acme").tokens_per_s == 1000.0
    assert table.policy("beta").max_queued_tokens == 4096
    before = file.read_text()
    with pytest.raises(ValueError, match="weight 3 differs"):
        add_key(str(file), "acme", policy=(3.0, None, None))
    assert file.read_text() == before and first


def test_add_key_never_appends_to_a_broken_file_or_for_a_bad_tenant(tmp_path: Path) -> None:
    file = tmp_path / "keys"
    file.write_text("acme not-a-digest\n")
    with pytest.raises(KeyFileError, match=":1: the second field"):
        add_key(str(file), "acme")
    assert file.read_text() == "acme not-a-digest\n"
    with pytest.raises(ValueError, match="tenant 'a b'"):
        add_key(str(tmp_path / "other"), "a b")


def test_concurrent_adds_all_land(tmp_path: Path) -> None:
    file = str(tmp_path / "keys")
    keys: list[str] = []
    threads = [threading.Thread(target=lambda: keys.append(add_key(file, "t"))) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    table = read_key_file(file)
    assert len(table) == 8 and all(table.tenant_of(k) == "t" for k in keys)


def test_an_empty_or_missing_file_refuses_the_start(tmp_path: Path) -> None:
    (tmp_path / "empty").write_text("# nothing yet\n")
    with pytest.raises(KeyFileError, match="no keys"):
        read_key_file(str(tmp_path / "empty"))
    with pytest.raises(KeyFileError, match=r"--api-key-file .*missing: No such file"):
        read_key_file(str(tmp_path / "missing"))


def test_a_running_server_reads_the_file_again_and_keeps_the_last_good_keys(tmp_path: Path) -> None:
    file = tmp_path / "keys"
    old = add_key(str(file), "acme")
    clock = Clock()
    keys = KeyFile(str(file), clock=clock)
    new = add_key(str(file), "beta")
    assert keys.table().tenant_of(new) is None  # looked at most once a second
    clock.now += 1.0
    assert keys.table().tenant_of(new) == "beta"
    file.write_text(file.read_text() + "broken line\n")
    clock.now += 1.0
    assert keys.table().tenant_of(old) == "acme"  # the change did not parse: the keys read before stay
    file.write_text(f"beta {hashlib.sha256(new.encode()).hexdigest()}\n")  # revoke acme's key
    clock.now += 1.0
    assert keys.table().tenant_of(old) is None and keys.table().tenant_of(new) == "beta"


def test_tokens_come_from_a_file_or_the_environment_never_echoed(tmp_path: Path) -> None:
    token = "t0ken-" + "x" * 20
    (tmp_path / "token").write_text(token + "\n")
    assert read_token(file=str(tmp_path / "token")) == token
    assert read_token(env="TOKEN", environ={"TOKEN": token}) == token
    with pytest.raises(ValueError, match="TOKEN is not set"):
        read_token(env="TOKEN", environ={})
    for bad in ("short", "has a space in it somewhere"):
        with pytest.raises(ValueError) as refused:
            read_token(env="TOKEN", environ={"TOKEN": bad})
        assert bad not in str(refused.value)


@pytest.mark.parametrize(
    ("host", "loopback"),
    [("127.0.0.1", True), ("127.3.2.1", True), ("::1", True), ("localhost", True), ("0.0.0.0", False),
     ("::", False), ("10.0.0.7", False), ("worker.example", False)],
)  # fmt: skip
def test_only_loopback_listeners_may_ask_no_key(host: str, loopback: bool) -> None:
    assert is_loopback(host) is loopback
    refusal = open_to_anyone(host, None, keys_asked=False, allowed=False)
    assert (refusal is None) is loopback
    assert open_to_anyone(host, None, keys_asked=True, allowed=False) is None
    assert open_to_anyone(host, None, keys_asked=False, allowed=True) is None
    assert open_to_anyone(host, "/tmp/w.sock", keys_asked=False, allowed=False) is None


def test_tls_files_are_checked_at_start(tmp_path: Path) -> None:
    assert tls_files(None, None) is None
    with pytest.raises(ValueError, match="--ssl-keyfile needs --ssl-certfile"):
        tls_files(None, "key.pem")
    (tmp_path / "cert.pem").write_text("not a certificate")
    with pytest.raises(ValueError, match="--ssl-certfile"):
        TlsFiles(str(tmp_path / "cert.pem")).check()
    from tests.tls_certs import make_pki

    pki = make_pki(tmp_path / "pki")
    files = tls_files(str(pki.cert), str(pki.key))
    assert files is not None and files.uvicorn_options() == {"ssl_certfile": str(pki.cert), "ssl_keyfile": str(pki.key)}
    with pytest.raises(ValueError, match="holds no PEM private key"):
        tls_files(str(pki.cert), str(pki.other_ca))  # a certificate, not a key


def test_what_is_wrong_with_tls_files_is_said_in_words(tmp_path: Path) -> None:
    from tests.tls_certs import make_pki

    pki = make_pki(tmp_path / "pki")
    cases = {
        (str(pki.cert), None): "holds a certificate but no private key: name the key with --ssl-keyfile",
        (str(pki.key), None): "holds no PEM certificate",
        (str(tmp_path / "missing.pem"), None): "No such file or directory",
        (str(pki.cert), str(tmp_path / "missing.key")): "No such file or directory",
    }
    other_key = tmp_path / "pki" / "other-ca.key"  # a key, of another certificate
    cases[(str(pki.cert), str(other_key))] = "does not belong to the certificate"
    for (cert, key), words in cases.items():
        with pytest.raises(ValueError, match=words) as caught:
            tls_files(cert, key)
        assert "PEM lib" not in str(caught.value) and "\n" not in str(caught.value)
