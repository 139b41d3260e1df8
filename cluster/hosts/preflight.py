"""Preflight: every host checked in parallel before anything starts.

One connection and one host call per host gather the facts; the checks themselves are pure
functions of those facts and the plan, so they are tested without hosts.
"""
from __future__ import annotations

import dataclasses
import json
import time
from typing import Mapping
from dataclasses import dataclass

from . import gpus, hostops
from ..contracts import TensorFlowNeed
from ..errors import Failure, HostError, MultiHostError, PsclusterError
from ..events import Check as CheckResult  # one type: a check is also the event that reports it
from ..events import Reporter
from ..fanout import fan_out
from ..inventory import Inventory
from ..plan import ClusterPlan, HostSpec, TaskSpec, loopback_addresses
from ..transport import TransportPool
from ..transport.limits import ensure_open_files
from ..transport.spread import ENV as _SPREAD_ENV

MIN_TF = (2, 16)        # Keras 3 era; the drivers in roles/ are written against it
MAX_PARALLEL = 64


@dataclass(frozen=True)
class CheckReport:
    results: tuple[CheckResult, ...]
    facts: tuple[tuple[str, hostops.HostFacts], ...]
    seconds: float

    @property
    def ok(self) -> bool:
        return all(result.ok for result in self.results)

    @property
    def failures(self) -> tuple[CheckResult, ...]:
        return tuple(result for result in self.results if not result.ok)

    def facts_of(self, host: str) -> hostops.HostFacts | None:
        return dict(self.facts).get(host)

    def raise_for_failures(self) -> None:
        if self.ok:
            return
        failures = [Failure(result.host, PsclusterError(f"{result.host}: {result.check}: {result.detail}",
                                                        hint=result.hint))
                    for result in self.failures]
        hosts = sorted({result.host for result in self.failures})
        raise MultiHostError(f"preflight failed on {len(hosts)} host(s): {', '.join(hosts)}; nothing was started",
                             failures)


def _version_tuple(version: str) -> tuple[int, ...]:
    parts = []
    for piece in version.split(".")[:2]:
        digits = "".join(ch for ch in piece if ch.isdigit())
        parts.append(int(digits) if digits else 0)
    return tuple(parts)


def _tensorflow_check(host: HostSpec, facts: hostops.HostFacts, need: TensorFlowNeed) -> CheckResult:
    """TensorFlow on the host: an error where pscluster needs it, a warning where only the user's
    program might (a one-shot ``run``: TensorFlowNeed.OPTIONAL)."""
    if facts.tf_version is None or not facts.tf_importable:
        problem = f"TensorFlow is not installed for {host.python}"
        hint = ("install it there: pip install 'pscluster[cpu]' (or [gpu]), "
                "or point pscluster_python at the interpreter that has it")
    elif _version_tuple(facts.tf_version) < MIN_TF:
        problem = f"{facts.tf_dist} {facts.tf_version} is too old (need {MIN_TF[0]}.{MIN_TF[1]} or newer)"
        hint = "upgrade TensorFlow on this host"
    else:
        return CheckResult(host.name, "tensorflow", True, f"{facts.tf_dist} {facts.tf_version}")
    return _tensorflow_problem(host.name, problem, hint, need)


def _tensorflow_problem(host: str, problem: str, hint: str, need: TensorFlowNeed) -> CheckResult:
    if need is TensorFlowNeed.OPTIONAL:
        return CheckResult(host, "tensorflow", True, f"{problem}; run goes on: a program that imports it will fail",
                           hint=hint, warning=True)
    return CheckResult(host, "tensorflow", False, problem, hint=hint)


