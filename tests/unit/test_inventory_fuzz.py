"""Fuzz: 10,000 generated inventories (mutations of valid ones, hostile YAML snippets, INI) load or
raise InventoryError, never another exception, in bounded total time and memory (issue 16 item 13).

Deterministic (fixed seed), so a failure reproduces; the failing text is in the assertion message.
"""
from __future__ import annotations

import random
import resource
import time

from cluster.errors import InventoryError
from cluster.inventory import load_inventory

from .conftest import INVENTORIES

COUNT = 10_000
SEEDS = [path.read_text() for path in sorted(INVENTORIES.glob("*.yaml"))] + [
    "[chief]\nnode-a ansible_host=127.0.0.1\n[ps]\nnode-[a:b]\n[worker]\nnode-a worker_tasks=2\n"
    "[worker:vars]\npscluster_port_base=2300\n[gpu:children]\nworker\n",
]
SNIPPETS = [
    "&a [*a]", "*undefined", "!foo x", "!!int abc", "!!float x", "!!binary ===", "!!python/name:os.system",
    "[" * 200, "{" * 200, "- " * 100, "n[0:999999]", "n[9:1]", "n[a:zz]", "n[0:5:0]", "yes", "on", "~", "1.5",
    "\x00", "\x07", "\ud7ff", "\t", "'", '"', "a\nflush ruleset", "<<: *a", "? [a]\n: b", "%YAML 1.1\n---",
    "---\n...\n---", "&x {a: &y [*x]}", "ansible_host: ", "ansible_port: 70000", "worker_gpus: auto",
    "worker_gpus: [[0, 0]]", "pscluster_env: {TF_CONFIG: x}", "ansible_ssh_pass: x", "ansible_become: maybe",
    "ansible_ssh_common_args: '-o ProxyJump=\"'", "pscluster_mode: sync", "children: {all: }", ":", "-", "[x]",
    "[x:vars]\nk", "[x:children]\ny", "a=b", "hosts: [a, b]", "vars: [1]", "\ufeff", "\r\n", " " * 40,
]


def mutate(rng: random.Random, text: str) -> str:
    """One to three edits: insert a snippet, delete or duplicate a span, swap characters, re-indent."""
    for _ in range(rng.randint(1, 3)):
        position = rng.randrange(len(text) + 1)
        choice = rng.random()
        if choice < 0.4:
            text = text[:position] + rng.choice(SNIPPETS) + text[position:]
        elif choice < 0.6:
            text = text[:position] + text[position + rng.randint(1, 20):]
        elif choice < 0.75:
            end = min(len(text), position + rng.randint(1, 200))
            text = text[:end] + text[position:end] + text[end:]
        elif choice < 0.9:
            text = text[:position] + rng.choice(" \n:-[]{}#,&*!'\"") + text[position:]
        else:
            lines = text.split("\n")
            index = rng.randrange(len(lines))
            lines[index] = " " * rng.randint(0, 12) + lines[index].lstrip()
            text = "\n".join(lines)
    return text


def test_fuzz_inventories_load_or_raise_inventory_error(tmp_path):
    rng = random.Random(1216)
    rss_before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    started = time.process_time()      # CPU seconds: wall time depends on the shared machine
    outcomes = {"loaded": 0, "refused": 0}
    for number in range(COUNT):
        text = mutate(rng, rng.choice(SEEDS))
        name = rng.choice(["fuzz.yaml", "fuzz"])          # no extension: YAML-or-INI detection
        path = tmp_path / name
        path.write_bytes(text.encode("utf-8", "surrogatepass") if rng.random() < 0.98 else text.encode("utf-16"))
        try:
            load_inventory(str(path))
            outcomes["loaded"] += 1
        except InventoryError as error:
            assert error.file == str(path)
            outcomes["refused"] += 1
        except Exception as exc:        # noqa: BLE001 - the point of the test
            raise AssertionError(f"case {number} ({name}) raised {type(exc).__name__}: {exc}\n{text!r}") from exc
    elapsed = time.process_time() - started
    grown_mib = (resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - rss_before) / 1024
    assert outcomes["loaded"] > 500 and outcomes["refused"] > 500, outcomes   # both paths exercised
    assert elapsed < 60, elapsed
    assert grown_mib < 200, grown_mib
