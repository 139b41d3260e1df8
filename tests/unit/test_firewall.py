"""The firewall's pure parts (table names, sources, rulesets) and its bookkeeping against a fake
host runner: tables are recorded before they are applied, and a new ``up`` over a failed state
removes the tables that state records."""
from __future__ import annotations

import json
import re
from dataclasses import replace

import pytest

from cluster.hosts import firewall

from cluster.hosts import hostops
from cluster.errors import MultiHostError
from cluster.events import Reporter
from cluster.lifecycle.updown import _remove_stale_tables
from cluster.plan import HostSpec
from cluster.state import RunState, StateStore, StateWriter
from cluster.transport import TransportPool
from cluster.transport.base import CommandResult, Transport

NFT_NAME = re.compile(r"^[A-Za-z][A-Za-z0-9_]{0,62}$")     # an nft identifier, well under its 256 limit


# ----------------------------------------------------------------------------- table names (item 10)

def test_table_names_are_distinct_per_exact_name():
    long_a = "experiment-" + "x" * 40 + "-a"
    long_b = "experiment-" + "x" * 40 + "-b"
    names = ["exp-a", "exp.a", "exp a", "exp_a", long_a, long_b, "EXP-A"]
    tables = [firewall.table_name(name) for name in names]
    assert len(set(tables)) == len(names), tables
    assert all(NFT_NAME.match(table) for table in tables), tables
    assert firewall.table_name("exp-a") == firewall.table_name("exp-a")          # stable across runs
    assert firewall.table_name("exp-a").startswith("pscluster_exp_a_")           # still readable


# ----------------------------------------------------------------------------- sources (items 11, 12)

def spec(name: str, address: str, *, local: bool = False) -> HostSpec:
    return HostSpec(name=name, address=address, connection="local" if local else "ssh", ssh_port=22, user=None,
                    key_file=None, python="python3", workdir="/w", host_key_policy="strict", known_hosts=None,
                    connect_timeout=5.0)


@pytest.fixture
def plan(tmp_path):
    """A planned two-host SSH cluster (names, not IPs), from a real inventory."""
    from cluster.inventory import load_inventory
    from cluster.plan import PlanOptions, plan_cluster
    inventory = tmp_path / "fw.yaml"
    inventory.write_text("all:\n  vars: {pscluster_port_base: 4000}\n  children:\n"
                         "    chief: {hosts: {alpha: {ansible_host: alpha.example}}}\n"
                         "    ps: {hosts: {alpha: {ansible_host: alpha.example}}}\n"
                         "    worker: {hosts: {beta: {ansible_host: beta.example}}}\n")
    return plan_cluster(load_inventory(str(inventory)), PlanOptions(local_python="python3", local_workdir="/w",
                                                                    name="fw"))


def test_every_address_of_a_member_is_accepted_and_unresolved_names_are_reported(plan):
    resolved = {"alpha.example": ["10.0.0.1", "10.0.1.1", "fd00::1"], "beta.example": []}
    sources, missing = firewall.member_sources(plan, resolved)
    assert [s.address for s in sources] == ["10.0.0.1", "10.0.1.1", "fd00::1"]
    assert all(s.why == "member alpha (alpha.example)" for s in sources)
    assert missing == ["beta.example"]


def test_ruleset_says_what_is_allowed_and_why(plan):
    sources = firewall.member_sources(plan, {"alpha.example": ["10.0.0.1", "fd00::1"],
                                             "beta.example": ["10.0.0.2"]})[0]
    sources += firewall.control_sources(["10.0.0.9"], "alpha")
    ruleset = firewall.ruleset_for(plan, "alpha", sources=sources)
    ports = sorted(t.port for t in plan.tasks if t.host == "alpha")
    port_set = ", ".join(map(str, ports))
    assert f"    ip saddr {{ 10.0.0.1, 10.0.0.2, 10.0.0.9 }} tcp dport {{ {port_set} }} accept" in ruleset
    assert f"    ip6 saddr {{ fd00::1 }} tcp dport {{ {port_set} }} accept" in ruleset
    assert "#   10.0.0.9: control machine (its source address toward alpha)" in ruleset
    assert "#   10.0.0.2: member beta (beta.example)" in ruleset
    assert f"table inet {firewall.table_name('fw')} {{" in ruleset


