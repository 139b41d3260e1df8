"""Host firewalls for a cluster (``up --firewall`` or ``pscluster_firewall: true``).

TensorFlow's gRPC servers listen on every interface, have no authentication and run any graph
they are sent. Before any server starts, each host gets an nftables table of pscluster's own,
``inet pscluster_<name>_<hash>``, whose input chain accepts the cluster's TF ports only from:

* loopback (the host's own tasks, and the control machine when it is that host);
* every address of every member host: all A and AAAA results, resolved on the host itself and
  on the control machine (a member name that resolves nowhere fails ``up`` with its name);
* the control machine, as the source address it really probes from: the address its kernel
  picks to reach that host (a route lookup, no packet sent). Not ``SSH_CONNECTION``, which
  names the operator's laptop, a NAT or a bastion host, and would let all of those in.

Everyone else is dropped on those ports. Nothing else on the host is touched. Each host's table
is recorded in the cluster state *before* it is applied, so a failed ``up``, ``down`` and the
next ``up`` over a failed state remove exactly the tables that state records. Needs root or
passwordless sudo and ``nft`` on each host (checked by preflight).
"""
from __future__ import annotations

import hashlib
import ipaddress
import queue
import re
import socket
import threading
import time
from dataclasses import dataclass
from typing import Mapping, Sequence

from . import hostops
from ..errors import Aborted, Failure, HostError, MultiHostError, PsclusterError
from ..events import Reporter
from ..fanout import fan_out
from ..plan import ClusterPlan, HostSpec
from ..state import RunState
from ..transport import TransportPool


def table_name(cluster: str) -> str:
    """``pscluster_<readable prefix>_<12 hex digits of sha256(exact name)>``.

    The prefix alone would map ``exp-a``, ``exp.a`` and ``exp a`` (and long names that differ
    after the cut) to one table, so one cluster would replace, and its ``down`` delete, another's.
    """
    digest = hashlib.sha256(cluster.encode("utf-8", "surrogatepass")).hexdigest()[:12]
    return f"pscluster_{re.sub(r'[^A-Za-z0-9_]', '_', cluster)[:32]}_{digest}"


def _literal(address: str) -> str | None:
    try:
        return str(ipaddress.ip_address(address.strip("[]").split("%")[0]))
    except ValueError:
        return None


RESOLVE_SECONDS = 5.0      # a name the resolver has not answered by then is unresolved (item 12)


def resolve(address: str, *, timeout: float = RESOLVE_SECONDS) -> list[str]:
    """Every IP address of a host name on this machine (an IP stays itself). Unresolvable, or
    no answer within ``timeout``: []."""
    return resolve_many([address], timeout=timeout)[address]


def resolve_many(names: Sequence[str], *, timeout: float = RESOLVE_SECONDS) -> dict[str, list[str]]:
    """:func:`resolve` for many names at once, in daemon threads (at most 32), all within
    ``timeout``: getaddrinfo has no timeout of its own, and a dead DNS server stalled ``up``
    and ``plan --firewall`` for minutes; a thread still waiting on it never holds up the exit."""
    result: dict[str, list[str]] = {}
    pending = []
    for name in dict.fromkeys(names):
        literal = _literal(name)
        if literal is not None:
            result[name] = [literal]
        else:
            pending.append(name)
    if not pending:
        return result
    work: queue.Queue[str] = queue.Queue()
    for name in pending:
        work.put(name)
    answers: dict[str, list[str]] = {}
    lock = threading.Lock()

    def worker() -> None:
        while True:
            try:
                name = work.get_nowait()
            except queue.Empty:
                return
            try:
                infos = socket.getaddrinfo(name, None, proto=socket.IPPROTO_TCP)
                found = sorted({str(info[4][0]).split("%")[0] for info in infos})
            except (socket.gaierror, UnicodeError, OSError):
                found = []
            with lock:
                answers[name] = found

    threads = [threading.Thread(target=worker, name="resolve", daemon=True) for _ in range(min(32, len(pending)))]
    for thread in threads:
        thread.start()
    deadline = time.monotonic() + timeout
    for thread in threads:
        thread.join(max(0.0, deadline - time.monotonic()))
    with lock:
        result.update({name: answers.get(name, []) for name in pending})
    return result


def control_source(host: HostSpec) -> tuple[str, ...]:
    """The address(es) this machine sends from to reach ``host`` (a UDP connect: a route
    lookup, nothing is sent). Empty for a local host, whose probes arrive on loopback."""
    if host.is_local:
        return ()
    found = set()
    for address in resolve(host.address):
        family = socket.AF_INET6 if ":" in address else socket.AF_INET
        try:
            with socket.socket(family, socket.SOCK_DGRAM) as sock:
                sock.connect((address, 9))
                found.add(str(sock.getsockname()[0]).split("%")[0])
        except OSError:
            continue     # no route from here: the probe cannot reach it either
    return tuple(sorted(found, key=_order))


