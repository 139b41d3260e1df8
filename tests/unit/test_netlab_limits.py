"""The SSH lab raises the kernel's shared neighbour-table limits for labs whose hosts all talk
to each other (testbed/netlab.py): one ARP table serves every network namespace, and past its
hard limit (1024 entries by default) the kernel drops packets, so 49 of each host's 63
connects timed out in the 64-host preflight before the limits were raised."""
from __future__ import annotations

from testbed.netlab import _raise_neighbour_limits, neighbour_limits


def _sysctls(folder, thresh2: int, thresh3: int):
    (folder / "gc_thresh2").write_text(f"{thresh2}\n")
    (folder / "gc_thresh3").write_text(f"{thresh3}\n")


def test_limits_leave_room_for_every_pair_of_hosts():
    limits = neighbour_limits(64)
    assert limits["gc_thresh3"] >= 2 * 64 * 63 and limits["gc_thresh2"] >= 64 * 63
    assert limits["gc_thresh2"] < limits["gc_thresh3"]


def test_a_big_lab_raises_the_kernel_defaults(tmp_path):
    _sysctls(tmp_path, 512, 1024)
    _raise_neighbour_limits(64, tmp_path)
    assert int((tmp_path / "gc_thresh2").read_text()) == neighbour_limits(64)["gc_thresh2"]
    assert int((tmp_path / "gc_thresh3").read_text()) == neighbour_limits(64)["gc_thresh3"]


def test_limits_are_never_lowered(tmp_path):
    """Another lab (or the machine's admin) may need more: a small lab leaves them alone."""
    _sysctls(tmp_path, 512, 1024)
    _raise_neighbour_limits(3, tmp_path)
    assert (tmp_path / "gc_thresh2").read_text() == "512\n" and (tmp_path / "gc_thresh3").read_text() == "1024\n"


def test_an_unreadable_sysctl_is_no_error(tmp_path):
    _raise_neighbour_limits(64, tmp_path / "missing")           # e.g. a kernel without the file
    assert not (tmp_path / "missing").exists()                   # nothing made up in its place