def keras_check(host: str, tf_version: str | None, tf_keras_version: str | None,
                tf_keras_importable: bool, tf_dist: str | None = None) -> CheckResult:
    """Legacy Keras (``TF_USE_LEGACY_KERAS=1``) on a host: tf-keras must be installed there (its
    metadata, and ``tf_keras/__init__.py`` on the interpreter's path: found without importing it,
    which would import TensorFlow) and be of the host's TensorFlow major.minor (tf-keras 2.N is built for TensorFlow 2.N; another
    one fails at ``import tensorflow``, or later, in the program).

    tf-keras names the ``tensorflow`` distribution as its dependency, so beside tensorflow-cpu
    (or another build) a plain install pulls the full ``tensorflow`` wheel over it: the hint
    says ``--no-deps`` there."""
    want = ".".join(map(str, _version_tuple(tf_version))) if tf_version else None
    package = f"tf-keras=={tf_version}" if tf_version else "tf-keras"
    if tf_dist and tf_dist != "tensorflow":
        install = f"pip install --no-deps {package} (tf-keras depends on 'tensorflow'; --no-deps keeps {tf_dist})"
    else:
        install = f"pip install {package} (or pip install 'pscluster[legacy-keras]')"
    hint = f"install it there: {install}, or run without --keras legacy / pscluster_keras: legacy"
    if tf_version is None:
        return CheckResult(host, "keras", False, "legacy Keras (tf-keras) needs TensorFlow, which is not installed",
                           hint="install TensorFlow and tf-keras of its version there, e.g. "
                                "pip install 'pscluster[cpu,legacy-keras]'")
    if tf_keras_version is None or not tf_keras_importable:
        found = f"tf-keras {tf_keras_version} does not import" if tf_keras_version else "tf-keras is not installed"
        return CheckResult(host, "keras", False, f"legacy Keras asked for, but {found} (TensorFlow {tf_version})",
                           hint=hint)
    if _version_tuple(tf_keras_version) != _version_tuple(tf_version):
        return CheckResult(host, "keras", False,
                           f"tf-keras {tf_keras_version} does not match TensorFlow {tf_version} (need {want}.x)",
                           hint=hint)
    return CheckResult(host, "keras", True, f"legacy Keras: tf-keras {tf_keras_version}")


def reach_check(host: HostSpec) -> str:
    """The name of the check that a host answers: ``docker`` for a container, else ``ssh``."""
    return "docker" if host.connection == "docker" else "ssh"


def check_host(plan: ClusterPlan, host: HostSpec, facts: hostops.HostFacts, connect_seconds: float, *,
               allow_busy_gpus: bool = False,
               tensorflow: TensorFlowNeed = TensorFlowNeed.REQUIRED) -> list[CheckResult]:
    """The checks of one host, from what it reported (pure)."""
    name = host.name
    tasks = list(plan.tasks_on(name))
    results = [
        CheckResult(name, reach_check(host), True, "local (no SSH)" if host.is_local else
                    f"{'docker exec' if host.connection == 'docker' else 'connected'} in {connect_seconds:.2f} s"),
        CheckResult(name, "python", True, f"{facts.python} ({facts.executable})"),
    ]
    results.append(_tensorflow_check(host, facts, tensorflow))
    if host.keras == "legacy":
        results.append(keras_check(name, facts.tf_version, facts.tf_keras_version, facts.tf_keras_importable,
                                   facts.tf_dist))
    busy = dict(facts.busy_ports)
    clashes = [f"{task.port} ({task.name}: {busy[task.port]})" for task in tasks if task.port in busy]
    if clashes:
        results.append(CheckResult(name, "ports", False, "in use: " + ", ".join(clashes),
                                   hint="stop what holds them (another cluster?) or set pscluster_port_base "
                                        "/ <role>_ports to free ports"))
    else:
        results.append(CheckResult(name, "ports", True, "free: " + ", ".join(str(task.port) for task in tasks)))
    wanted = sorted({int(gpu) for task in tasks if task.cuda_visible_devices
                     for gpu in task.cuda_visible_devices.split(",")})
    if wanted:
        available = len(facts.gpus or ())
        missing = [gpu for gpu in wanted if gpu >= available]
        if missing:
            users = [task.name for task in tasks if task.cuda_visible_devices and
                     any(int(gpu) in missing for gpu in task.cuda_visible_devices.split(","))]
            found = f"{available} GPU(s) found" if facts.gpu_error is None else facts.gpu_error
            results.append(CheckResult(name, "gpus", False,
                                       f"{', '.join(users)} ask(s) for GPU {', '.join(map(str, missing))}, but {found}",
                                       hint="fix <role>_gpus for this host, or [] for CPU-only tasks"))
        else:
            results.append(_busy_check(host, facts, wanted, allow_busy_gpus)
                           or CheckResult(name, "gpus", True, f"{available} GPU(s); masks use {wanted}"))
    if tasks and facts.uid == 0:
        results.append(root_warning(host))
    if facts.workdir_error:
        results.append(CheckResult(name, "workdir", False, f"not writable: {facts.workdir_error}",
                                   hint="set pscluster_workdir to a directory this user can write"))
    elif facts.workdir_unsafe:
        results.append(CheckResult(name, "workdir", False, f"refused: {facts.workdir_unsafe}",
                                   hint="set pscluster_workdir to a folder of the task user that only it can write "
                                        "(e.g. ~/pscluster, the default), not /tmp, /scratch or /dev/shm itself"))
    else:
        results.append(CheckResult(name, "workdir", True, host.workdir))
    if plan.firewall:
        has_nft = dict(facts.tools).get("nft", False)
        if not has_nft or not facts.root:
            lacking = " and ".join(([] if has_nft else ["nft is not installed"]) +
                                   ([] if facts.root else [f"uid {facts.uid} has neither root nor passwordless sudo"]))
            results.append(CheckResult(name, "firewall", False, lacking,
                                       hint="install nftables and connect as root (or allow 'sudo -n nft'), "
                                            "or bring the cluster up without --firewall"))
        else:
            results.append(CheckResult(name, "firewall", True, "nft and root available"))
    return results


