"""Run by the venv's Python as a subprocess: ``--limit`` patterns through ansible-core's own
InventoryManager, as ``ansible all --list-hosts --limit PATTERN`` evaluates them (CLI.get_host_list:
``subset(PATTERN)`` then ``list_hosts("all")``), many patterns per process. Starting ansible costs
about 1.5 s of CPU; one process per inventory instead of one per pattern keeps the cross-check fast.

stdin: {"inventory": PATH, "patterns": [...]}; stdout: {PATTERN: {"hosts": [...] | null,
"error": str | null, "warnings": [...]}}. test_ansible_styles.py checks this against the CLI itself.
"""
from __future__ import annotations

import json
import sys


def main() -> None:
    from ansible.errors import AnsibleError
    from ansible.inventory.manager import InventoryManager
    from ansible.parsing.dataloader import DataLoader
    from ansible.utils.display import Display

    caught: list[str] = []
    # Every warning, undeduplicated (Display keeps one of each per process).
    Display.warning = lambda self, msg, *args, **kwargs: caught.append(str(msg))  # type: ignore[method-assign]
    request = json.load(sys.stdin)
    inventory = InventoryManager(loader=DataLoader(), sources=[request["inventory"]])
    results = {}
    for pattern in request["patterns"]:
        caught.clear()
        inventory.clear_pattern_cache()
        inventory._hosts_patterns_cache = {}
        try:
            inventory.subset(pattern)
            hosts: list[str] | None = [host.name for host in inventory.list_hosts("all")]
            error = None
        except AnsibleError as exc:
            hosts, error = None, str(exc.message)
        results[pattern] = {"hosts": hosts, "error": error, "warnings": list(caught)}
        inventory.subset(None)
    json.dump(results, sys.stdout)


if __name__ == "__main__":
    main()
