"""Test hosts: network namespaces joined to the root namespace by veth pairs (issue 14).

Each host is a namespace with one veth end inside (`ADDRESS/30`) and the other end in the root
namespace (the `/30`'s other address), so the root namespace reaches it directly and nothing
else does. Names carry this process's pid, so parallel sessions never collide, and leftovers of
a run that was killed (its pid gone) are removed before new hosts are made. The /30s come from
10.231.0.0/16 and are checked against every route and address already on the machine; traffic
of the tests goes only to these addresses.

`namespace_hosts(n)` is a context manager: it removes its links and namespaces on the way out,
whatever happened inside (processes started with `Host.popen` are killed first).
"""

from __future__ import annotations

import ipaddress
import os
import re
import signal
import subprocess
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass, field
from typing import Any

PREFIX = "vsrt"  # namespace names: vsrt-PID-N; veth ends: vsrtPIDNo (root side), vsrtPIDNi
POOL = ipaddress.ip_network("10.231.0.0/16")


class NamespacesUnavailable(RuntimeError):
    """This process cannot create network namespaces (not root, or no `ip`)."""


def ip(*args: str, netns: str | None = None, check: bool = True) -> subprocess.CompletedProcess[str]:
    command = ["ip", *(["netns", "exec", netns, "ip"] if netns else []), *args]
    done = subprocess.run(command, capture_output=True, text=True, timeout=20)
    if check and done.returncode != 0:
        raise RuntimeError(f"{' '.join(command)}: {done.stderr.strip()}")
    return done


@dataclass
class Host:
    name: str  # the namespace
    outer: str  # the veth end in the root namespace
    inner: str  # the veth end in the namespace
    address: str  # the namespace's address
    gateway: str  # the root namespace's address on the link
    processes: list[subprocess.Popen[bytes]] = field(default_factory=list)

    def popen(self, command: list[str], **kwargs: Any) -> subprocess.Popen[bytes]:
        """Start a command inside the namespace (its own session; killed when the host goes)."""
        proc = subprocess.Popen(["ip", "netns", "exec", self.name, *command], start_new_session=True, **kwargs)
        self.processes.append(proc)
        return proc

    def link(self, up: bool) -> None:
        """Take the namespace's end of the link down (the host vanishes from the network) or up."""
        ip("link", "set", "dev", self.inner, "up" if up else "down", netns=self.name)

    def stop_processes(self) -> None:
        for proc in self.processes:
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGTERM)
        for proc in self.processes:
            try:
                proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()

    def remove(self) -> None:
        self.stop_processes()
        ip("link", "del", self.outer, check=False)  # takes its peer with it
        ip("netns", "del", self.name, check=False)


def can_create_namespaces() -> str | None:
    """None when namespaces can be made here, else why not (the reason a test skips with)."""
    if os.geteuid() != 0:
        return "creating network namespaces needs root (CI runs as root)"
    probe = f"{PREFIX}-{os.getpid()}-probe"
    try:
        ip("netns", "add", probe)
    except FileNotFoundError:
        return "the `ip` command (iproute2) is not installed: apt-get install -y iproute2"
    except RuntimeError as exc:
        return f"cannot create a network namespace: {exc}"
    ip("netns", "del", probe, check=False)
    return None


def remove_leftovers() -> None:
    """Namespaces and links of earlier runs whose process is gone."""
    listed = ip("netns", "list", check=False).stdout
    for name in re.findall(rf"^({PREFIX}-(\d+)-\S+)", listed, flags=re.MULTILINE):
        if not _alive(int(name[1])):
            ip("netns", "del", name[0], check=False)
    links = ip("-o", "link", "show", check=False).stdout
    for name, pid in re.findall(rf"\d+: ({PREFIX}(\d+)[0-9]o)[@:]", links):
        if not _alive(int(pid)):
            ip("link", "del", name, check=False)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _free_subnets(count: int) -> list[ipaddress.IPv4Network]:
    """`count` /30s of POOL that overlap no address or route on this machine."""
    taken: list[ipaddress.IPv4Network] = []
    for line in ip("-4", "-o", "addr", "show", check=False).stdout.splitlines():
        found = re.search(r"inet (\S+)", line)
        if found:
            taken.append(ipaddress.IPv4Interface(found[1]).network)
    for line in ip("-4", "route", "show", "table", "all", check=False).stdout.splitlines():
        target = line.split()[0] if line.split() else ""
        if target and target not in ("default", "broadcast", "local", "unreachable"):
            try:
                taken.append(ipaddress.IPv4Network(target if "/" in target else f"{target}/32", strict=False))
            except ValueError:
                continue
    start = (os.getpid() * 7919) % (POOL.num_addresses // 4)  # spread parallel sessions
    subnets = list(POOL.subnets(new_prefix=30))
    chosen: list[ipaddress.IPv4Network] = []
    for offset in range(len(subnets)):
        candidate = subnets[(start + offset) % len(subnets)]
        if not any(candidate.overlaps(net) for net in taken):
            chosen.append(candidate)
            if len(chosen) == count:
                return chosen
    raise RuntimeError(f"no free /30 left in {POOL}")


@contextmanager
def namespace_hosts(count: int) -> Iterator[list[Host]]:
    """`count` namespaces, each reachable from the root namespace at `Host.address`."""
    remove_leftovers()
    pid = os.getpid()
    with ExitStack() as cleanup:
        hosts = []
        for n, subnet in enumerate(_free_subnets(count)):
            gateway, address = (str(a) for a in list(subnet.hosts())[:2])
            host = Host(f"{PREFIX}-{pid}-{n}", f"{PREFIX}{pid}{n}o", f"{PREFIX}{pid}{n}i", address, gateway)
            cleanup.callback(host.remove)
            ip("netns", "add", host.name)
            ip("link", "add", host.outer, "type", "veth", "peer", "name", host.inner)
            ip("link", "set", host.inner, "netns", host.name)
            ip("addr", "add", f"{gateway}/30", "dev", host.outer)
            ip("link", "set", host.outer, "up")
            ip("addr", "add", f"{address}/30", "dev", host.inner, netns=host.name)
            ip("link", "set", "lo", "up", netns=host.name)
            ip("link", "set", host.inner, "up", netns=host.name)
            hosts.append(host)
        yield hosts