def root_warning(host: HostSpec) -> CheckResult:
    """A warning (issue 42, L10): TensorFlow's servers run any graph they are sent, so whoever
    reaches a port of this host's tasks runs code as root there."""
    how = ("ansible_user (default: the image's pscluster user)" if host.connection == "docker"
           else "ansible_user, or ansible_become_user")
    return CheckResult(host.name, "user", True, "tasks run as root (uid 0): anyone who reaches their TF ports runs "
                       "code as root on this host", hint=f"run them as a user of their own: set {how}",
                       warning=True)


def check_cluster(plan: ClusterPlan, facts: dict[str, hostops.HostFacts], *,
                  tensorflow: TensorFlowNeed = TensorFlowNeed.REQUIRED) -> list[CheckResult]:
    """Checks across hosts: one TensorFlow version everywhere (a warning where it is optional);
    no loopback in a multi-host spec."""
    results = []
    versions = {host: f.tf_version for host, f in facts.items() if f.tf_version}
    if len(set(versions.values())) > 1:
        reference_host = next(iter(versions))
        reference = versions[reference_host]
        for host, version in versions.items():
            if version != reference:
                results.append(_tensorflow_problem(host, f"TensorFlow {version} here but {reference} on {reference_host}",
                                                   "install the same TensorFlow version on every host", tensorflow))
    for task in loopback_addresses(plan):
        results.append(CheckResult(task.host, "address", False,
                                   f"{task.name} has address {task.address!r} in a multi-host cluster; "
                                   "other hosts cannot reach it",
                                   hint=f"set ansible_host for {task.host} to an address the other hosts can reach"))
    return results


REACH_TIMEOUT = 3.0      # seconds per host-to-host TCP connect; listeners live a few times longer
# ... and longer with more hosts: the first host's listener must outlive the listen fan-out and
# the whole connect phase (at 256 hosts on a loaded control machine the two took ~40 s, past a
# fixed 18 s: 195 of 256 hosts found their peers' first ports "refused"). `unlisten` ends them
# as soon as the check is done; this bound is for a host lost in between.
LISTEN_PER_HOST = 0.5


def listen_seconds(hosts: int) -> float:
    """How long each host's reach listeners live at most, for a check of ``hosts`` hosts."""
    return 6 * REACH_TIMEOUT + LISTEN_PER_HOST * hosts


