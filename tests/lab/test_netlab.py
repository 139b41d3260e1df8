"""Tests of the network-namespace SSH lab itself (testbed/netlab.py)."""

from __future__ import annotations

import json
import os
import pathlib
import shutil
import signal
import socket
import subprocess
import sys
import time

import pytest

from testbed import netlab

pytestmark = pytest.mark.lab

REPO = pathlib.Path(__file__).resolve().parents[2]


def _tcp_ok(address: str, timeout: float = 2.0) -> bool:
    try:
        with socket.create_connection((address, 22), timeout=timeout) as s:
            s.settimeout(timeout)
            return s.recv(64).startswith(b"SSH-2.0-")
    except OSError:
        return False


def _ip_list(*args: str) -> str:
    return subprocess.run(["ip", *args], capture_output=True, text=True, check=True).stdout


def test_three_hosts_up(lab3):
    assert [h.name for h in lab3.hosts] == ["node-1", "node-2", "node-3"]
    assert len({h.address for h in lab3.hosts}) == 3
    assert len({h.netns for h in lab3.hosts}) == 3
    assert all(len(h.veth_root) <= 15 for h in lab3.hosts)
    assert lab3.host("node-2").address == f"{lab3.subnet}.3"
    netns = _ip_list("netns", "list")
    for h in lab3.hosts:
        assert h.netns in netns
        assert netlab._is_lab_sshd(h.sshd_pid, str(lab3.root_dir / "hosts" / h.name / "sshd_config"))
        assert _tcp_ok(h.address)
    state = json.loads(lab3.state_file.read_text())
    assert [h["sshd_pid"] for h in state["hosts"]] == [h.sshd_pid for h in lab3.hosts]
    assert lab3.key_path.exists() and lab3.known_hosts.exists()


def test_ssh_hostname_is_own_name(lab3):
    for h in lab3.hosts:
        r = lab3.run(h.name, "hostname")
        assert r.returncode == 0, r.stderr
        assert r.stdout.strip() == h.name


def test_hosts_file_and_shared_venv(lab3):
    py = netlab.venv_python()
    r = lab3.run("node-1", "getent", "hosts", "node-3", ";", py, "-c", "'import sys; print(sys.prefix)'")
    assert r.returncode == 0, r.stderr
    lines = r.stdout.split()
    assert lines[0] == lab3.host("node-3").address and lines[1] == "node-3"
    assert lines[-1] == sys.prefix


def test_cross_host_tcp(lab3):
    # From inside node-1's namespace, node-2's sshd answers, by address and by name.
    for target in (lab3.host("node-2").address, "node-2"):
        code = ("import socket,sys; s=socket.create_connection((sys.argv[1],22),3); "
                "print(s.getsockname()[0], s.recv(64).decode().strip())")
        r = lab3.exec_in_netns("node-1", [sys.executable, "-c", code, target])
        assert r.returncode == 0, r.stderr
        src, banner = r.stdout.split(" ", 1)
        assert src == lab3.host("node-1").address  # sourced from its own lab address
        assert banner.startswith("SSH-2.0-OpenSSH")


def test_ssh_between_hosts(lab3):
    # node-1 -> node-3 with the lab key and known_hosts (by name), as a launcher would.
    inner = " ".join(lab3.ssh_argv("node-3", "hostname")).replace(
        lab3.host("node-3").address, "node-3")
    r = lab3.run("node-1", inner)
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == "node-3"


def test_cut_times_out_and_heal_restores(lab3):
    h = lab3.host("node-2")
    assert _tcp_ok(h.address)
    lab3.cut("node-2")
    assert lab3.is_cut("node-2")
    t0 = time.monotonic()
    with pytest.raises(OSError):  # a dead host: silence, then timeout (not "refused")
        socket.create_connection((h.address, 22), timeout=2).close()
    # Silence until the 2 s timeout (not refused at once; not TCP's own ~2 min of SYNs): the
    # upper bound leaves room for a loaded machine.
    assert 1.5 < time.monotonic() - t0 < 10
    # also from another host
    r = lab3.exec_in_netns("node-1", [sys.executable, "-c",
                                      "import socket,sys; socket.create_connection((sys.argv[1],22),2)",
                                      h.address])
    assert r.returncode != 0 and "timed out" in r.stderr
    t0 = time.monotonic()
    r = subprocess.run(lab3.ssh_argv("node-2", "true", connect_timeout=2),
                       stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=30)
    assert r.returncode == 255
    assert time.monotonic() - t0 < 15          # ConnectTimeout=2 (plus ssh's start-up, slow under load)
    # others are unaffected
    assert lab3.run("node-3", "hostname").stdout.strip() == "node-3"
    lab3.heal("node-2")
    assert not lab3.is_cut("node-2")
    assert _tcp_ok(h.address, timeout=5)
    assert lab3.run("node-2", "hostname").stdout.strip() == "node-2"