def test_data_in_comments_cannot_become_nft_syntax(plan):
    hostile = "alpha\ndelete table inet filter"
    sources = [firewall.Source("10.0.0.1", f"member {firewall._safe(hostile)}")]
    ruleset = firewall.ruleset_for(plan, hostile, sources=sources)
    assert not any(line.startswith("delete table inet filter") for line in ruleset.splitlines())
    assert all(line.startswith(("#", "add ", "delete table inet pscluster_", "table ", "  ", "}"))
               for line in ruleset.splitlines()), ruleset


def test_control_address_is_the_route_source_not_ssh_connection(monkeypatch):
    # The operator's laptop (or a bastion) as SSH_CONNECTION must not be what is allowed.
    monkeypatch.setenv("SSH_CONNECTION", "203.0.113.9 50000 10.0.0.5 22")
    assert firewall.control_source(spec("self", "127.0.0.2")) == ("127.0.0.1",)
    assert firewall.control_source(spec("here", "127.0.0.1", local=True)) == ()   # loopback: `iifname lo`
    assert firewall.control_source(spec("nowhere", "no-such-host.invalid")) == ()


# ----------------------------------------------------------------------------- bookkeeping (item 5), fake runner

class FakeHost(Transport):
    """Answers hostctl calls from a script: ``nft`` per host, ``resolve`` from a table."""

    def __init__(self, host: HostSpec, log: list, *, nft_exit: int = 0, resolves=None, on_nft=None, blocked=(),
                 interfaces=None):
        super().__init__(host)
        self.interfaces = interfaces or {}
        self.log, self.nft_exit, self.resolves, self.on_nft = log, nft_exit, resolves or {}, on_nft
        self.blocked = blocked      # (from host, to address) pairs the installed rules drop

    def run(self, argv, *, stdin=None, timeout=60.0) -> CommandResult:
        operation = argv[-1]
        request = json.loads(stdin[int(argv[-2]):])
        self.log.append((self.host.name, operation, request))
        if operation == "nft":
            if self.on_nft:
                self.on_nft(self.host.name)
            tables = re.findall(r"^table inet (\S+) \{", request["ruleset"], re.M)
            answer = {"exit_code": self.nft_exit, "stderr": "Error: refused" if self.nft_exit else "",
                      "tables": [f"table inet {t}" for t in tables]}
        elif operation == "addresses":
            answer = {"addresses": self.interfaces.get(self.host.name, [])}
        elif operation == "listen":
            answer = {"bound": request["ports"], "failed": [], "pid": 1, "starttime": 1}
        elif operation == "unlisten":
            answer = {"stopped": True}
        elif operation == "connect":
            answer = {"results": {f"{address}:{port}": "timed out" if (self.host.name, address) in self.blocked
                                  else "ok" for address, port in request["targets"]}}
        elif operation == "resolve":
            answer = {"resolved": {name: ({"addresses": self.resolves[name]} if name in self.resolves
                                          else {"error": "Name or service not known"}) for name in request["names"]}}
        else:
            raise AssertionError(operation)
        return CommandResult(self.host.name, tuple(argv), 0, json.dumps(answer), "")

    def stream(self, argv, *, stdin=None):
        raise AssertionError("no streams here")

    def _put_files(self, files, *, mode=None):
        raise AssertionError("no files here")


def ssh_plan(plan):
    """The fixture's plan with hosts reachable from here (loopback addresses) over 'ssh'."""
    hosts = tuple(replace(h, address={"alpha": "127.0.0.2", "beta": "beta.example"}[h.name]) for h in plan.hosts)
    return replace(plan, hosts=hosts)