def check_reach(plan: ClusterPlan, pool: TransportPool, hosts: list[HostSpec]) -> list[CheckResult]:
    """Every host opens a TCP connection to every other member's planned ports (held open by a
    short-lived listener there), so a blocked path between two hosts is named before anything
    starts (``node-b → node-c:2225 timed out``) instead of hanging training.

    Not on Slurm nodes: a host operation there is a job step, and Slurm kills what a step leaves
    behind when it ends, so no listener outlives its ``listen`` call (every connect would be
    refused); the nodes of one allocation are the scheduler's to connect."""
    hosts = [host for host in hosts if host.connection != "slurm"]
    names = {host.name for host in hosts}
    if len(names) < 2:
        return []
    tasks = [task for task in plan.tasks if task.host in names]

    def listen(host: HostSpec):
        ports = sorted({task.port for task in plan.tasks_on(host.name)})
        address = plan.tasks_on(host.name)[0].address       # its family: IPv4 or IPv6
        return hostops.call(pool.get(host), "listen", {"ports": ports, "address": address,
                                                       "seconds": listen_seconds(len(hosts))})

    def connect(host: HostSpec) -> dict[str, str]:
        own = owned.get(host.name, [])
        # every host gets the one list, encoded once, and skips its own ports: a list per host,
        # encoded per host, cost this process N² at N hosts (issue 46)
        request = b'{"targets": ' + everyone + b', "skip": ' + json.dumps(own).encode() + \
            b', "failed_only": true, "timeout": ' + json.dumps(REACH_TIMEOUT).encode() + b'}'
        answer = hostops.call(pool.get(host), "connect", request, timeout=REACH_TIMEOUT + 60)
        attempts[host.name] = len(bound) - len(own)
        return answer["results"]

    # catch=HostError: a host that fails here is left out quietly (its own checks already say why)
    listening = fan_out(hosts, listen, name="reach listen", catch=HostError, max_workers=MAX_PARALLEL).ok
    # every listening port once, in order, with its host: built once, not per host from every task
    # (at 1,000 hosts that was 2 million steps here), and the answers name only what failed
    bound = sorted({(task.address, task.port): task.host for task in tasks
                    if task.port in (listening.get(task.host) or {}).get("bound", ())}.items())
    everyone = json.dumps([target for target, _ in bound]).encode()
    owned: dict[str, list[tuple[str, int]]] = {}
    for target, owner in bound:
        owned.setdefault(owner, []).append(target)
    attempts: dict[str, int] = {}
    try:
        reached = fan_out(hosts, connect, name="reach connect", catch=HostError, max_workers=MAX_PARALLEL).ok
    finally:     # the ports must be free again before the servers start
        fan_out([host for host in hosts if listening.get(host.name)],
                lambda host: hostops.call(pool.get(host), "unlisten", listening[host.name]),
                name="reach unlisten", catch=HostError, max_workers=MAX_PARALLEL)
    owners: dict[str, int] = {}
    for (address, port), owner in bound:
        owners[f"{address}:{port}"] = owner in reached      # it tried no port of its own
    tried = {target: len(reached) - own for target, own in owners.items()}
    return reach_results([host.name for host in hosts], tasks, reached, tried=tried,
                         attempts={source: attempts[source] for source in reached})


REACH_NAMED = 5        # blocked peers named in one line; the rest are counted


