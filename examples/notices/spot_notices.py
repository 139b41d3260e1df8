#!/usr/bin/env python3
"""A notice command for ``pscluster train --notices-from``: prints ``HOST [DEADLINE]`` for each
host told to go (standard library only).

  --aws    AWS spot: ``/latest/meta-data/spot/instance-action`` answers 404 until the instance is
           to be taken, then ``{"action": "terminate", "time": "2026-12-02T19:00:00Z"}`` (up to
           120 s ahead): prints ``HOST 2026-12-02T19:00:00Z``. IMDSv2: a token is asked first
           (PUT /latest/api/token); an endpoint without tokens is read without one.
  --gce    GCE preemptible/spot: ``/computeMetadata/v1/instance/preempted`` (header
           ``Metadata-Flavor: Google``) answers ``FALSE``, then ``TRUE`` about 30 s before the
           machine stops: prints ``HOST 30s``.
  --slurm  Slurm nodes an admin drains (``scontrol update nodename=N state=drain``):
           ``sinfo -h -N -t drain,draining -o %N`` for the hosts given; prints ``HOST``
           (``train --notice-deadline`` applies).

The metadata endpoint is link-local to each instance, so by default each HOST's is read there:
``ssh HOST curl ...`` (BatchMode: keys only, never a password prompt). ``--endpoint URL`` reads
``URL`` directly instead, ``{host}`` replaced by each host's name: a metadata proxy, or a
stand-in in tests (``--endpoint 'http://127.0.0.1:8080/{host}'`` reads
``http://127.0.0.1:8080/w1/latest/meta-data/spot/instance-action``).

Hosts are asked in parallel, each within ``--timeout`` seconds; a host that cannot be asked is
said on stderr and left out (the others still count). Exit 0 unless the arguments are wrong (2).

  pscluster train distributed_mnist --notices-from 'examples/notices/spot_notices.py --aws w1 w2 w3'
"""
from __future__ import annotations

import argparse
import json
import shlex
import subprocess
import sys
import urllib.error
import urllib.request
from concurrent.futures import ThreadPoolExecutor

AWS_BASE = "http://169.254.169.254"
GCE_BASE = "http://metadata.google.internal"
AWS_PATH = "/latest/meta-data/spot/instance-action"
AWS_TOKEN_PATH = "/latest/api/token"
GCE_PATH = "/computeMetadata/v1/instance/preempted"
GCE_NOTICE = "30s"      # GCE's preemption notice: about 30 s before the machine stops


class Unreachable(Exception):
    """The host's metadata could not be read (said on stderr; the host is left out)."""


def fetch_direct(url: str, headers: dict[str, str], timeout: float, method: str = "GET") -> tuple[int, str]:
    """(HTTP status, body) of ``url``; 404 and other HTTP errors are answers, not failures."""
    request = urllib.request.Request(url, headers=headers, method=method)
    try:
        with urllib.request.urlopen(request, timeout=timeout) as answer:
            return answer.status, answer.read(65536).decode(errors="replace")
    except urllib.error.HTTPError as exc:
        return exc.code, ""
    except (urllib.error.URLError, OSError) as exc:
        raise Unreachable(str(getattr(exc, "reason", exc))) from None


def fetch_over_ssh(host: str, url: str, headers: dict[str, str], timeout: float, method: str = "GET") -> tuple[int, str]:
    """The same, read on ``host`` itself (``ssh HOST curl``): the body, then the status on its own line."""
    curl = ["curl", "-s", "-m", f"{timeout:g}", "-X", method, "-w", "\\n%{http_code}"]
    for key, value in headers.items():
        curl += ["-H", f"{key}: {value}"]
    command = ["ssh", "-o", "BatchMode=yes", "-o", f"ConnectTimeout={max(1, int(timeout))}", host,
               shlex.join(curl + [url])]
    try:
        done = subprocess.run(command, capture_output=True, text=True, timeout=timeout + 10)
    except subprocess.TimeoutExpired:
        raise Unreachable("ssh timed out") from None
    body, _, code = done.stdout.rpartition("\n")
    if done.returncode != 0 or not code.strip().isdigit() or code.strip() == "000":
        raise Unreachable((done.stderr.strip() or f"curl exited with {done.returncode}")[-200:])
    return int(code), body


