"""Fuzz: 10,000 generated inventories (mutations of valid ones, hostile YAML snippets, INI) load or
raise InventoryError, never another exception, in bounded total time and memory (issue 16 item 13).

Deterministic (fixed seed), so a failure reproduces; the failing text is in the assertion message.
"""
from __future__ import annotations

import io
import json
import os
import random
import re
import resource
import signal
import time

from rich.console import Console

from cluster.console import render_plan, render_warnings
from cluster.errors import InventoryError, PsclusterError
from cluster.inventory import load_inventory
from cluster.plan import PlanOptions, plan_cluster
from cluster.secrets import all_names

from .conftest import INVENTORIES

OPTIONS = PlanOptions(local_python="/venv/bin/python", local_workdir="/checkout")

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


# ----------------------------------------------------------------------------- issue 25
# What found the second round's findings: control characters in every string field (N6, N12,
# N13), size (N4), FIFOs and symlinks (N5, "Also"), IPv6 scope ids (N6). Each case loads, plans
# and renders (text and JSON), or is refused with a PsclusterError, within CASE_SECONDS; no
# rendered output holds a raw control character. (The sbatch option fuzz is in test_slurm_layout.)

CASE_SECONDS = 10
CONTROL = [chr(code) for code in [*range(0, 9), 11, 12, 13, *range(14, 32), 127, 0x85, 0x9b]] + ["\u2028", "\u202e"]
STRING_FIELDS = {      # key -> a valid value to corrupt
    "ansible_host": "198.51.100.7", "ansible_user": "alice", "ansible_ssh_private_key_file": "~/.ssh/id",
    "pscluster_python": "/opt/venv/bin/python", "pscluster_workdir": "/srv/psc", "pscluster_known_hosts": "/k",
    "ansible_become_user": "bob", "ansible_ssh_common_args": "-o ProxyJump=hop", "pscluster_notify": "https://x.example/h",
    "ansible_port": "2222", "pscluster_host_key_policy": "reject", "ansible_connection": "ssh",
}
ENV_FIELDS = ("pscluster_env", "pscluster_secret_env")


def corrupt(rng: random.Random, value: str) -> str:
    position = rng.randrange(len(value) + 1)
    inserted = "".join(rng.choice(CONTROL + list("%;$`[] \\'\"")) for _ in range(rng.randint(1, 3)))
    return value[:position] + inserted + value[position:]


def yaml_string(value: str) -> str:
    """A double-quoted YAML scalar holding any character (YAML's own escapes)."""
    return json.dumps(value)      # JSON strings are YAML double-quoted strings


def string_field_case(rng: random.Random) -> str:
    host = rng.choice(["node-a", "fe80::1%eth0", "198.51.100.9"])
    field_kind = rng.random()
    host_vars: dict[str, str] = {}
    if field_kind < 0.6:
        key = rng.choice(sorted(STRING_FIELDS))
        host_vars[key] = yaml_string(corrupt(rng, STRING_FIELDS[key]))
        if key == "ansible_become_user":
            host_vars["ansible_become"] = "true"
    elif field_kind < 0.75:
        name, value = corrupt(rng, "OMP_NUM_THREADS") if rng.random() < 0.5 else "OMP_NUM_THREADS", corrupt(rng, "2")
        host_vars["pscluster_env"] = "{" + f"{yaml_string(name)}: {yaml_string(value)}" + "}"
    elif field_kind < 0.85:
        host_vars["pscluster_secret_env"] = "[" + yaml_string(corrupt(rng, "WANDB_KEY")) + "]"
    elif field_kind < 0.95:
        host = corrupt(rng, host) if rng.random() < 0.5 else "fe80::1%" + corrupt(rng, "eth0")
    else:
        host_vars["worker_gpus"] = yaml_string(corrupt(rng, "0,1"))
    body = ", ".join(f"{key}: {value}" for key, value in host_vars.items())
    group = yaml_string(corrupt(rng, "gpu")) if rng.random() < 0.1 else "gpu"
    return (f"all:\n  vars: {{pscluster_mode: sync}}\n  children:\n    worker:\n      hosts:\n"
            f"        {yaml_string(host)}: {{{body}}}\n    {group}:\n      hosts: {{{yaml_string(host)}: }}\n")