def test_cut_detected_by_keepalive(lab3):
    # An open session notices the cut through ServerAliveInterval=1/CountMax=2.
    proc = subprocess.Popen(lab3.ssh_argv("node-3", "echo started; sleep 60"),
                            stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    try:
        assert proc.stdout.readline().strip() == "started"
        lab3.cut("node-3")
        t0 = time.monotonic()
        rc = proc.wait(timeout=40)
        assert rc == 255
        # ~3 s by the keepalive; without it the session would sit out `sleep 60` and TCP's retries
        assert time.monotonic() - t0 < 30
    finally:
        if proc.poll() is None:
            proc.kill()
        proc.communicate()
        lab3.heal("node-3")


def test_wrong_and_empty_known_hosts_refused(lab3):
    for kh in (lab3.wrong_known_hosts(), lab3.empty_known_hosts()):
        r = lab3.run("node-1", "echo", "SHOULD-NOT-RUN", known_hosts=kh)
        assert r.returncode == 255
        assert "SHOULD-NOT-RUN" not in r.stdout
        assert "Host key verification failed" in r.stderr, r.stderr
    # the wrong file really lists the hosts, with other keys
    wrong = lab3.wrong_known_hosts().read_text().splitlines()
    right = lab3.known_hosts.read_text().splitlines()
    assert [line.split()[0] for line in wrong] == [line.split()[0] for line in right]
    assert all(w.split()[2] != r.split()[2] for w, r in zip(wrong, right))


def test_paramiko_reject_policy(lab3):
    paramiko = pytest.importorskip("paramiko")
    h = lab3.host("node-1")

    def client(known_hosts):
        c = paramiko.SSHClient()
        c.load_host_keys(str(known_hosts))
        c.set_missing_host_key_policy(paramiko.RejectPolicy())
        return c

    c = client(lab3.known_hosts)
    try:
        c.connect(h.address, username="root", key_filename=str(lab3.key_path),
                  look_for_keys=False, allow_agent=False, timeout=5, banner_timeout=5,
                  auth_timeout=5)
        _, out, err = c.exec_command("echo ok; hostname")
        assert out.read().decode().split() == ["ok", "node-1"]
        assert out.channel.recv_exit_status() == 0
    finally:
        c.close()

    c = client(lab3.wrong_known_hosts())
    with pytest.raises(paramiko.BadHostKeyException):
        c.connect(h.address, username="root", key_filename=str(lab3.key_path),
                  look_for_keys=False, allow_agent=False, timeout=5)
    c.close()
    c = client(lab3.empty_known_hosts())
    with pytest.raises(paramiko.SSHException, match="not found in known_hosts"):
        c.connect(h.address, username="root", key_filename=str(lab3.key_path),
                  look_for_keys=False, allow_agent=False, timeout=5)
    c.close()


def test_stop_removes_everything(make_lab):
    lab = make_lab(2)
    names = [(h.netns, h.veth_root, h.sshd_pid) for h in lab.hosts]
    bridge = lab.bridge
    # A detached process started over ssh (as the project launches roles), and
    # an ssh session left open: both must die with the lab.
    r = lab.run("node-2", "cd /tmp; setsid nohup sleep 300 >/dev/null 2>&1 </dev/null & echo $!")
    assert r.returncode == 0, r.stderr
    detached = int(r.stdout.strip())
    assert netlab._alive(detached)
    session = subprocess.Popen(lab.ssh_argv("node-1", "echo started; sleep 300"), stdin=subprocess.DEVNULL,
                               stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
    try:
        assert session.stdout.readline().strip() == "started"      # the session is open (not just starting)
        t0 = time.monotonic()
        lab.stop()
        # Not stuck in its own waits (10 s for processes, 5 s twice for links); on a loaded machine
        # the kernel's removal of namespaces and veths alone can take seconds.
        assert time.monotonic() - t0 < 15
        netns = _ip_list("netns", "list")
        links = _ip_list("-o", "link", "show")
        for ns, veth, pid in names:
            assert ns not in netns
            assert veth not in links
            assert not (netlab.ETC_NETNS / ns).exists()
            assert not netlab._alive(pid)  # gone, or a zombie (dead)
        assert bridge not in links
        assert not netlab._alive(detached)
        assert not lab.state_file.exists()
        assert lab.leftovers() == []
        assert session.wait(timeout=10) == 255
        lab.stop()  # idempotent
    finally:
        if session.poll() is None:
            session.kill()
        session.communicate()


def test_two_labs_coexist(make_lab):
    a = make_lab(2, subnet="auto")
    b = make_lab(2, subnet="auto")
    assert a.subnet != b.subnet and a.tag != b.tag
    assert {h.netns for h in a.hosts}.isdisjoint(h.netns for h in b.hosts)
    for lab in (a, b):
        for h in lab.hosts:
            r = lab.run(h.name, "hostname")
            assert r.returncode == 0 and r.stdout.strip() == h.name, r.stderr
    # same subnet twice is refused, not silently broken
    with pytest.raises(netlab.LabError, match="already in use"):
        make_lab(1, subnet=a.subnet)


def test_many_hosts(make_lab):
    t0 = time.monotonic()
    lab = make_lab(64)
    started = time.monotonic() - t0
    assert len(lab.hosts) == 64
    assert all(_tcp_ok(h.address) for h in lab.hosts)
    for name in ("node-1", "node-33", "node-64"):
        assert lab.run(name, "hostname").stdout.strip() == name
    # A smoke bound against a start that does not scale (say, one host after the other), not a
    # quiet machine's figure: a loaded 2-core machine starts 64 sshds 2-3x slower.
    assert started < 60, started


def _cli(*args: str, timeout: float = 120) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "testbed.netlab", *args], cwd=REPO,
                          stdin=subprocess.DEVNULL, capture_output=True, text=True,
                          timeout=timeout)