def _order(address: str) -> tuple[bool, str]:
    return ":" in address, address


@dataclass(frozen=True)
class Source:
    """One address a host's table accepts on the TF ports, and why."""

    address: str
    why: str


def _safe(text: str) -> str:
    """Data that goes into a ruleset comment: never anything nft could read as syntax."""
    return re.sub(r"[^A-Za-z0-9._:@-]", "?", text)[:80]


def member_sources(plan: ClusterPlan, resolved: Mapping[str, Sequence[str]],
                   interfaces: Mapping[str, Sequence[str]] | None = None) -> tuple[list[Source], list[str]]:
    """Every address of every member host (``resolved``: member address -> its addresses;
    ``interfaces``: host name -> the addresses of its own interfaces, for a multi-homed member
    that connects from one no name resolves to).

    Returns the sources and the member addresses that resolved to nothing (pure).
    """
    sources: dict[str, Source] = {}
    missing = []
    for host in plan.hosts:
        addresses = [a for a in (_literal(a) for a in resolved.get(host.address, ())) if a]
        if not addresses:
            missing.append(host.address)
        for address in addresses:
            sources.setdefault(address, Source(address, f"member {_safe(host.name)} ({_safe(host.address)})"))
        for address in [a for a in (_literal(a) for a in (interfaces or {}).get(host.name, ())) if a]:
            sources.setdefault(address, Source(address, f"member {_safe(host.name)} (an address of its interfaces)"))
    return sorted(sources.values(), key=lambda s: _order(s.address)), missing


def control_sources(control: Sequence[str], host: str) -> list[Source]:
    return [Source(a, f"control machine (its source address toward {_safe(host)})")
            for a in (_literal(a) for a in control) if a]


def resolved_here(plan: ClusterPlan) -> dict[str, list[str]]:
    """Member addresses as this machine resolves them (``plan --firewall``, and part of ``up``)."""
    return resolve_many([host.address for host in plan.hosts])


def ruleset_for(plan: ClusterPlan, host: str, *, sources: Sequence[Source] | None = None) -> str:
    """The nftables ruleset for one host (pure, given the accepted sources).

    Without ``sources``: the members as this machine resolves them and this machine's source
    address toward ``host`` (what ``plan --firewall`` shows; ``up`` adds each host's own view).
    """
    unresolved: list[str] = []
    if sources is None:
        members, unresolved = member_sources(plan, resolved_here(plan))
        sources = members + control_sources(control_source(plan.host(host)), host)
    merged: dict[str, list[str]] = {}
    for source in sources:
        merged.setdefault(source.address, []).append(source.why)
    ports = sorted({task.port for task in plan.tasks if task.host == host})
    v4 = [a for a in sorted(merged, key=_order) if ":" not in a]
    v6 = [a for a in sorted(merged, key=_order) if ":" in a]
    table = table_name(plan.name)
    port_set = ", ".join(map(str, ports)) or "0"
    local = any(h.name == host and h.is_local for h in plan.hosts)
    lines = [f"# pscluster firewall on {_safe(host)}: TF ports {port_set} accepted from:",
             "#   loopback: this host's own processes" + (" and the control machine (it is this host)" if local else "")]
    lines += [f"#   {address}: {'; '.join(dict.fromkeys(merged[address]))}" for address in v4 + v6]
    lines += [f"#   not resolvable here: {_safe(name)} (up resolves it on each host, or fails)" for name in unresolved]
    lines += [
        "# and dropped from anyone else",
        f"add table inet {table}",
        f"delete table inet {table}",      # replace an earlier version atomically
        f"table inet {table} {{",
        "  chain input {",
        "    type filter hook input priority filter - 5; policy accept;",
        '    iifname "lo" accept',
    ]
    if v4:
        lines.append(f"    ip saddr {{ {', '.join(v4)} }} tcp dport {{ {port_set} }} accept")
    if v6:
        lines.append(f"    ip6 saddr {{ {', '.join(v6)} }} tcp dport {{ {port_set} }} accept")
    lines += [f"    tcp dport {{ {port_set} }} counter drop", "  }", "}"]
    return "\n".join(lines) + "\n"


def removal_for(table: str) -> str:
    """Delete one table (``add`` first, so a table already gone is not an error)."""
    return f"add table inet {table}\ndelete table inet {table}\n"