def size_case(rng: random.Random) -> str:
    patterns = "".join(f"    \"h{index}-[0:{rng.choice([9, 999, 4999, 9999])}]\":\n"
                       for index in range(rng.randint(1, 4)))
    tasks = rng.choice([1, 2, 64])
    return f"all:\n  vars: {{pscluster_mode: sync, worker_tasks: {tasks}}}\nworker:\n  hosts:\n{patterns}"


def folder_case(rng: random.Random, root) -> str:
    """An inventory folder with a FIFO, a symlink (inside, outside, dangling, a loop) or a
    device somewhere Ansible would read."""
    folder = root / "inv"
    (folder / "group_vars").mkdir(parents=True)
    (folder / "host_vars" / "node-a").mkdir(parents=True)
    (folder / "hosts.yml").write_text("worker:\n  hosts: {node-a: }\n")
    outside = root / "outside.yml"
    outside.write_text("pscluster_port_base: 3000\n")
    where = rng.choice([folder / "more.yml", folder / "group_vars" / "all.yml", folder / "group_vars" / "worker",
                        folder / "host_vars" / "node-a.yml", folder / "host_vars" / "node-a" / "x.yml"])
    kind = rng.choice(["fifo", "outside", "dangling", "loop", "device", "inside"])
    if kind == "fifo":
        os.mkfifo(where)
    elif kind == "outside":
        where.symlink_to(outside)
    elif kind == "dangling":
        where.symlink_to(root / "missing.yml")
    elif kind == "loop":
        where.symlink_to(where)
    elif kind == "device":
        where.symlink_to("/dev/zero")
    else:
        (folder / "real.yml.txt").write_text("pscluster_port_base: 3100\n")
        where.symlink_to(folder / "real.yml.txt")
    return str(folder)


RAW_CONTROL = re.compile(r"[\x00-\x09\x0b-\x1f\x7f-\x9f]")     # Unicode's Cc but newline


class CaseTimeout(Exception):
    pass


def _timeout(signum, frame):
    raise CaseTimeout()


def render_everything(path: str) -> None:
    """Load, plan and render as `plan` and `plan --json` do; raw control characters in the
    output fail the case."""
    inventory = load_inventory(path)
    plan = plan_cluster(inventory, OPTIONS)
    out = io.StringIO()
    console = Console(file=out, width=200, color_system=None)
    render_warnings(console, inventory.warnings)
    render_plan(console, plan, secret_names=all_names(plan))
    text = out.getvalue() + json.dumps(plan.to_json())
    bad = RAW_CONTROL.search(text)
    assert not bad, (bad, text[:2000])


def test_fuzz_fields_sizes_fifos_and_symlinks(tmp_path):
    rng = random.Random(25)
    previous = signal.signal(signal.SIGPROF, _timeout)
    outcomes = {"planned": 0, "refused": 0}
    slowest = 0.0
    try:
        for number in range(2000):
            # 1,890 field cases, 100 folders, 10 sizes (a size case that plans takes ~1 s)
            kind = "size" if number % 200 == 10 else "folder" if number % 20 == 0 else "fields"
            case_root = tmp_path / str(number)
            case_root.mkdir()
            if kind == "folder":
                path = folder_case(rng, case_root)
                text = f"folder case {number}"
            else:
                text = string_field_case(rng) if kind == "fields" else size_case(rng)
                path = str(case_root / "fuzz.yaml")
                (case_root / "fuzz.yaml").write_text(text, encoding="utf-8", errors="surrogatepass")
            began = time.process_time()
            signal.setitimer(signal.ITIMER_PROF, CASE_SECONDS)   # CPU seconds: a loaded machine is no failure
            try:
                render_everything(path)
                outcomes["planned"] += 1
            except PsclusterError:
                outcomes["refused"] += 1
            except CaseTimeout:
                raise AssertionError(f"case {number} took more than {CASE_SECONDS} s:\n{text!r}") from None
            except AssertionError:
                raise
            except Exception as exc:        # noqa: BLE001 - the point of the test
                raise AssertionError(f"case {number} raised {type(exc).__name__}: {exc}\n{text!r}") from exc
            finally:
                signal.setitimer(signal.ITIMER_PROF, 0)
            slowest = max(slowest, time.process_time() - began)
    finally:
        signal.signal(signal.SIGPROF, previous)
    assert outcomes["planned"] > 100 and outcomes["refused"] > 1000, outcomes   # both paths exercised
    assert slowest < CASE_SECONDS, slowest
