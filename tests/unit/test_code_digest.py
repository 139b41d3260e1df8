"""cluster/hosts/codesync.py: a resize syncs the code only to the hosts that never got this
tree (issue 46: a scale by one host touched every host), every host once the tree changed."""
from __future__ import annotations

from dataclasses import replace

from cluster.events import Reporter
from cluster.hosts import codesync
from cluster.hosts.codesync import SyncResult, manifest_digest, record_sync, sync_and_record, sync_new_hosts
from cluster.state import RunState

from .test_state import lab_state


class Writer:
    """A StateWriter's change(), on a state in memory."""

    def __init__(self, state: RunState) -> None:
        self.state = state

    def change(self, mutate) -> None:
        mutate(self.state)


def tree(tmp_path, text="print('x')\n"):
    for folder in codesync.SYNC_DIRS:
        (tmp_path / folder).mkdir(exist_ok=True)
        (tmp_path / folder / "a.py").write_text(text)
    return tmp_path


def recording(monkeypatch):
    sent: list[list[str]] = []

    def sync_files(plan, pool, reporter, files, root):
        sent.append([host.name for host in plan.hosts])
        return [SyncResult(host.name, len(files), 1, 0, False) for host in plan.hosts]
    monkeypatch.setattr(codesync, "sync_files", sync_files)
    return sent


def test_the_digest_changes_with_a_files_content_name_or_mode(tmp_path):
    root = tree(tmp_path)
    before = manifest_digest(codesync.code_files(root))
    assert manifest_digest(codesync.code_files(root)) == before
    (root / "roles" / "a.py").write_text("print('y')\n")
    assert manifest_digest(codesync.code_files(root)) != before
    files = codesync.code_files(root)
    assert manifest_digest([replace(files[0], rel="roles/b.py"), *files[1:]]) != manifest_digest(files)
    assert manifest_digest([replace(files[0], mode=0o600), *files[1:]]) != manifest_digest(files)


def test_a_resize_syncs_only_new_hosts_while_the_code_is_what_was_synced(tmp_path, monkeypatch):
    root = tree(tmp_path)
    sent = recording(monkeypatch)
    state = replace(lab_state(), synced={}, code_digest=None)
    writer = Writer(state)
    hosts = [host.name for host in state.plan.hosts]
    sync_and_record(writer, state.plan, None, Reporter(), root)       # up: every host
    assert sent == [hosts] and set(state.synced) == set(hosts) and state.code_digest
    sent.clear()
    assert sync_new_hosts(writer, state.plan, None, Reporter(), root) == []    # nothing new: nobody touched
    assert sent == []
    grown = replace(state.plan, hosts=(*state.plan.hosts, replace(state.plan.hosts[0], name="node-new")))
    sync_new_hosts(writer, grown, None, Reporter(), root)                    # scale by one host
    assert sent == [["node-new"]] and "node-new" in state.synced
    sent.clear()
    (root / "examples" / "a.py").write_text("edited\n")                       # the code changed here
    sync_new_hosts(writer, state.plan, None, Reporter(), root)
    assert sent == [hosts]                                                    # every host of the plan again
    assert "node-new" not in state.synced        # it has the old tree: a later plan with it syncs it


def test_an_old_state_without_a_digest_syncs_every_host(tmp_path, monkeypatch):
    root = tree(tmp_path)
    sent = recording(monkeypatch)
    state = lab_state()                            # synced recorded, no digest: written before it existed
    assert state.code_digest is None and state.synced
    sync_new_hosts(Writer(state), state.plan, None, Reporter(), root)
    assert sent == [[host.name for host in state.plan.hosts]]
    assert RunState.from_json(state.to_json()).code_digest == state.code_digest
    record_sync(state, [], "other")
    assert state.synced == {} and state.code_digest == "other"
