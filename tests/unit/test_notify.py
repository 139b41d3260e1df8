"""Notifications (cluster/notify/notifier.py): masking, the event document, retries, and delivery from
background threads against real HTTP servers on 127.0.0.1 (one that records, one that fails,
one that hangs until the test lets it answer)."""
from __future__ import annotations

import json
import sys
import time

import pytest

from cluster.errors import InventoryError, UsageError
from cluster.inventory import load_inventory
from cluster.notify.notifier import DeliveryError, Notifier, Target, deliver, event_document, iso_time, parse_targets, run_command
from cluster.urls import mask_url, url_problem
from cluster.plan import PlanOptions, plan_cluster
from tests.helpers import RecordingServer


# ----------------------------------------------------------------------------- masking

@pytest.mark.parametrize("url, shown", [
    ("https://hooks.slack.com/services/T0123ABCD/B0456EFGH/abcdefghijklmnopqrstuvwx",
     "https://hooks.slack.com/services/****/****/****"),
    ("https://discord.com/api/webhooks/123456789012345678/AbC-dEf_ghIJKlmnOPqrSTUVwxyz",
     "https://discord.com/api/webhooks/****/****"),
    ("http://user:hunter2@example.com:8080/notify", "http://****@example.com:8080/notify"),
    ("https://TOKEN@example.com/", "https://****@example.com/"),
    ("https://example.com/hook?token=abc&channel=ops", "https://example.com/hook?token=****&channel=****"),
    ("https://example.com/a#secret", "https://example.com/a#****"),
    ("http://127.0.0.1:8000/events", "http://127.0.0.1:8000/events"),           # nothing secret-looking
    ("http://[::1]:9000/pscluster/finished", "http://[::1]:9000/pscluster/finished"),
    ("http://example.com:99999/x", "****"),                                    # not a URL: nothing shown
])
def test_mask_url(url, shown):
    assert mask_url(url) == shown


@pytest.mark.parametrize("url, problem", [
    ("ftp://example.com/x", "ftp://example.com/x is not an http:// or https:// URL"),
    ("hooks.example.com/T/B", "****/T/B is not an http:// or https:// URL"),     # no scheme: all path
    ("https:///path", "https:///path names no host"),
    ("file://user:pw@host/x", "file://****@host/x is not an http:// or https:// URL"),     # masked in the error
])
def test_url_problem(url, problem):
    assert url_problem(url) == problem


def test_good_urls_have_no_problem():
    assert url_problem("https://hooks.slack.com/services/T0/B0/x") is None
    assert url_problem("http://127.0.0.1:1/") is None


def test_parse_targets_merges_and_drops_duplicates():
    targets = parse_targets(["http://a.example/x", "http://b.example/y", "http://a.example/x"],
                            ["mail -s 'job done' me@example.com"])
    assert targets == (Target(url="http://a.example/x"), Target(url="http://b.example/y"),
                       Target(argv=("mail", "-s", "job done", "me@example.com")))
    assert targets[2].shown == "command 'mail'"          # a command shows its program only


def test_parse_targets_refuses_bad_input_with_masked_urls():
    with pytest.raises(UsageError) as caught:
        parse_targets(["ftp://bot:hunter2@example.com/x"], [])
    assert "hunter2" not in str(caught.value) and "ftp://****@example.com/x" in str(caught.value)
    with pytest.raises(UsageError, match="empty"):
        parse_targets([], ["  "])
    with pytest.raises(UsageError, match="cannot split"):
        parse_targets([], ["mail 'unclosed"])


# ----------------------------------------------------------------------------- the document

def test_event_document_fields_and_time():
    document = event_document(cluster="lab", job="distributed_mnist", event="finished", time=1764016265.7,
                              report={"global_step": 300})
    assert document == {"cluster": "lab", "job": "distributed_mnist", "event": "finished",
                        "time": "2025-11-24T20:31:05Z", "report": {"global_step": 300}}
    assert iso_time(0) == "1970-01-01T00:00:00Z"
    with pytest.raises(ValueError):
        event_document(cluster="lab", job="j", event="exploded", time=0, report={})


# ----------------------------------------------------------------------------- retries

def scripted(outcomes):
    """A post() that fails or succeeds in the given order, recording its calls."""
    calls = []

    def post(url, body, timeout):
        calls.append((url, timeout))
        outcome = outcomes[len(calls) - 1]
        if outcome is not None:
            raise outcome
    return post, calls


def test_deliver_retries_with_backoff_then_succeeds():
    post, calls = scripted([DeliveryError("timed out"), DeliveryError("HTTP 503"), None])
    sleeps: list[float] = []
    assert deliver(Target(url="http://x.example/"), b"{}", timeout=5.0, delays=(1.0, 4.0), sleep=sleeps.append,
                   post=post) is None
    assert len(calls) == 3 and sleeps == [1.0, 4.0] and calls[0][1] == 5.0