def test_cli_up_down(lab_base, tmp_path):
    d = lab_base / f"cli-{os.getpid()}"
    # capture_output: the sshds must not hold the CLI's stdout open, or this would hang
    r = _cli("up", "2", "--dir", str(d), "--subnet", "auto",
             "--inventory", str(tmp_path / "inv.yml"), timeout=60)
    try:
        assert r.returncode == 0, r.stderr
        info = json.loads(r.stdout)
        assert [h["name"] for h in info["hosts"]] == ["node-1", "node-2"]
        assert pathlib.Path(info["state_file"]).exists()
        assert pathlib.Path(info["inventory"]).exists()
        lab = netlab.Lab.load(d)
        assert lab.run("node-2", "hostname").stdout.strip() == "node-2"
        # a detached lab survives a non-forced reap
        assert netlab.reap_stale(d) == []
    finally:
        r = _cli("down", "--dir", str(d))
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout)["stopped"] is True
    assert lab.leftovers() == []
    r = _cli("down", "--dir", str(d))  # idempotent
    assert r.returncode == 0 and json.loads(r.stdout)["stopped"] is False
    shutil.rmtree(d, ignore_errors=True)


def test_reap_stale_after_crash(lab_base, tmp_path):
    d = lab_base / f"crash-{os.getpid()}"
    code = ("import os,sys,pathlib; from testbed.netlab import Lab; "
            "lab=Lab(2, pathlib.Path(sys.argv[1]), subnet='auto').start(); "
            "print(lab.tag, flush=True); os._exit(0)")  # dies without stop()
    r = subprocess.run([sys.executable, "-c", code, str(d)], cwd=REPO, stdin=subprocess.DEVNULL,
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    state = json.loads((d / netlab.STATE_FILE).read_text())
    assert netlab._leftovers(state)  # really left behind
    # A recorded PID that is no longer that lab's sshd must not be killed.
    decoy = subprocess.Popen(["sleep", "60"], stdin=subprocess.DEVNULL)
    real_pid = state["hosts"][0]["sshd_pid"]
    state["hosts"][0]["sshd_pid"] = decoy.pid
    (d / netlab.STATE_FILE).write_text(json.dumps(state))
    try:
        assert netlab.reap_stale(d) == [str(d)]
        assert decoy.poll() is None  # untouched
        assert not netlab._alive(real_pid)  # killed as a process of the lab's namespace
        assert netlab._leftovers(state) == []
        assert not (d / netlab.STATE_FILE).exists()
    finally:
        decoy.send_signal(signal.SIGKILL)
        decoy.wait()
    shutil.rmtree(d, ignore_errors=True)


def test_write_inventory(lab3, tmp_path):
    yaml = pytest.importorskip("yaml")
    path = netlab.write_inventory(
        lab3, tmp_path / "inv.yml",
        {"ps": ["node-1", "node-2"], "worker": ["node-1", "node-2", "node-3"],
         "chief": {"node-3": {"pscluster_gpus": 0}}},
        {"pscluster_run_dir": "/tmp/runs: x", "pscluster_ports": [2222, 2223]},
    )
    inv = yaml.safe_load(path.read_text())
    v = inv["all"]["vars"]
    assert v["ansible_user"] == "root"
    assert v["ansible_ssh_private_key_file"] == str(lab3.key_path)
    assert v["pscluster_known_hosts"] == str(lab3.known_hosts)
    assert v["pscluster_python"] == netlab.venv_python()
    assert v["pscluster_run_dir"] == "/tmp/runs: x" and v["pscluster_ports"] == [2222, 2223]
    ch = inv["all"]["children"]
    assert list(ch["ps"]["hosts"]) == ["node-1", "node-2"]
    assert ch["worker"]["hosts"]["node-3"]["ansible_host"] == lab3.host("node-3").address
    assert ch["chief"]["hosts"]["node-3"] == {"ansible_host": lab3.host("node-3").address,
                                              "pscluster_gpus": 0}
    with pytest.raises(KeyError):
        netlab.write_inventory(lab3, tmp_path / "bad.yml", {"ps": ["node-9"]})