def host_sources(plan: ClusterPlan, host: HostSpec, pool: TransportPool, here: Mapping[str, Sequence[str]],
                 interfaces: Mapping[str, Sequence[str]] | None = None) -> list[Source]:
    """What ``host``'s table accepts: members as resolved there and here, and this machine.

    Raises:
        HostError: a member's name resolves to nothing, neither there nor here.
    """
    names = sorted({h.address for h in plan.hosts if _literal(h.address) is None})
    there = hostops.resolve(pool.get(host), names) if names else {}
    resolved = {address: sorted(set(here.get(address, ())) |
                                set(there.get(address, ()) if not isinstance(there.get(address), str) else ()))
                for address in {h.address for h in plan.hosts}}
    members, missing = member_sources(plan, resolved, interfaces)
    if missing:
        why = "; ".join(f"{name}: {there.get(name) or 'no address'}" for name in missing)
        raise HostError(host.name, f"cannot resolve member address(es) {', '.join(missing)} ({why})",
                        hint="every member must resolve on each host and on this machine; use IP addresses "
                             "or fix DNS or /etc/hosts, otherwise members could not reach each other")
    return members + control_sources(control_source(host), host.name)


def install_rules(plan: ClusterPlan, pool: TransportPool, writer, reporter: Reporter) -> None:
    """Install the cluster's table on every host in parallel (the ``up`` firewall hook).

    Each table is recorded in the state *before* it is applied, so rollback and ``down`` remove
    it even when applying was interrupted.

    Raises:
        MultiHostError: a host refused the rules or a member does not resolve (nothing is
            started then; rollback cleans up).
    """
    table = table_name(plan.name)
    reporter.emit("phase", name="firewall", detail=f"nftables table {table} on {len(plan.hosts)} host(s)")
    here = resolved_here(plan)
    # Every member's own interface addresses (item 12: a multi-homed member may connect from an
    # address no name resolves to); a host that cannot say fails below, in its own step.
    interfaces = fan_out(plan.hosts, lambda host: hostops.interface_addresses(pool.get(host)),
                         name="member addresses", catch=PsclusterError).ok

    def one(host) -> list[str]:
        ruleset = ruleset_for(plan, host.name, sources=host_sources(plan, host, pool, here, interfaces))
        writer.change(lambda s: s.firewall.__setitem__(host.name, table))
        tables = hostops.nft_apply(pool.get(host), ruleset)
        if not any(table in line for line in tables):
            raise HostError(host.name, "the firewall table is missing after nft applied it")
        return tables

    result = fan_out(plan.hosts, one, name="firewall installation")
    for name in result.ok:
        reporter.emit("message", text=f"  {name}: firewall installed")
    for error in result.failed.values():
        if isinstance(error, Aborted):
            raise error     # `down` took over: not a firewall failure to roll back
    result.raise_for_failures()
    check_members_reach(plan, pool, reporter)


def check_members_reach(plan: ClusterPlan, pool: TransportPool, reporter: Reporter) -> None:
    """Preflight's host-to-host check again, with the rules in place: preflight ran before them,
    so a member the rules drop (an address of it that no name resolves to, a NAT between two
    hosts) would only show as a training that hangs (item 12 of the first round).

    Raises:
        MultiHostError: each blocked path (nothing started yet; rollback removes the tables).
    """
    from .preflight import check_reach
    hosts = list(plan.hosts)
    if len(hosts) < 2:
        return
    blocked = [result for result in check_reach(plan, pool, hosts) if not result.ok]
    if blocked:
        raise MultiHostError(
            "members cannot reach each other through the firewall just installed",
            [Failure(result.host, HostError(result.host, result.detail, hint=result.hint)) for result in blocked],
            hint="a member connects from an address the rules do not list (another interface, a NAT); "
                 "'pscluster plan --firewall' shows what each host accepts")
    reporter.emit("message", text=f"  members reach each other through the firewall ({len(hosts)} hosts)")


def remove_rules(state: RunState, pool: TransportPool, reporter: Reporter) -> dict[str, PsclusterError]:
    """Delete the cluster's table on every host that has one (``down``); returns per-host errors."""
    hosts = [host for host in state.plan.hosts if host.name in state.firewall]

    def one(host) -> None:
        hostops.nft_apply(pool.get(host), removal_for(state.firewall[host.name]))

    result = fan_out(hosts, one, name="firewall removal")
    for name in result.ok:
        state.firewall.pop(name, None)
        reporter.emit("message", text=f"  {name}: firewall table removed")
    return result.failed