def test_deliver_gives_up_after_the_last_attempt():
    post, calls = scripted([DeliveryError("refused")] * 3)
    sleeps: list[float] = []
    assert deliver(Target(url="http://x.example/"), b"{}", delays=(1.0, 4.0), sleep=sleeps.append,
                   post=post) == "refused"
    assert len(calls) == 3 and sleeps == [1.0, 4.0]


def test_deliver_does_not_retry_a_final_answer():
    post, calls = scripted([DeliveryError("HTTP 404", retry=False)])
    sleeps: list[float] = []
    assert deliver(Target(url="http://x.example/"), b"{}", sleep=sleeps.append, post=post) == "HTTP 404"
    assert len(calls) == 1 and sleeps == []


def test_run_command_gets_the_event_on_stdin(tmp_path):
    out = tmp_path / "event.json"
    run_command([sys.executable, "-c", f"import sys; open({str(out)!r}, 'wb').write(sys.stdin.buffer.read())"],
                b'{"event": "started"}', timeout=30)
    assert json.loads(out.read_text()) == {"event": "started"}
    with pytest.raises(DeliveryError, match="exit code 3: bad"):
        run_command([sys.executable, "-c", "import sys; print('bad', file=sys.stderr); sys.exit(3)"], b"", timeout=30)
    with pytest.raises(DeliveryError) as caught:
        run_command(["/nonexistent/notify-me"], b"", timeout=30)
    assert not caught.value.retry


def test_a_command_past_its_timeout_is_stopped_with_what_it_started(tmp_path):
    child = tmp_path / "child.pid"
    script = tmp_path / "notify.sh"
    script.write_text(f"#!/bin/sh\nsleep 300 &\necho $! > {child}\nwait\n")    # a child that outlives a killed script
    script.chmod(0o755)
    with pytest.raises(DeliveryError, match="did not finish within 1 s"):
        run_command([str(script)], b"", timeout=1)
    sleeper = int(child.read_text())

    def running() -> bool:
        try:
            with open(f"/proc/{sleeper}/stat") as handle:
                return handle.read().rsplit(")", 1)[1].split()[0] != "Z"
        except OSError:     # gone, or gone between the open and the read (ESRCH)
            return False
    deadline = time.monotonic() + 30
    while running():            # SIGKILL'd: gone once its new parent reaps it
        assert time.monotonic() < deadline, "the notify command's child is still running"
        time.sleep(0.05)


# ----------------------------------------------------------------------------- real servers

@pytest.fixture
def servers():
    items = RecordingServer()
    yield items
    items.close()


def job_state(event: str, **report):
    return dict(cluster="c1", job="distributed_mnist", job_id=1, entry="train", event=event, time=1764016265.0,
                report=report)


def fast_send(target, body):
    return deliver(target, body, timeout=2.0, delays=(0.05,))


def test_events_arrive_in_order_while_a_hanging_target_waits(servers):
    warnings: list[str] = []
    notifier = Notifier([Target(url=servers.url("/ok")), Target(url=servers.url("/hang/services/T0123ABCD"))],
                        warn=warnings.append, send=fast_send, flush_seconds=0.5)
    for event in ("started", "restarted", "resized", "finished"):
        notifier.emit("job-state", **job_state(event, step=1))      # returns at once: delivery is in the background
    bodies = servers.wait_for(4)
    assert [body["event"] for body in bodies] == ["started", "restarted", "resized", "finished"]
    assert bodies[0] == {"cluster": "c1", "job": "distributed_mnist", "event": "started",
                         "time": "2025-11-24T20:31:05Z", "report": {"step": 1}}
    assert not servers.release.is_set()          # the hanging target still holds its first event
    notifier.close()
    assert any("gave up waiting" in text for text in warnings), warnings
    assert all("T0123ABCD" not in text for text in warnings)
    assert any("/hang/services/****" in text for text in warnings)


def test_a_failing_target_is_reported_once_and_masked(servers):
    warnings: list[str] = []
    url = servers.url("/fail?token=hunter2")
    notifier = Notifier([Target(url=url)], warn=warnings.append, send=fast_send, flush_seconds=10)
    for event in ("started", "failed"):
        notifier.emit("job-state", **job_state(event))
    notifier.close()
    assert len([text for text in warnings if "failed: HTTP 500" in text]) == 1, warnings
    assert "2 notifications to" in warnings[-1]
    assert all("hunter2" not in text for text in warnings) and "token=****" in warnings[0]


def test_other_events_are_not_notified(servers):
    notifier = Notifier([Target(url=servers.url("/ok"))], warn=print, send=fast_send)
    notifier.emit("message", text="hello")
    notifier.emit("job-state", **job_state("finished"))
    notifier.close()
    assert [body["event"] for body in servers.wait_for(1)] == ["finished"]
    assert [document["event"] for document in notifier.sent] == ["finished"]