def reach_results(hosts: list[str], tasks: list[TaskSpec], reached: Mapping[str, Mapping[str, str]], *,
                  tried: Mapping[str, int] | None = None,
                  attempts: Mapping[str, int] | None = None) -> list[CheckResult]:
    """The reach check's verdicts from each host's connect outcomes (``reached``: host →
    ``{"address:port": "ok" | "timed out" | "refused" | ...}``), one line per finding. With
    ``tried`` (target → how many hosts tried it) and ``attempts`` (host → how many targets it
    tried), ``reached`` may hold the failed outcomes only, as ``up`` gets them:

    * a port that none of at least two peers reached is blamed on its own host, once
      (``node-12:2222 answered none of its 63 peers (timed out)``): a firewall there;
    * any other blocked path is named from the host that tried it, its blocked peers on one
      line per outcome (the first few named, the rest counted);
    * a host that reached every peer it tried passes.
    """
    by_target = {task.target: task for task in tasks}
    if tried is None or attempts is None:
        tried, attempts = {}, {source: len(reached.get(source) or {}) for source in hosts}
        for source in hosts:
            for target in reached.get(source) or {}:
                tried[target] = tried.get(target, 0) + 1
    failed: dict[str, dict[str, str]] = {}                   # target -> {source: outcome}, not "ok"
    for source in hosts:
        for target, outcome in (reached.get(source) or {}).items():
            if outcome != "ok":
                failed.setdefault(target, {})[source] = outcome
    dead = {target for target, seen in failed.items() if tried.get(target, 0) >= 2 and len(seen) >= tried[target]}

    def where(target: str) -> str:
        peer = by_target.get(target)
        return f"{peer.host}:{peer.port}" if peer else target

    results: list[CheckResult] = []
    order = {name: index for index, name in enumerate(hosts)}

    def rank(target: str) -> tuple[int, int, str]:       # the inventory's host order, then port
        peer = by_target.get(target)
        return (order.get(peer.host, len(hosts)), peer.port, target) if peer else (len(hosts), 0, target)

    for target in sorted(dead, key=rank):
        seen = failed[target]
        seen_as = ", ".join(sorted(set(seen.values())))
        peer = by_target.get(target)
        owner, port = (peer.host, str(peer.port)) if peer else (target, target.rpartition(":")[2])
        results.append(CheckResult(owner, "reach", False,
                                   f"{where(target)} answered none of its {len(seen)} peers ({seen_as})",
                                   hint=f"a firewall on {owner} (or its route) blocks port {port}; "
                                        "TensorFlow would hang there"))
    for source in hosts:
        failed_here = {target: outcome for target, outcome in (reached.get(source) or {}).items() if outcome != "ok"}
        blocked: dict[str, list[str]] = {}
        for target, outcome in sorted(failed_here.items(), key=lambda item: rank(item[0])):
            if target not in dead:
                blocked.setdefault(outcome, []).append(where(target))
        for outcome, peers in blocked.items():
            named = ", ".join(peers[:REACH_NAMED]) + (f" and {len(peers) - REACH_NAMED} more"
                                                      if len(peers) > REACH_NAMED else "")
            results.append(CheckResult(source, "reach", False, f"{source} → {named} {outcome}",
                                       hint="a firewall or route between these hosts blocks the port; "
                                            "TensorFlow would hang there"))
        if attempts.get(source) and not failed_here:
            results.append(CheckResult(source, "reach", True, f"reaches {attempts[source]} peer port(s)"))
    return results


def _busy_check(host: HostSpec, facts: hostops.HostFacts, wanted: list[int], allow: bool) -> CheckResult | None:
    """A failed check when a GPU the plan masks is already used by someone (lab GPUs are shared)."""
    try:
        found = gpus.from_query(host.name, facts.gpu_query)
    except gpus.GpuQueryError as exc:
        return CheckResult(host.name, "gpus", False, str(exc), hint="check nvidia-smi on that host")
    busy = tuple(gpu for gpu in gpus.busy_gpus(found or (), host.gpu_busy_mib) if gpu.index in wanted)
    if not busy:
        return None
    if allow:
        return CheckResult(host.name, "gpus", True, "shared on purpose (--allow-busy-gpus): "
                           + "; ".join(gpu.describe() for gpu in busy))
    return CheckResult(host.name, "gpus", False, gpus.busy_message(host.name, busy),
                       hint=f"pick other GPUs, raise pscluster_gpu_busy_mib (now {host.gpu_busy_mib}), leave the host "
                            "out with --limit, or share them anyway with --allow-busy-gpus")


def resolve_auto_gpus(inventory: Inventory, plan: ClusterPlan, pool: TransportPool) -> Inventory:
    """The inventory with every ``<role>_gpus: auto`` replaced by one task per GPU that
    ``nvidia-smi -L`` lists on its host now (asked in parallel).

    Raises:
        MultiHostError: a host could not be asked, or nvidia-smi failed there.
        InventoryError: a host with ``auto`` has no GPU.
    """
    def count(name: str) -> int:
        host = plan.host(name)
        facts = hostops.facts(pool.get(host), ports=(), gpus=True, workdir=None)
        if facts.gpu_error:
            raise HostError(name, f"worker_gpus/chief_gpus: auto needs nvidia-smi: {facts.gpu_error}",
                            hint="install the NVIDIA driver there, or list the masks in the inventory")
        return len(facts.gpus or ())

    counted = fan_out(plan.auto_gpu_hosts, count, name="gpu count", max_workers=MAX_PARALLEL)
    counted.raise_for_failures(f"could not count the GPUs of {len(counted.failed)} host(s) for '<role>_gpus: auto'")
    return gpus.resolve_auto(inventory, counted.ok)