def aws_notice(host: str, fetch) -> str | None:
    status, token = fetch(AWS_TOKEN_PATH, {"X-aws-ec2-metadata-token-ttl-seconds": "60"}, "PUT")
    headers = {"X-aws-ec2-metadata-token": token.strip()} if status == 200 and token.strip() else {}
    status, body = fetch(AWS_PATH, headers, "GET")
    if status == 404:
        return None         # no interruption planned
    if status != 200:
        raise Unreachable(f"instance-action answered HTTP {status}")
    try:
        action = json.loads(body)
        when = str(action["time"])
    except (ValueError, KeyError, TypeError):
        raise Unreachable(f"instance-action is not the JSON AWS documents: {body[:80]!r}") from None
    return f"{host} {when}"


def gce_notice(host: str, fetch) -> str | None:
    status, body = fetch(GCE_PATH, {"Metadata-Flavor": "Google"}, "GET")
    if status != 200:
        raise Unreachable(f"preempted answered HTTP {status}")
    return f"{host} {GCE_NOTICE}" if body.strip().upper() == "TRUE" else None


def slurm_notices(hosts: list[str], timeout: float) -> list[str]:
    command = ["sinfo", "-h", "-N", "-t", "drain,draining", "-o", "%N", "-n", ",".join(hosts)]
    try:
        done = subprocess.run(command, capture_output=True, text=True, timeout=timeout)
    except (OSError, subprocess.TimeoutExpired) as exc:
        print(f"sinfo: {exc}", file=sys.stderr)
        return []
    if done.returncode != 0:
        print(f"sinfo exited with {done.returncode}: {done.stderr.strip()[-200:]}", file=sys.stderr)
        return []
    return sorted(set(done.stdout.split()) & set(hosts))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="Print 'HOST [DEADLINE]' for each host told to go "
                                                 "(pscluster train --notices-from).")
    kind = parser.add_mutually_exclusive_group(required=True)
    kind.add_argument("--aws", action="store_true", help="AWS spot: instance-action")
    kind.add_argument("--gce", action="store_true", help="GCE: instance/preempted")
    kind.add_argument("--slurm", action="store_true", help="Slurm: nodes in state drain or draining (sinfo)")
    parser.add_argument("--endpoint", metavar="URL",
                        help="read URL + the metadata path directly, {host} replaced by each host "
                             "(default: ssh HOST curl the instance's own endpoint)")
    parser.add_argument("--timeout", type=float, default=5.0, help="seconds per host (default 5)")
    parser.add_argument("hosts", nargs="+", metavar="HOST")
    args = parser.parse_args(argv)
    if not 0 < args.timeout <= 60:
        parser.error("--timeout must be more than 0 and at most 60 seconds")
    if args.slurm:
        for host in slurm_notices(args.hosts, args.timeout):
            print(host)
        return 0
    base = AWS_BASE if args.aws else GCE_BASE
    notice = aws_notice if args.aws else gce_notice

    def ask(host: str) -> str | None:
        def fetch(path: str, headers: dict[str, str], method: str) -> tuple[int, str]:
            if args.endpoint:
                return fetch_direct(args.endpoint.format(host=host) + path, headers, args.timeout, method)
            return fetch_over_ssh(host, base + path, headers, args.timeout, method)
        try:
            return notice(host, fetch)
        except Unreachable as exc:
            print(f"{host}: {exc}", file=sys.stderr)
            return None
    with ThreadPoolExecutor(max_workers=min(16, len(args.hosts))) as pool:
        for line in pool.map(ask, args.hosts):
            if line:
                print(line)
    return 0


if __name__ == "__main__":
    sys.exit(main())
