"""Shared pytest fixtures: the network-namespace SSH lab (testbed/netlab.py).

* ``lab3``      -- a 3-host lab shared by the tests of one module; hosts cut by
                   a test are healed after it.
* ``make_lab``  -- factory ``make_lab(n, **Lab_kwargs) -> started Lab``; every
                   lab it made is stopped at the end of the test.  The subnet
                   defaults to ``"auto"`` (a free 127.77.x.0/24) so labs can
                   coexist with each other and with a CLI-started lab.
* ``write_lab_inventory`` -- ``netlab.write_inventory(lab, path, groups, extra_vars)``.

All of them skip (with the reason) when the machine cannot run the lab: not
root, no ``ip``, no ``/usr/sbin/sshd``...

Lab directories live under ``$PSCLUSTER_LAB_DIR`` (default
``/tmp/pscluster-netlab``); labs left there by a crashed earlier run are reaped
at session start (only those whose owning process is gone).  A lab's directory
is removed after a clean stop unless ``PSCLUSTER_LAB_KEEP=1``.
"""

from __future__ import annotations

import os
import pathlib
import shutil
import signal
import tempfile

import pytest

from testbed import netlab

LAB_BASE = pathlib.Path(os.environ.get("PSCLUSTER_LAB_DIR", "/tmp/pscluster-netlab"))
KEEP_DIRS = os.environ.get("PSCLUSTER_LAB_KEEP") == "1"

write_lab_inventory = netlab.write_inventory  # plain helper, also a fixture below


def pytest_configure(config):
    """Tests send Ctrl-C (SIGINT) to the pscluster processes they start. A suite started in the
    background by a non-interactive shell (`bash .ci/run &`) inherits SIGINT *ignored*, and so
    would every process it starts (an ignored signal stays ignored across exec): pscluster would
    never see the Ctrl-C, and `train` ran to its end. The suite's children get the default."""
    if signal.getsignal(signal.SIGINT) is signal.SIG_IGN:
        signal.signal(signal.SIGINT, signal.default_int_handler)


def machine_busy_seconds() -> float | None:
    """CPU seconds this machine's cores spent busy since boot (all processes: /proc/stat's user,
    nice, system, irq, softirq and steal), or None where there is no /proc/stat."""
    try:
        with open("/proc/stat") as handle:
            fields = [int(v) for v in handle.readline().split()[1:9]]
    except (OSError, ValueError):
        return None
    user, nice, system, _idle, _iowait, irq, softirq, steal = (fields + [0] * 8)[:8]
    return (user + nice + system + irq + softirq + steal) / os.sysconf("SC_CLK_TCK")


_BUSY_AT_SETUP = pytest.StashKey[float]()


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_setup(item):
    """With ``pytest_runtest_teardown``: records the machine's busy CPU seconds over each test's
    setup, call and teardown as the JUnit property ``machine_cpu_seconds``. The suite is bound by
    CPU on 2 cores, so this, not the wall time, is what a test costs (the TensorFlow processes it
    starts included, which no rusage of the test process counts). Meaningful only on a machine
    that runs nothing else; scripts/suite_times.py sums it per area and file."""
    busy = machine_busy_seconds()
    if busy is not None:
        item.stash[_BUSY_AT_SETUP] = busy
    yield


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_teardown(item, nextitem):
    yield
    before, after = item.stash.get(_BUSY_AT_SETUP, None), machine_busy_seconds()
    if before is not None and after is not None:     # before the teardown's report, which JUnit reads
        item.user_properties.append(("machine_cpu_seconds", round(after - before, 2)))


EXTENDED = os.environ.get("PSCLUSTER_EXTENDED") == "1"


def pytest_collection_modifyitems(config, items):
    """Tests marked ``extended`` repeat, for another mode or path, a capability that another test
    of the suite proves end to end (docs/testing.md names it). The suite that CI runs leaves them
    out, so it stays within its 25 minutes; ``bash scripts/test.sh --extended`` (or
    ``PSCLUSTER_EXTENDED=1``) runs them too, and a test named on the command line
    (``path::name``) always runs."""
    if EXTENDED:
        return
    named = {arg.split("[")[0] for arg in config.args if "::" in arg}
    kept, left = [], []
    for item in items:
        if item.get_closest_marker("extended") and item.nodeid.split("[")[0] not in named:
            left.append(item)
        else:
            kept.append(item)
    if left:
        config.hook.pytest_deselected(items=left)
        items[:] = kept


@pytest.fixture(scope="session")
def lab_base() -> pathlib.Path:
    """Directory holding this session's labs; reaps stale labs once."""
    try:
        netlab.check_available()
    except netlab.LabUnavailable as e:
        pytest.skip(f"network lab unavailable: {e.reason}")
    LAB_BASE.mkdir(parents=True, exist_ok=True)
    netlab.reap_stale(LAB_BASE)
    return LAB_BASE


def _start_lab(base: pathlib.Path, n: int, **kw) -> netlab.Lab:
    kw.setdefault("subnet", "auto")
    root = kw.pop("root_dir", None)
    if root is None:
        root = pathlib.Path(tempfile.mkdtemp(prefix=f"lab{n}-", dir=base))
    lab = netlab.Lab(n, pathlib.Path(root), **kw)
    try:
        lab.start()
    except BaseException as e:
        if not KEEP_DIRS and lab.root_dir.parent == base:
            shutil.rmtree(lab.root_dir, ignore_errors=True)
        if isinstance(e, netlab.LabUnavailable):
            pytest.skip(f"network lab unavailable: {e.reason}")
        raise
    return lab


def _stop_lab(lab: netlab.Lab) -> None:
    lab.stop()
    if not KEEP_DIRS and lab.root_dir.parent == LAB_BASE:
        shutil.rmtree(lab.root_dir, ignore_errors=True)


@pytest.fixture
def make_lab(lab_base):
    """Factory: ``lab = make_lab(4, subnet="127.78.0", tag="x1")``."""
    labs: list[netlab.Lab] = []

    def factory(n: int, **kw) -> netlab.Lab:
        lab = _start_lab(lab_base, n, **kw)
        labs.append(lab)
        return lab

    yield factory
    errors = []
    for lab in reversed(labs):
        try:
            _stop_lab(lab)
        except Exception as e:  # stop them all, then report
            errors.append(e)
    if errors:
        raise errors[0]


@pytest.fixture(scope="module")
def _lab3_module(lab_base):
    lab = _start_lab(lab_base, 3)
    yield lab
    _stop_lab(lab)


@pytest.fixture
def lab3(_lab3_module):
    """A running 3-host lab (node-1..node-3), shared within the module."""
    yield _lab3_module
    _lab3_module.heal_all()


@pytest.fixture(name="write_lab_inventory")
def _write_lab_inventory_fixture():
    return netlab.write_inventory