def _where(pool: TransportPool, host: HostSpec, result: CheckResult) -> CheckResult:
    """A failed Python or TensorFlow check names what runs the host's commands when the host name
    does not (a container's image: the image lacks them, not a machine)."""
    if result.ok or result.check not in ("python", "tensorflow", "keras"):
        return result
    where = pool.get(host).describe()
    if not where:
        return result
    first, newline, rest = result.detail.partition("\n")
    first = first.replace(" (exit code 127)", "")
    return dataclasses.replace(result, detail=f"{first} ({where}){newline}{rest}")


def run_preflight(plan: ClusterPlan, pool: TransportPool, reporter: Reporter, *,
                  allow_busy_gpus: bool = False, tensorflow: TensorFlowNeed = TensorFlowNeed.REQUIRED) -> CheckReport:
    """Check every host of the plan in parallel and report each check as it is known
    (``tensorflow``: whether a host without a usable TensorFlow fails, or only warns)."""
    start = time.monotonic()
    if plan.auto_gpu_hosts:        # the CLI resolves them first (resolve_auto_gpus): a bug if not
        raise PsclusterError(f"<role>_gpus: auto is not resolved on {', '.join(plan.auto_gpu_hosts)}")
    ensure_open_files(len(plan.hosts))       # before the first connection, not at the 1,000th
    helpers = pool.spread(plan.hosts)     # many SSH hosts: their connections in helper processes
    if helpers:
        reporter.emit("message", text=f"the SSH connections are held by {helpers} helper process(es) "
                                      f"(transport/spread.py; {_SPREAD_ENV}=0: none)")
    reporter.emit("phase", name="preflight", detail=f"{len(plan.hosts)} host(s)")

    def one(host: HostSpec) -> tuple[hostops.HostFacts, float]:
        transport = pool.get(host)
        began = time.monotonic()
        transport.connect()
        connected = time.monotonic() - began
        ports = [task.port for task in plan.tasks_on(host.name)]
        gpus = any(task.cuda_visible_devices for task in plan.tasks_on(host.name))
        return hostops.facts(transport, ports=ports, gpus=gpus, workdir=host.workdir,
                             tools=("nft",) if plan.firewall else (), need_root=plan.firewall,
                             tf_keras=host.keras == "legacy"), connected

    results: list[CheckResult] = []
    facts: dict[str, hostops.HostFacts] = {}
    for outcome in fan_out(plan.hosts, one, name="preflight", catch=HostError, max_workers=MAX_PARALLEL):
        if outcome.error is not None:       # unreachable, or no usable interpreter there
            check = reach_check(outcome.item) if "interpreter" not in outcome.error.message else "python"
            results.append(_where(pool, outcome.item, CheckResult(
                outcome.key, check, False, outcome.error.message.split(": ", 1)[-1], hint=outcome.error.hint)))
            continue
        facts[outcome.key], connected = outcome.result()
        results.extend(_where(pool, outcome.item, result) for result in
                       check_host(plan, outcome.item, facts[outcome.key], connected, allow_busy_gpus=allow_busy_gpus,
                                  tensorflow=tensorflow))
    results.extend(check_cluster(plan, facts, tensorflow=tensorflow))
    if all(result.ok for result in results):
        results.extend(check_reach(plan, pool, [host for host in plan.hosts if host.name in facts]))
    for result in results:
        reporter.emit("check", host=result.host, check=result.check, ok=result.ok, detail=result.detail,
                      hint=result.hint, warning=result.warning)
    return CheckReport(tuple(results), tuple(facts.items()), time.monotonic() - start)