def test_tables_are_recorded_before_they_are_applied(tmp_path, plan):
    plan = ssh_plan(plan)
    store = StateStore(tmp_path)
    state = RunState(name=plan.name, plan=plan)
    store.save(state)
    seen_on_disk = {}

    def on_nft(host):       # what `down` would find if this command died right now
        seen_on_disk[host] = dict(store.load(plan.name).firewall)

    log: list = []
    pool = TransportPool(lambda host: FakeHost(host, log, nft_exit=1, on_nft=on_nft,
                                               resolves={"beta.example": ["10.9.0.2", "fd09::2"]}))
    with pytest.raises(MultiHostError, match="nft refused"):
        firewall.install_rules(plan, pool, StateWriter(store, state, expect_phase="starting"), Reporter())
    table = firewall.table_name(plan.name)
    assert set(seen_on_disk) == {"alpha", "beta"}
    assert all(found.get(host) == table for host, found in seen_on_disk.items()), seen_on_disk
    assert store.load(plan.name).firewall == {"alpha": table, "beta": table}     # refused, still recorded
    rulesets = {host: req["ruleset"] for host, op, req in log if op == "nft"}
    assert "10.9.0.2" in rulesets["alpha"] and "fd09::2" in rulesets["alpha"]      # resolved on the host


def test_member_that_resolves_nowhere_fails_with_its_name(tmp_path, plan):
    plan = ssh_plan(plan)
    store = StateStore(tmp_path)
    state = RunState(name=plan.name, plan=plan)
    store.save(state)
    log: list = []
    pool = TransportPool(lambda host: FakeHost(host, log))
    with pytest.raises(MultiHostError, match=r"cannot resolve member address\(es\) beta.example"):
        firewall.install_rules(plan, pool, StateWriter(store, state, expect_phase="starting"), Reporter())
    assert not [entry for entry in log if entry[1] == "nft"]          # nothing applied anywhere


@pytest.mark.parametrize("nft_exit", [0, 1], ids=["removed", "unreachable"])
def test_new_up_over_a_failed_state_removes_the_tables_it_records(tmp_path, plan, nft_exit):
    plan = ssh_plan(plan)
    store = StateStore(tmp_path)
    failed = RunState(name=plan.name, plan=plan, phase="failed",
                      firewall={"alpha": "pscluster_fw", "beta": "pscluster_fw"})   # e.g. the old naming
    store.save(failed)
    log: list = []
    pool = TransportPool(lambda host: FakeHost(host, log, nft_exit=nft_exit))
    if nft_exit:
        with pytest.raises(MultiHostError, match="could not be removed"):
            _remove_stale_tables(plan.name, store, pool, Reporter())
        assert store.load(plan.name).firewall == failed.firewall       # kept for a later `down`
    else:
        _remove_stale_tables(plan.name, store, pool, Reporter())
        assert store.load(plan.name).firewall == {}
    removals = sorted((host, req["ruleset"]) for host, op, req in log if op == "nft")
    assert removals == [(h, "add table inet pscluster_fw\ndelete table inet pscluster_fw\n") for h in ("alpha", "beta")]


def test_hostops_resolve_parses_each_answer(plan):
    log: list = []
    transport = FakeHost(plan.hosts[0], log, resolves={"a.example": ["10.0.0.1", "fd00::1"]})
    assert hostops.resolve(transport, ["a.example", "b.example"]) == {
        "a.example": ("10.0.0.1", "fd00::1"), "b.example": "Name or service not known"}


def test_plan_ruleset_names_what_this_machine_cannot_resolve(plan):
    ruleset = firewall.ruleset_for(replace(plan, hosts=tuple(replace(h, address="no-such-host.invalid")
                                                             for h in plan.hosts)), "alpha")
    assert "#   not resolvable here: no-such-host.invalid (up resolves it on each host, or fails)" in ruleset


