"""Error rendering (cluster/errors.py): what the user reads leads with the root cause and
carries host, task, exit code and log tail."""
from __future__ import annotations

import pytest

from cluster.errors import (failure_tail, Failure, HostError, InventoryError, MultiHostError, PlanError, PsclusterError,
                            StateError, TaskError, UnreachableHostError, UsageError, tail_text)

LOG = "\n".join(f"line {number}" for number in range(1, 21))       # line 1 .. line 20


def test_exit_codes():
    assert [cls.exit_code for cls in (UsageError, InventoryError, PlanError)] == [2, 2, 2]
    assert [cls.exit_code for cls in (PsclusterError, StateError, HostError, TaskError, MultiHostError)] == \
        [1, 1, 1, 1, 1]


def test_hint_is_rendered_last():
    error = PsclusterError("it broke", hint="fix it")
    assert (error.message, error.hint) == ("it broke", "fix it")
    assert str(error) == "it broke\n  hint: fix it"
    assert str(PsclusterError("it broke")) == "it broke"


@pytest.mark.parametrize("line, key_path, expected", [
    (14, "worker.hosts.node-b.worker_gpus[1]", "lab.yaml:14: worker.hosts.node-b.worker_gpus[1]: bad"),
    (None, "worker.hosts", "lab.yaml: worker.hosts: bad"),
    (3, "", "lab.yaml:3: bad"),
    (None, "", "lab.yaml: bad"),
])
def test_inventory_error(line, key_path, expected):
    error = InventoryError("lab.yaml", line, key_path, "bad", hint="do this")
    assert (error.file, error.line, error.key_path, error.hint) == ("lab.yaml", line, key_path, "do this")
    assert str(error).splitlines() == [expected, "  hint: do this"]


def test_tail_text_keeps_the_last_non_empty_lines():
    assert tail_text("a\n\n  \nb\nc\n\n", 2) == "b\nc"
    assert tail_text(LOG).splitlines() == [f"line {number}" for number in range(9, 21)]
    assert tail_text("") == ""


def test_task_error_with_log_tail():
    error = TaskError("worker:1", "node-b", "exited", exit_code=3, log_tail=LOG + "\n\n",
                      log_path="/opt/pscluster/work/.pscluster/lab/worker-1.log", hint="read the log")
    assert (error.task, error.host, error.task_exit_code) == ("worker:1", "node-b", 3)
    assert error.log_tail == LOG + "\n\n"
    assert error.log_path == "/opt/pscluster/work/.pscluster/lab/worker-1.log"
    assert str(error).splitlines() == [
        "worker:1@node-b: exited (exit code 3)",
        "  last lines of its log (/opt/pscluster/work/.pscluster/lab/worker-1.log):",
        *[f"    line {number}" for number in range(9, 21)],         # the last 12 lines
        "  hint: read the log",
    ]


def test_task_error_without_log():
    error = TaskError("ps:0", "node-a", "not ready after 120 s", log_tail="\n  \n")
    assert str(error) == "ps:0@node-a: not ready after 120 s"
    assert error.task_exit_code is None


def test_host_error():
    error = HostError("node-c", "command failed", argv=["python3", "-m", "roles.hostctl"], exit_code=127,
                      stderr="\n".join(f"err {number}" for number in range(1, 11)))
    assert (error.host, error.argv, error.remote_exit_code) == ("node-c", ["python3", "-m", "roles.hostctl"], 127)
    assert str(error).splitlines() == ["node-c: command failed (exit code 127)",
                                       *[f"    err {number}" for number in range(3, 11)]]   # the last 8
    assert isinstance(UnreachableHostError("node-c", "timed out"), HostError)
    assert str(UnreachableHostError("node-c", "timed out")) == "node-c: timed out"


def test_multi_host_error_leads_with_the_root_cause():
    root = TaskError("worker:1", "node-b", "exited", exit_code=3, log_tail="Traceback\nValueError: bad shape",
                     hint="fix the model")
    later = HostError("node-c", "unreachable", stderr="ssh: connect to host 10.0.0.3 port 22: timed out")
    error = MultiHostError("up failed; everything started was stopped",
                           [Failure("node-b", root), Failure("node-c", later)])
    assert error.root_cause is root
    assert [failure.where for failure in error.failures] == ["node-b", "node-c"]
    assert error.hint == "fix the model"               # the root cause's hint
    assert str(error).splitlines() == [
        "up failed; everything started was stopped",
        "Root cause (first observed failure): worker:1@node-b: exited (exit code 3)",
        "  its log, at the failure:",
        "    Traceback",
        "    ValueError: bad shape",
        "Also: node-c: unreachable",
        "    ssh: connect to host 10.0.0.3 port 22: timed out",
        "  hint: fix the model",
    ]


def test_multi_host_error_shows_the_hint_once():
    error = MultiHostError("preflight failed", [Failure("a", PsclusterError("a: ports: in use", hint="free them"))])
    assert str(error).count("free them") == 1


def test_multi_host_error_with_its_own_hint():
    root = PsclusterError("a: ssh: refused", hint="start sshd")
    error = MultiHostError("preflight failed", [Failure("a", root)], hint="see docs")
    assert error.hint == "see docs"
    assert str(error).splitlines()[0:2] == ["preflight failed", "Root cause (first observed failure): a: ssh: refused"]
    assert "start sshd" in str(error)                  # the root cause's own hint is not lost


def test_multi_host_error_without_failures():
    error = MultiHostError("nothing happened", [])
    assert error.root_cause is None
    assert str(error) == "nothing happened"


NUMPY_AFTER = "\n".join(["epoch 1 ...", "Traceback (most recent call last):",
                         *[f'  File "main.py", line {n}, in f{n}' for n in range(1, 10)],
                         "    model.fit(dataset)",
                         "ValueError: Attempt to convert a value (PerReplica:{0: <tf.Tensor ...>}) to a Tensor.",
                         *[f" [{n}. {n}. {n}.]" for n in range(40)]])


def test_the_root_cause_starts_at_the_exception_not_at_the_last_lines():
    """Issue 24 item 4: a log whose last 12 lines are rows of an array still shows the exception."""
    excerpt, found = failure_tail(NUMPY_AFTER)
    lines = excerpt.splitlines()
    assert found and lines[0] == "Traceback (most recent call last):" and lines[1] == "  ..."
    assert "ValueError: Attempt to convert a value (PerReplica:" in excerpt
    assert lines[-1] == "... (37 more line(s))" and len(lines) <= 14
    assert "its log, at the failure:" in str(TaskError("worker:0", "h", "exited", exit_code=1, log_tail=NUMPY_AFTER))


def test_an_error_line_without_a_traceback_is_found_too():
    log = "start\nloading\ntensorflow.python.framework.errors_impl.UnavailableError: socket closed\nrow 1\nrow 2"
    excerpt, found = failure_tail(log)
    assert found and excerpt.splitlines() == ["loading", "tensorflow.python.framework.errors_impl.UnavailableError: "
                                              "socket closed", "row 1", "row 2"]
    assert failure_tail("a\nb\nc") == ("a\nb\nc", False)
