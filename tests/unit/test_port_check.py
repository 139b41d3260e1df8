"""The host-side busy-port check (roles/hostctl.py, issue 16 item 17): a port held on IPv6 only
is busy too (TF servers bind [::], dual stack). Real sockets on loopback, nothing else."""
from __future__ import annotations

import socket
from contextlib import closing

import pytest

from roles import hostctl


def listener(family: int, address: str, *, v6only: bool = False) -> socket.socket:
    sock = socket.socket(family, socket.SOCK_STREAM)
    if v6only:
        sock.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 1)
    sock.bind((address, 0))
    sock.listen(1)
    return sock


def busy(port: int) -> list[dict]:
    return hostctl.op_facts({"ports": [port]})["busy_ports"]


@pytest.mark.parametrize("family, address, v6only, shown", [
    (socket.AF_INET6, "::1", True, "IPv6"),          # missed before: 0.0.0.0 binds fine beside it
    (socket.AF_INET6, "::", True, "IPv6"),           # an IPv6-only wildcard listener: missed before
    (socket.AF_INET, "127.0.0.1", False, "IPv4"),
    (socket.AF_INET, "0.0.0.0", False, "IPv4"),
])
def test_a_held_port_is_busy_whatever_the_family(family, address, v6only, shown):
    if family == socket.AF_INET6 and not socket.has_ipv6:
        pytest.skip("no IPv6 on this machine")
    with closing(listener(family, address, v6only=v6only)) as sock:
        port = sock.getsockname()[1]
        assert busy(port) == [{"port": port, "error": f"Address already in use (on {shown})"}]


def test_a_free_port_is_free():
    with closing(listener(socket.AF_INET, "127.0.0.1")) as sock:
        port = sock.getsockname()[1]
    assert busy(port) == []


def test_connect_names_only_the_failures_when_asked_and_counts_the_rest():
    """The reach check's connects (issue 46): with ``failed_only`` the "ok"s are counted, not listed."""
    with closing(listener(socket.AF_INET, "127.0.0.1")) as one, closing(listener(socket.AF_INET, "127.0.0.1")) as two:
        free = listener(socket.AF_INET, "127.0.0.1")
        closed = free.getsockname()[1]
        free.close()                 # nothing listens there now: refused
        targets = [["127.0.0.1", one.getsockname()[1]], ["127.0.0.1", two.getsockname()[1]], ["127.0.0.1", closed]]
        every = hostctl.op_connect({"targets": targets, "timeout": 5})["results"]
        assert sorted(every.values()) == ["ok", "ok", "refused"]
        assert hostctl.op_connect({"targets": targets, "timeout": 5, "failed_only": True}) == \
            {"results": {f"127.0.0.1:{closed}": "refused"}, "ok": 2}


def test_connect_skips_the_hosts_own_ports():
    """Every host gets one list of every port and skips its own (issue 46: a list per host cost
    the control process N² to encode)."""
    with closing(listener(socket.AF_INET, "127.0.0.1")) as mine, closing(listener(socket.AF_INET, "127.0.0.1")) as peer:
        own, other = ["127.0.0.1", mine.getsockname()[1]], ["127.0.0.1", peer.getsockname()[1]]
        answer = hostctl.op_connect({"targets": [own, other], "skip": [own], "timeout": 5})
        assert answer == {"results": {f"127.0.0.1:{other[1]}": "ok"}}