def test_a_resolver_that_never_answers_is_given_up_on_here_and_on_the_host(monkeypatch):
    """Item 12 (first round): getaddrinfo has no timeout; a dead DNS server stalled `up --firewall`
    and `plan --firewall` (1,000 unresolvable names: minutes)."""
    import socket
    import time
    from cluster.hosts import firewall
    from roles import hostctl
    real = socket.getaddrinfo

    def getaddrinfo(name, *args, **kwargs):
        if name.startswith("stuck"):
            time.sleep(30)
        return real("127.0.0.1", *args, **kwargs)

    monkeypatch.setattr(socket, "getaddrinfo", getaddrinfo)
    began = time.monotonic()
    found = firewall.resolve_many(["stuck-1", "fine", "stuck-2", "198.51.100.4"], timeout=0.5)
    assert found == {"stuck-1": [], "fine": ["127.0.0.1"], "stuck-2": [], "198.51.100.4": ["198.51.100.4"]}
    answer = hostctl.op_resolve({"names": ["stuck-3", "fine"], "timeout": 0.5})["resolved"]
    assert answer == {"stuck-3": {"error": "no answer within 0.5 s"}, "fine": {"addresses": ["127.0.0.1"]}}
    assert time.monotonic() - began < 5


def test_members_that_the_installed_rules_block_fail_up(tmp_path, plan):
    """Item 12 (first round): preflight's reach check ran before the rules; a member the rules
    drop (say, one that connects from an address no name resolves to) showed only as a hang."""
    plan = replace(plan, hosts=tuple(replace(h, address={"alpha": "127.0.0.2", "beta": "127.0.0.3"}[h.name])
                                     for h in plan.hosts),
                   tasks=tuple(replace(t, address={"alpha": "127.0.0.2", "beta": "127.0.0.3"}[t.host])
                               for t in plan.tasks))
    store = StateStore(tmp_path)
    state = RunState(name=plan.name, plan=plan)
    store.save(state)
    log: list = []
    pool = TransportPool(lambda host: FakeHost(host, log, blocked={("beta", "127.0.0.2")}))
    with pytest.raises(MultiHostError, match="through the firewall just installed") as caught:
        firewall.install_rules(plan, pool, StateWriter(store, state, expect_phase="starting"), Reporter())
    assert "beta → alpha:4000" in str(caught.value)
    operations = [op for _, op, _ in log]
    assert operations.index("connect") > max(i for i, op in enumerate(operations) if op == "nft")   # after the rules
    pool = TransportPool(lambda host: FakeHost(host, []))
    firewall.install_rules(plan, pool, StateWriter(store, state, expect_phase="starting"), Reporter())   # no block


def test_a_multi_homed_members_other_addresses_are_accepted(tmp_path, plan):
    """Item 12 (first round): only the addresses a member's name resolves to were accepted; one
    that connects from its other interface was dropped."""
    plan = ssh_plan(plan)
    store = StateStore(tmp_path)
    state = RunState(name=plan.name, plan=plan)
    store.save(state)
    log: list = []
    pool = TransportPool(lambda host: FakeHost(host, log, resolves={"beta.example": ["10.9.0.2"]},
                                               interfaces={"beta": ["10.9.0.2", "192.0.2.77", "fd09::77"]}))
    firewall.install_rules(plan, pool, StateWriter(store, state, expect_phase="starting"), Reporter())
    alpha = next(req["ruleset"] for host, op, req in log if op == "nft" and host == "alpha")
    assert "192.0.2.77: member beta (an address of its interfaces)" in alpha and "fd09::77" in alpha
    assert "192.0.2.77" in next(line for line in alpha.splitlines() if line.strip().startswith("ip saddr"))


def test_hostctl_lists_this_hosts_interface_addresses_but_loopback():
    from roles import hostctl
    addresses = hostctl.op_addresses({})["addresses"]
    assert addresses and not any(a.startswith("127.") or a == "::1" for a in addresses)
