"""Which secret variables go to which process: the rule, in one place.

An inventory names secret variables with ``pscluster_secret_env`` on a host (or a group, merged into
its hosts); their values come from this machine's environment at ``up``/``train``/``run`` and travel
to the hosts over SSH stdin only. A TensorFlow server's environment is readable by anyone who reaches
its gRPC port (``tf.io.read_file("/proc/self/environ")`` run on it), so the rule is narrow:

* a secret goes only to the tasks of the hosts whose merged variables name it;
* it goes to training and program processes (``pscluster train``'s trainers, ``pscluster run``'s
  programs), not to the standing ps/worker servers that ``up`` starts;
* unless that host's ``pscluster_secret_env_roles`` lists the server's role (e.g. ``[ps, worker]``),
  for a job whose ops on the servers need the variable.

Pure: the caller passes the environment to read from; nothing here prints or exits.
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

from .errors import UsageError
from .plan import ClusterPlan, TaskSpec


@dataclass(frozen=True)
class Secrets:
    """Secret values and, per host, which names go there and to which standing roles."""

    values: Mapping[str, str] = field(default_factory=dict)
    names: Mapping[str, tuple[str, ...]] = field(default_factory=dict)          # host -> secret names
    standing_roles: Mapping[str, tuple[str, ...]] = field(default_factory=dict)  # host -> roles

    def names_for(self, task: TaskSpec, *, standing: bool) -> tuple[str, ...]:
        """The secret names that ``task`` gets when started as a standing server or not."""
        if standing and task.role not in self.standing_roles.get(task.host, ()):
            return ()
        return self.names.get(task.host, ())

    def env_for(self, task: TaskSpec, *, standing: bool) -> dict[str, str]:
        return {name: self.values[name] for name in self.names_for(task, standing=standing)}

    def rescoped(self, names: Mapping[str, tuple[str, ...]],
                 standing_roles: Mapping[str, tuple[str, ...]]) -> Secrets:
        """The same values under another plan's scope (a resize: issue 42, L5), keyed by that
        plan's host names; names only, so the scope can travel in a resize request.

        Raises:
            UsageError: the scope names a secret this set has no value for (a ``train`` started
                without it cannot make one up).
        """
        wanted = sorted({name for each in names.values() for name in each})
        missing = [name for name in wanted if name not in self.values]
        if missing:
            raise UsageError(f"the edited inventory names secret variable(s) {', '.join(missing)} that the running "
                             "job was started without",
                             hint="stop the job ('pscluster stop-job'; it checkpoints), scale, then "
                                  "'train --resume' with them exported")
        return Secrets({name: self.values[name] for name in wanted}, dict(names), dict(standing_roles))

    def merged(self, other: Secrets) -> Secrets:
        """Both sets (one study runs several plans of one inventory)."""
        def union(a: Mapping[str, tuple[str, ...]], b: Mapping[str, tuple[str, ...]]) -> dict:
            return {key: tuple(dict.fromkeys(a.get(key, ()) + b.get(key, ()))) for key in {*a, *b}}
        return Secrets({**self.values, **other.values}, union(self.names, other.names),
                       union(self.standing_roles, other.standing_roles))


def all_names(plan: ClusterPlan) -> list[str]:
    """Every secret name any host of ``plan`` names (for masking in ``plan``)."""
    return sorted({name for host in plan.hosts for name in host.secret_env})


def collect(plan: ClusterPlan, environ: Mapping[str, str]) -> Secrets:
    """Read the values of the secrets ``plan`` names from ``environ``.

    Raises:
        UsageError: a named secret is not set in ``environ``.
    """
    names = all_names(plan)
    missing = [name for name in names if name not in environ]
    if missing:
        raise UsageError(f"secret variable(s) {', '.join(missing)} named in pscluster_secret_env are not set here",
                         hint="export them in this shell; they travel to the hosts over SSH stdin only")
    names_of, roles_of = scope(plan)
    return Secrets(values={name: environ[name] for name in names}, names=names_of, standing_roles=roles_of)


def scope(plan: ClusterPlan) -> tuple[dict[str, tuple[str, ...]], dict[str, tuple[str, ...]]]:
    """``plan``'s secret names per host and standing roles per host (names only, no value)."""
    return ({host.name: tuple(host.secret_env) for host in plan.hosts if host.secret_env},
            {host.name: tuple(host.secret_env_roles) for host in plan.hosts if host.secret_env_roles})


def merge_all(items: Iterable[Secrets]) -> Secrets:
    result = Secrets()
    for item in items:
        result = result.merged(item)
    return result


def take_from_environment(*plans: ClusterPlan) -> Secrets:
    """Values of the plans' secret variables, from this process's environment, which they are
    then removed from: tasks on local hosts inherit it, and would otherwise all get every secret
    whatever this module's rule says (measured: a standing server did)."""
    found = merge_all([collect(plan, os.environ) for plan in plans])
    for name in found.values:
        os.environ.pop(name, None)
    return found
