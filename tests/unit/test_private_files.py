"""N11 (issue 25): the state directory was 0755 and `<name>.supervisor.log` / `.events` 0644,
though they hold the tails of tasks' logs, which are 0600 on their hosts."""
from __future__ import annotations

import os
import stat

import pytest

from cluster.errors import UntrustedStateError
from tests.unit.test_cli_plan import Captured
from cluster.history import RunHistory
from cluster.lifecycle.resize_request import RESIZE_SUFFIX, take_request
from cluster.supervision.daemon import EventLog
from cluster.state import StateStore, open_private, private_dir


def mode(path) -> int:
    return stat.S_IMODE(os.stat(path).st_mode)


@pytest.fixture(autouse=True)
def loose_umask():
    old = os.umask(0o022)       # the usual one: files 0644, folders 0755 unless asked otherwise
    yield
    os.umask(old)


def test_the_state_directory_is_created_0700_and_an_old_0755_one_is_tightened(tmp_path):
    fresh = tmp_path / "a" / "state"
    private_dir(fresh)
    assert mode(fresh) == 0o700
    old = tmp_path / "old"
    old.mkdir(mode=0o755)
    with StateStore(old).lock("c1"):
        pass
    assert mode(old) == 0o700


@pytest.mark.parametrize("bits, owner, words", [
    (0o1777, None, "writable by others (mode 1777)"),       # a shared sticky folder: PSCLUSTER_STATE_DIR=/tmp/x
    (0o775, None, "writable by others (mode 0775)"),
    (0o700, 4321, "belongs to uid 4321"),
])
def test_a_state_directory_others_own_or_can_write_is_refused(tmp_path, bits, owner, words):
    """Issue 42, L1: a <name>.json planted there was read as a state (and ran code on `status`)."""
    shared = tmp_path / "tmp"
    shared.mkdir()
    os.chmod(shared, bits)
    if owner is not None:
        os.chown(shared, owner, -1)
    (shared / "c1.json").write_text("{}")
    history = tmp_path / "h" / "history"                         # RunHistory(tmp_path / "h")'s folder
    history.parent.mkdir()
    for attempt in (lambda: private_dir(shared), lambda: StateStore(shared).load("c1"),
                    lambda: shared.rename(history) and RunHistory(history.parent).load("c1")):
        with pytest.raises(UntrustedStateError) as caught:
            attempt()
        assert words in caught.value.message and caught.value.exit_code == 2
    assert mode(history) == bits                     # left as it was


def test_a_state_history_or_request_file_of_another_user_is_refused(tmp_path):
    store = StateStore(tmp_path / "state")
    private_dir(store.root)
    planted = [store.path("c1"), RunHistory(store.root).path("c1"), store.root / f"c1{RESIZE_SUFFIX}"]
    for path in planted:
        path.parent.mkdir(mode=0o700, exist_ok=True)
        path.write_text("[]" if "history" in str(path) else "{}")
        os.chown(path, 4321, -1)
    with pytest.raises(UntrustedStateError, match="c1.json is not a file of yours"):
        store.load("c1")
    with pytest.raises(UntrustedStateError, match="not a file of yours"):
        RunHistory(store.root).load("c1")
    with pytest.raises(UntrustedStateError, match="c1.resize.json is not a file of yours"):
        take_request(store, "c1")


def test_status_on_a_planted_state_exits_2_naming_the_folder(tmp_path):
    shared = tmp_path / "shared"
    shared.mkdir()
    os.chmod(shared, 0o1777)
    (shared / "c1.json").write_text("{}")
    cli = Captured(shared)
    assert cli.run("status") == 2
    assert f"state directory {shared} is writable by others" in cli.stderr.getvalue()
    assert "Traceback" not in cli.stderr.getvalue()


def test_supervisor_events_and_logs_are_0600(tmp_path):
    log = EventLog(str(tmp_path / "c1.supervisor-123.events"))
    log.handle("message", text="the tail of a task's log")
    log.close()
    assert mode(tmp_path / "c1.supervisor-123.events") == 0o600
    existing = tmp_path / "c1.supervisor.log"
    existing.write_text("old\n")
    os.chmod(existing, 0o644)
    os.close(open_private(existing))
    assert mode(existing) == 0o600


def test_a_symlink_planted_for_the_log_is_not_followed(tmp_path):
    target = tmp_path / "elsewhere"
    target.write_text("")
    (tmp_path / "c1.supervisor.log").symlink_to(target)
    with pytest.raises(OSError):
        open_private(tmp_path / "c1.supervisor.log")


def test_a_probe_tunnel_socket_is_0600_in_a_0700_folder_without_touching_the_umask(monkeypatch):
    """Issue 42, L6: bind was bracketed by a process-wide os.umask(0o177); two tunnels opening at
    once could leave the whole process at 0177."""
    import dataclasses
    import shutil
    from cluster.transport import ssh
    from tests.unit.test_paths_sync_become import HOST

    def no_umask(mask):
        raise AssertionError(f"os.umask({mask:o}) called")

    monkeypatch.setattr(os, "umask", no_umask)
    owner = ssh.SSHTransport(dataclasses.replace(HOST, connection="ssh"))
    tunnel = ssh._Tunnel(owner, "10.1.1.2", 2222, unix=True)
    try:
        path = tunnel.address.removeprefix("unix:")
        assert mode(path) == 0o600 and mode(os.path.dirname(path)) == 0o700
    finally:
        tunnel.listener.close()
        shutil.rmtree(tunnel.folder or "", ignore_errors=True)
