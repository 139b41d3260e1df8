"""N11 (issue 25): the state directory was 0755 and `<name>.supervisor.log` / `.events` 0644,
though they hold the tails of tasks' logs, which are 0600 on their hosts."""
from __future__ import annotations

import os
import stat

import pytest

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


def test_a_shared_sticky_folder_is_left_alone(tmp_path):
    shared = tmp_path / "tmp"
    shared.mkdir()
    os.chmod(shared, 0o1777)
    private_dir(shared)
    assert mode(shared) == 0o1777


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
