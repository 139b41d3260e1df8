"""Host firewalls for a cluster (``up --firewall`` or ``pscluster_firewall: true``).

TensorFlow's gRPC servers listen on every interface, have no authentication and run any graph
they are sent. Before any server starts, each host gets an nftables table of pscluster's own,
``inet pscluster_<cluster>``, whose input chain accepts the cluster's TF ports only from
loopback, the cluster's member addresses and the control machine (as that host sees it over
SSH, so the readiness probe keeps working), and drops them for everyone else. Nothing else on
the host is touched; ``down`` deletes exactly that table. Needs root or passwordless sudo and
``nft`` on each host (checked by preflight).
"""
from __future__ import annotations

import ipaddress
import re
import socket
from concurrent.futures import ThreadPoolExecutor

from . import hostops
from .errors import Failure, HostError, MultiHostError, PsclusterError
from .events import Reporter
from .plan import ClusterPlan
from .state import RunState
from .transport import TransportPool


def table_name(cluster: str) -> str:
    return "pscluster_" + re.sub(r"[^A-Za-z0-9_]", "_", cluster)[:40]


def resolve(address: str) -> list[str]:
    """IP addresses of a host name (an IP stays itself). Unresolvable names give []."""
    try:
        return [str(ipaddress.ip_address(address.strip("[]")))]
    except ValueError:
        pass
    try:
        infos = socket.getaddrinfo(address, None, proto=socket.IPPROTO_TCP)
    except socket.gaierror:
        return []
    return sorted({info[4][0] for info in infos})


def member_addresses(plan: ClusterPlan) -> list[str]:
    found: set[str] = set()
    for host in plan.hosts:
        found.update(resolve(host.address))
    return sorted(found, key=lambda a: (":" in a, a))


def ruleset_for(plan: ClusterPlan, host: str, *, control: tuple[str, ...] = (),
                members: list[str] | None = None) -> str:
    """The nftables ruleset for one host (pure, given the resolved addresses)."""
    ports = sorted({task.port for task in plan.tasks if task.host == host})
    members = sorted(set((members if members is not None else member_addresses(plan)) + list(control)),
                     key=lambda a: (":" in a, a))
    v4 = [a for a in members if ":" not in a]
    v6 = [a for a in members if ":" in a]
    table = table_name(plan.name)
    port_set = ", ".join(map(str, ports)) or "0"
    lines = [
        f"# pscluster firewall for cluster {plan.name!r} on {host}: TF ports {port_set}",
        f"# accepted from loopback and {', '.join(members) or 'no other address'}; dropped from anyone else",
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


def removal_for(cluster: str) -> str:
    table = table_name(cluster)
    return f"add table inet {table}\ndelete table inet {table}\n"


def install_rules(plan: ClusterPlan, pool: TransportPool, writer, reporter: Reporter) -> None:
    """Install the cluster's table on every host in parallel (the ``up`` firewall hook).

    Each installed table is recorded in the state at once, so rollback and ``down`` remove it.

    Raises:
        MultiHostError: a host refused the rules (nothing is started then; rollback cleans up).
    """
    reporter.emit("phase", name="firewall", detail=f"nftables table {table_name(plan.name)} on "
                                                   f"{len(plan.hosts)} host(s)")
    members = member_addresses(plan)

    def one(host) -> list[str]:
        transport = pool.get(host)
        facts = hostops.facts(transport, ports=[], gpus=False, workdir=None)
        control = tuple(resolve(facts.ssh_client)) if facts.ssh_client else ()
        ruleset = ruleset_for(plan, host.name, control=control, members=members)
        tables = hostops.nft_apply(transport, ruleset)
        writer.change(lambda s: s.firewall.__setitem__(host.name, table_name(plan.name)))
        if not any(table_name(plan.name) in line for line in tables):
            raise HostError(host.name, "the firewall table is missing after nft applied it")
        return tables

    failures = []
    with ThreadPoolExecutor(max_workers=max(1, min(32, len(plan.hosts)))) as executor:
        futures = {host.name: executor.submit(one, host) for host in plan.hosts}
        for name, future in futures.items():
            try:
                future.result()
                reporter.emit("message", text=f"  {name}: firewall installed")
            except PsclusterError as exc:
                failures.append(Failure(name, exc))
    if failures:
        raise MultiHostError(f"firewall installation failed on {len(failures)} host(s)", failures)


def remove_rules(state: RunState, pool: TransportPool, reporter: Reporter) -> dict[str, PsclusterError]:
    """Delete the cluster's table on every host that has one (``down``); returns per-host errors."""
    errors: dict[str, PsclusterError] = {}
    hosts = [host for host in state.plan.hosts if host.name in state.firewall]

    def one(host) -> None:
        hostops.nft_apply(pool.get(host), removal_for(state.name))

    with ThreadPoolExecutor(max_workers=max(1, min(32, len(hosts) or 1))) as executor:
        futures = {host.name: executor.submit(one, host) for host in hosts}
        for name, future in futures.items():
            try:
                future.result()
                state.firewall.pop(name, None)
                reporter.emit("message", text=f"  {name}: firewall table removed")
            except PsclusterError as exc:
                errors[name] = exc
    return errors
