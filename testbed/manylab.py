"""Hundreds of fake hosts on one machine, for measuring pscluster's control side at scale
(benchmarks/scale.py, issue 46).

A :class:`ManyLab` is a :class:`testbed.netlab.Lab` (one network namespace per host, its own
address and its own real ``sshd``, the same keys, known_hosts, teardown and ``reap_stale``) on
a /16 instead of a /24: host *i* is at ``127.P.(k // 253).(k % 253 + 2)`` with ``k = i - 1``
and the bridge at ``127.P.0.1``, so one bridge holds up to 1,023 hosts (a Linux bridge takes
1,024 ports). The default /16 is ``127.79``: netlab's labs take ``127.77.x``, the Slurm lab
``127.78.0``.

What runs on the hosts is pscluster's own code (hostctl, its monitors, its watch streams) except
TensorFlow: ``write_inventory`` points ``pscluster_python`` at a wrapper interpreter the lab
writes (``<root>/bin/python``), which runs ``testbed/standin.py server`` where pscluster asks
for ``python -m roles.server`` and hands every other command (the hostctl bootstrap, a user's
program) to the virtualenv's Python unchanged. Why this seam: ``pscluster_python`` is an
inventory variable users already set per host, pscluster treats whatever it names as the
host's interpreter (argv[0] of every command it sends), and hostctl's facts still report the
real Python and TensorFlow behind it; so nothing in cluster/ or roles/ knows of the lab, and
the product carries no switch that a test could flip and a user could trip over. A testbed
module on the tasks' path (a ``roles`` package shadowing the real one) was the alternative: it
would need the code sync to ship it, that is, a change to what pscluster syncs. Training tasks
get no standbys (``pscluster_standby: false``: a standby imports TensorFlow), and a job is a
``pscluster run`` of ``standin.py program`` on the workers (sync-ps: a ps on every host is the
standing server ``up`` starts; ``run`` refuses tasks whose standing server holds the port).

A stand-in server takes 12 MB of RSS and one thread per connection; with sshd's listener and
hostctl's monitor a host costs about 25 MB before its watch stream, so 256 hosts fit in 24 GiB
with room to spare (figures in docs/benchmarks.md, "Scale").

    with ManyLab(64, pathlib.Path("/tmp/many64")) as lab:
        write_inventory(lab, path, hosts=63)     # the 64th host is for `scale`
"""
from __future__ import annotations

import pathlib
import re
import stat
import sys
from typing import Mapping, Sequence

from testbed import netlab

__all__ = ["MAX_HOSTS", "ManyLab", "address_of", "free_subnet", "inventory_groups", "write_inventory",
           "write_standin_python"]

MAX_HOSTS = 1023            # ports of one Linux bridge (BR_MAX_PORTS 1024) less none spare
DEFAULT_SUBNET = "127.79.0"
STANDIN = pathlib.Path(__file__).resolve().with_name("standin.py")
_SUBNET16_RE = re.compile(r"^127\.(\d{1,3})\.0$")


def address_of(prefix: str, index: int) -> str:
    """Host ``index`` (1-based) of a lab on ``prefix``.0.0/16: 253 hosts per /24, from .2."""
    k = index - 1
    return f"{prefix}.{k // 253}.{k % 253 + 2}"


def free_subnet(start: int = 79) -> str:
    """The first ``127.K.0`` (K >= start) whose first /24 no lab here uses (a /16's name)."""
    for k in range(start, 256):
        if not netlab._subnet_in_use(f"127.{k}.0"):
            return f"127.{k}.0"
    raise netlab.LabError(f"no free 127.K.0.0/16 from 127.{start}")