# ----------------------------------------------------------------------------- pscluster_notify

INVENTORY = """\
all:
  vars:
{vars}
  children:
    worker:
      hosts:
        localhost:
          ansible_connection: local
"""


def test_inventory_notify_reaches_the_plan_masked_in_its_json(write_inventory, tmp_path):
    path = write_inventory(INVENTORY.format(vars="    pscluster_notify:\n      - https://hooks.slack.com/services/"
                                                 "T0123ABCD/B0456EFGH/abcdefghijklmnopqrstuvwx\n"
                                                 "      - http://127.0.0.1:9/events"))
    inventory = load_inventory(path)
    assert inventory.notify == ("https://hooks.slack.com/services/T0123ABCD/B0456EFGH/abcdefghijklmnopqrstuvwx",
                                "http://127.0.0.1:9/events")
    plan = plan_cluster(inventory, PlanOptions(local_python=sys.executable, local_workdir=str(tmp_path),
                                                   mode="sync"))
    assert plan.notify == inventory.notify
    assert plan.to_json()["notify"] == ["https://hooks.slack.com/services/****/****/****", "http://127.0.0.1:9/events"]


def test_inventory_notify_single_url(write_inventory):
    inventory = load_inventory(write_inventory(INVENTORY.format(vars="    pscluster_notify: http://127.0.0.1:9/x")))
    assert inventory.notify == ("http://127.0.0.1:9/x",)


@pytest.mark.parametrize("text, line, key_path, message", [
    ("    pscluster_notify: ftp://bot:pw@example.com/x", 3, "all.vars.pscluster_notify",
     "ftp://****@example.com/x is not an http:// or https:// URL"),
    ("    pscluster_notify:\n      - http://127.0.0.1/x\n      - mailto:me@example.com", 5,
     "all.vars.pscluster_notify[1]", "mailto:me@example.com is not an http:// or https:// URL"),
    ("    pscluster_notify: 42", 3, "all.vars.pscluster_notify", "expected a URL or a list of URLs, got 42"),
])
def test_inventory_notify_errors_name_file_and_line(write_inventory, text, line, key_path, message):
    with pytest.raises(InventoryError) as caught:
        load_inventory(write_inventory(INVENTORY.format(vars=text), "lab.yaml"))
    error = caught.value
    assert (error.line, error.key_path) == (line, key_path)
    assert str(error).splitlines()[0] == f"lab.yaml:{line}: {key_path}: {message}"
    assert "pw@" not in str(error)


def test_inventory_notify_is_cluster_wide(write_inventory):
    text = INVENTORY.format(vars="    pscluster_mode: async").replace(
        "          ansible_connection: local", "          ansible_connection: local\n"
                                              "          pscluster_notify: http://127.0.0.1/x")
    with pytest.raises(InventoryError, match="applies to the whole cluster"):
        load_inventory(write_inventory(text))


# ----------------------------------------------------------------------------- the command line

@pytest.mark.parametrize("argv, shown", [
    (["train", "distributed_mnist", "--notify", "ftp://bot:hunter2@example.com/x"],
     "Invalid value for '--notify': ftp://****@example.com/x is not an http:// or https:// URL"),
    (["run", "--notify", "hooks.example.com/T0123ABCD?token=hunter2", "--", "true"],
     "Invalid value for '--notify': ****/****?token=**** is not an http:// or https:// URL"),
    (["run", "--notify-cmd", "mail 'unclosed", "--", "true"],
     "Invalid value for '--notify-cmd': cannot split the command: No closing quotation"),
])
def test_bad_notify_options_are_usage_errors_with_masked_urls(tmp_path, capsys, argv, shown):
    import io

    from rich.console import Console

    from cluster.cli import Env, run
    from cluster.state import StateStore
    err = io.StringIO()
    env = Env(out=Console(file=io.StringIO()), err=Console(file=err, width=500), store=StateStore(tmp_path))
    assert run(argv, env=env) == 2
    text = capsys.readouterr().err + err.getvalue()
    assert shown in " ".join(text.split()) and "hunter2" not in text


def test_a_command_s_stderr_is_kept_as_a_bounded_tail():
    """Issue 42, L9: all of a --notify-cmd's stderr was kept in memory (communicate)."""
    import tracemalloc
    noisy = "import sys; sys.stderr.write('x' * (1 << 20) * 16 + '\\nthe last line\\n'); sys.exit(4)"
    tracemalloc.start()
    try:
        with pytest.raises(DeliveryError, match="exit code 4: the last line"):
            run_command([sys.executable, "-c", noisy], b"", timeout=60)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak < 4 << 20, f"{peak / (1 << 20):.1f} MiB held for 16 MiB of stderr"
