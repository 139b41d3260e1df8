"""roles/handover.py: a sync worker releases its port to the next incarnation of its job, and that
incarnation waits at its gate. Real sockets; the end-to-end path (two generations of TensorFlow
workers on the same ports) is tests/local/test_resize.py's sync resize."""
from __future__ import annotations

import os
import socket

import pytest

from cluster.inventory import load_inventory
from cluster.layout import gate_file
from cluster.plan import PlanOptions, plan_cluster
from cluster.supervision.train_spec import JobOptions, train_argv
from roles import handover
from roles.membership import Requests, control_path
from roles.train import parse_options
from tests.helpers import REPO

HEADER = "  sl  local_address rem_address   st tx_queue rx_queue tr tm->when retrnsmt   uid  timeout inode"


def _line(local: str, state: str, inode: str) -> str:
    return f"   0: {local} 00000000:0000 {state} 00000000:00000000 00:00000000 00000000     0        0 {inode} 1"


def test_listening_inodes_takes_only_listeners_on_the_port():
    lines = [HEADER,
             _line("00000000:2710", "0A", "111"),          # 0.0.0.0:10000, LISTEN
             _line("0100007F:2710", "01", "222"),          # an established connection on the same port
             _line("00000000:2711", "0A", "333"),          # another port
             _line("00000000000000000000000000000000:2710", "0A", "444"),   # tcp6 [::]:10000
             "garbage", ""]
    assert handover.listening_inodes(lines, 10000) == {"111", "444"}
    assert handover.listening_inodes(lines, 9999) == set()


def _listener(reuse: bool = True) -> socket.socket:
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    if reuse:       # as gRPC's listeners are
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind(("127.0.0.1", 0))
    sock.listen(8)
    return sock


def test_own_listeners_finds_this_process_socket():
    sock = _listener()
    try:
        port = sock.getsockname()[1]
        assert handover.own_listeners(port) == [sock.fileno()]
        peer = socket.create_connection(("127.0.0.1", port))      # an accepted connection is not a listener
        conn, _ = sock.accept()
        try:
            assert handover.own_listeners(port) == [sock.fileno()]
        finally:
            peer.close()
            conn.close()
    finally:
        sock.close()


def test_release_keeps_connections_refuses_new_ones_and_frees_the_port():
    sock = _listener()
    port = sock.getsockname()[1]
    peer = socket.create_connection(("127.0.0.1", port))
    conn, _ = sock.accept()
    try:
        assert handover.release_port(port) == 1
        assert handover.own_listeners(port) == []
        # the descriptor stays open (its owner, gRPC, closes it): only the duplicate was closed
        os.fstat(sock.fileno())
        # what was connected still talks
        peer.sendall(b"ping")
        assert conn.recv(4) == b"ping"
        # a new connection is refused...
        with pytest.raises(ConnectionRefusedError):
            socket.create_connection(("127.0.0.1", port), timeout=5).close()
        # ...until the next incarnation listens on the same port
        successor = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        successor.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        successor.bind(("127.0.0.1", port))
        successor.listen(8)
        try:
            socket.create_connection(("127.0.0.1", port), timeout=5).close()
        finally:
            successor.close()
    finally:
        peer.close()
        conn.close()
        sock.close()


def test_release_of_a_port_nobody_here_listens_on_is_zero():
    sock = _listener()
    port = sock.getsockname()[1]
    sock.close()
    assert handover.release_port(port) == 0


def test_gate_waits_for_go_through_the_control_file(tmp_path):
    events = str(tmp_path / "worker-0.events")
    requests = Requests(control_path(events))
    gate = gate_file(events)
    turns = []

    def sleep(_seconds):
        turns.append(1)
        if len(turns) == 1:
            assert open(gate).read() == str(os.getpid())     # announced before the first wait
            (tmp_path / "worker-0.events.membership").write_text('{"seq": 7, "release": true}')
        elif len(turns) == 3:
            (tmp_path / "worker-0.events.membership").write_text('{"seq": 8, "go": true}')

    assert handover.wait_at_gate(gate, requests.poll, lambda: False, sleep=sleep) is True
    assert len(turns) == 3            # a request that is not "go" does not open the gate
    assert [p.name for p in tmp_path.iterdir() if p.name.endswith(".tmp")] == []


def test_gate_gives_up_when_the_worker_is_stopped(tmp_path):
    events = str(tmp_path / "w.events")
    stops = iter([False, False, True])
    assert handover.wait_at_gate(gate_file(events), lambda: None, lambda: next(stops), sleep=lambda _s: None) is False


def test_the_gate_reaches_the_trainer_only_when_asked():
    plan = plan_cluster(load_inventory(str(REPO / "inventories" / "local.yaml")),
                        PlanOptions(local_python="/venv/bin/python", local_workdir="/checkout", mode="sync"))
    task = plan.task("worker:1")
    argv = {gate: train_argv(task, mode="sync", job_path="j", events_path="/run/w1.events", checkpoint_dir="/c",
                             options=JobOptions(), resume=True, gate=gate)
            for gate in (None, gate_file("/run/w1.events"))}
    assert "--gate" not in argv[None] and parse_options(argv[None][3:]).gate is None
    assert parse_options(argv["/run/w1.events.gate"][3:]).gate == "/run/w1.events.gate"


def test_a_start_removes_a_gate_left_by_an_earlier_job_of_the_same_name():
    """Job folders are reused by a cluster of the same name: a stale gate would make a resize's new
    worker look ready at once, and the old workers would stop before it could take over."""
    from cluster.hosts.hostops import _start_request
    from cluster.state import ProcessRecord
    plan = plan_cluster(load_inventory(str(REPO / "inventories" / "local.yaml")),
                        PlanOptions(local_python="/venv/bin/python", local_workdir="/checkout", mode="sync"))
    record = ProcessRecord(key="worker:0#j1.2", task="worker:0", host="localhost", kind="train", attempt=2,
                           log="/w/job-1/worker-0.2.log", exit_file="/w/job-1/worker-0.2.log.exit",
                           events="/w/job-1/worker-0.2.events.jsonl")
    fresh = _start_request(plan.task("worker:0"), record, ["python"], {})["fresh"]
    assert gate_file(record.events) in fresh and record.events in fresh