class ManyLab(netlab.Lab):
    """``n_hosts`` (up to 1,023) fake hosts on one bridge and one /16 (``subnet`` names its first
    /24, e.g. ``127.79.0``). Everything else is netlab's: see :class:`testbed.netlab.Lab`."""

    def __init__(self, n_hosts: int, root_dir: pathlib.Path, *, tag: str | None = None,
                 subnet: str = DEFAULT_SUBNET, first_host: int = 2, host_prefix: str = "node-",
                 start_timeout: float = 180.0, session_env: Mapping[str, str] | None = None,
                 sshd_options: Mapping[str, str] | None = None):
        match = _SUBNET16_RE.match(subnet)
        if not match or int(match.group(1)) > 255:
            raise ValueError("subnet must name a /16 by its first /24, e.g. '127.79.0'")
        if not 1 <= n_hosts <= MAX_HOSTS:
            raise ValueError(f"a many-hosts lab has 1 to {MAX_HOSTS} hosts, not {n_hosts}")
        if first_host != 2:
            raise ValueError("a many-hosts lab numbers its hosts from .2")
        # netlab checks a /24's room; the /16 has room for MAX_HOSTS, so check one host there.
        super().__init__(1, root_dir, tag=tag, subnet=subnet, host_prefix=host_prefix,
                         start_timeout=start_timeout, session_env=session_env,
                         sshd_options=sshd_options)
        self.n_hosts = n_hosts
        self.prefix = subnet.rsplit(".", 1)[0]
        self.python = self.root_dir / "bin" / "python"

    def __enter__(self) -> "ManyLab":
        return self.start()

    def start(self) -> "ManyLab":
        # netlab checks that the first /24 is free (under its lock); the rest of the /16 here.
        for k in range(1, (self.n_hosts - 1) // 253 + 1):
            if netlab._subnet_in_use(f"{self.prefix}.{k}"):
                raise netlab.LabError(f"{self.prefix}.{k}.0/24 is in use on this machine (another lab?)")
        self._write_wrapper()
        super().start()
        return self

    def _names(self, tag: str) -> tuple[str, list[dict]]:
        bridge, hosts = f"psmb-{tag}", []
        for i in range(1, self.n_hosts + 1):
            name = f"{self.host_prefix}{i}"
            hosts.append({
                "name": name,
                "address": address_of(self.prefix, i),
                "netns": f"psmany-{tag}-{name}",
                "veth_root": f"psm-{tag}-{i}",       # <= 13 characters (IFNAMSIZ 16)
                "sshd_pid": 0,
                "sshd_config": str(self.root_dir / "hosts" / name / "sshd_config"),
            })
        return bridge, hosts

    def _write_host_files(self, hosts: list[dict]) -> None:
        super()._write_host_files(hosts)
        for h in hosts:     # netlab's batch is for a /24: the same on the /16
            (self.root_dir / "hosts" / h["name"] / "net.batch").write_text("\n".join([
                "link set lo up",
                "link set eth0 up",
                f"addr add {h['address']}/16 dev eth0",
                f"route add {self.prefix}.0.0/16 dev eth0 table local src {h['address']}",
            ]) + "\n")

    def _make_network(self, hosts: list[dict]) -> None:
        # netlab's bridge, pinned MAC and sysctls, then its address and local route moved to the /16
        super()._make_network(hosts)
        netlab._ip_batch([
            f"route del {self.subnet}.0/24 dev {self.bridge} table local",
            f"addr del {self.subnet}.1/24 dev {self.bridge}",
            f"addr add {self.subnet}.1/16 dev {self.bridge}",
            f"route add {self.prefix}.0.0/16 dev {self.bridge} table local src {self.subnet}.1",
        ])

    def _write_wrapper(self) -> None:
        write_standin_python(self.python)


def write_standin_python(path: pathlib.Path) -> pathlib.Path:
    """An interpreter wrapper at ``path`` for ``pscluster_python``: the stand-in server for
    ``-m roles.server``, the virtualenv's Python for everything else (the lab's, and
    benchmarks/slurm_steps.py's)."""
    real = netlab.venv_python()
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(
        "#!/bin/sh\n"
        "# pscluster_python of a stand-in host: TensorFlow's standing server is testbed/standin.py\n"
        'if [ "$1" = "-m" ] && [ "$2" = "roles.server" ]; then\n'
        "    shift 2\n"
        f'    exec {real} -I -S {STANDIN} server "$@"\n'
        "fi\n"
        f'exec {real} "$@"\n')
    path.chmod(path.stat().st_mode | stat.S_IXUSR | stat.S_IXGRP | stat.S_IXOTH)
    return path


def inventory_groups(names: Sequence[str], *, ps_every: int = 1) -> dict[str, list[str]]:
    """A between-graph (sync-ps) cluster over ``names``: a ps (a standing server, what ``up``
    starts and probes) on every ``ps_every``-th host from the first, and a worker (a training
    task: what a job runs, one watch stream per host) on every host, as TF1 clusters colocate
    them."""
    if not names or ps_every < 1:
        raise ValueError("no hosts, or ps_every below 1")
    return {"ps": list(names[::ps_every]), "worker": list(names)}


def write_inventory(lab: ManyLab, path: pathlib.Path, *, hosts: int | None = None, port_base: int = 42000,
                    ps_every: int = 1, workdirs: str = "work",
                    extra_vars: Mapping[str, object] | None = None) -> pathlib.Path:
    """A sync-ps inventory of the lab's first ``hosts`` hosts (default all): interpreter the
    lab's wrapper, no standbys, a workdir of its own per host (as hosts with their own disks:
    the code sync copies to each), under the lab's folder ``workdirs`` (another folder: hosts
    that have no code yet); ``extra_vars``: more cluster-wide settings (``pscluster_sync_relay``)."""
    names = lab.names[:hosts]
    groups: dict[str, object] = dict(inventory_groups(names, ps_every=ps_every))
    groups["worker"] = {name: {"pscluster_workdir": str(lab.root_dir / workdirs / name)} for name in names}
    return netlab.write_inventory(lab, path, groups=groups, extra_vars={
        "pscluster_python": str(lab.python),
        "pscluster_mode": "sync-ps",
        "pscluster_standby": False,
        "pscluster_port_base": port_base,
        **(extra_vars or {}),
    })


def _main(argv: Sequence[str] | None = None) -> int:
    import argparse
    import json
    ap = argparse.ArgumentParser(prog="python -m testbed.manylab", description="many-hosts SSH lab")
    ap.add_argument("n", type=int)
    ap.add_argument("--dir", required=True, type=pathlib.Path)
    ap.add_argument("--inventory", type=pathlib.Path)
    args = ap.parse_args(argv)
    with ManyLab(args.n, args.dir) as lab:
        if args.inventory:
            write_inventory(lab, args.inventory)
        print(json.dumps({"hosts": len(lab.hosts), "timings": lab.timings}), flush=True)
        sys.stdin.read()        # until EOF: the lab lives as long as this process's stdin
    return 0


if __name__ == "__main__":
    sys.exit(_main())
