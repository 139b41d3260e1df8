"""The inventory wing: an Ansible-style inventory read, merged and checked (pure: reads files,
touches no host).

Rooms, each importing only those above it:

* ``yamlsrc`` (YAML with the file:line of every value), ``source`` (what ``-i`` names: a file or
  a folder of inventories, YAML or INI, with ``group_vars/``/``host_vars/``), ``hostnames``
  (host names, addresses and ranges, checked before anything is expanded);
* ``model`` (the :class:`Inventory` pscluster plans from, and the words an inventory may use);
* ``raw`` (the raw group tree and the errors and warnings that name file:line), ``values`` (the
  value validators and ``pscluster_*`` keys), ``groups`` (Ansible's membership and variable
  precedence), ``connection`` (how a host is reached: ``ansible_*`` keys, SSH options, jumps);
* ``loading`` (:func:`load_inventory`, which puts them together);
* ``patterns`` (``--limit`` in Ansible's host-pattern grammar), imported by its users directly
  (it reads the plan's roles per mode).
"""
from __future__ import annotations

from ..contracts import MODE_ALIASES, MODE_NAMES, MODES, canonical_mode
from .hostnames import MAX_RANGE_HOSTS, check_host_name, expand_host_pattern, split_host_port
from .loading import CLUSTER_WIDE_KEYS, load_inventory
from .model import (DEFAULT_PORT_BASE, KERAS_CHOICES, MAX_HOSTS, PLANNED_PSCLUSTER_ENV, ROLES, HostConfig, Inventory,
                    Origin, RoleSlots)

__all__ = ["CLUSTER_WIDE_KEYS", "DEFAULT_PORT_BASE", "KERAS_CHOICES", "MAX_HOSTS", "MAX_RANGE_HOSTS", "MODES", "MODE_ALIASES",
           "MODE_NAMES", "PLANNED_PSCLUSTER_ENV", "ROLES", "HostConfig", "Inventory", "Origin", "RoleSlots",
           "canonical_mode", "check_host_name", "expand_host_pattern", "load_inventory", "split_host_port"]
