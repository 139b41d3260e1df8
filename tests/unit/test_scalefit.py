"""benchmarks/scalefit.py and the pure parts of the many-hosts lab: fits checked by hand on
points that lie exactly on a line or a power, projections, the first limit reached, the table."""
from __future__ import annotations

import math

import pytest

from benchmarks import scalefit
from benchmarks.scale import steady_cores
from testbed import manylab, standin
from cluster.hosts.probe import parse_get_status


def test_a_line_is_fitted_as_a_line_and_projected():
    fit = scalefit.best_fit([4, 16, 64], [1.4, 2.6, 7.4])        # 1 + 0.1·N
    assert fit.kind == "linear"
    assert fit.a == pytest.approx(1.0) and fit.b == pytest.approx(0.1)
    assert fit.at(1000) == pytest.approx(101.0)
    assert fit.reaches(11.0) == pytest.approx(100.0)


def test_a_square_is_fitted_as_a_power_of_two():
    fit = scalefit.best_fit([4, 16, 64], [0.16, 2.56, 40.96])    # 0.01·N²
    assert fit.kind == "power"
    assert fit.a == pytest.approx(0.01) and fit.b == pytest.approx(2.0)
    assert fit.at(1000) == pytest.approx(10000.0)
    assert fit.reaches(100.0) == pytest.approx(100.0)


def test_a_flat_figure_never_reaches_a_limit_above_it():
    fit = scalefit.best_fit([4, 16, 64], [50.0, 50.0, 50.0])
    assert fit.kind == "linear" and fit.b == pytest.approx(0.0)
    assert fit.reaches(1024) is None
    assert fit.reaches(10) == 1.0      # already past it at one host


def test_a_fit_needs_two_sizes_and_a_power_positive_values():
    with pytest.raises(ValueError):
        scalefit.fit_linear([16, 16], [1.0, 2.0])
    assert scalefit.fit_power([4, 16], [0.0, 1.0]) is None


ROWS = [
    {"hosts": 4, "phase": "up", "wall_s": 6.0, "fds": 12, "threads": 10},
    {"hosts": 16, "phase": "up", "wall_s": 9.0, "fds": 36, "threads": 10},
    {"hosts": 64, "phase": "up", "wall_s": 21.0, "fds": 132, "threads": 10},
    {"hosts": 4, "phase": "down", "wall_s": 2.0, "left": 0},
    {"hosts": 16, "phase": "down", "wall_s": 3.0, "left": 0},
]


def test_the_limit_reached_first_leads_and_one_never_reached_comes_last():
    limits = [scalefit.Limit("up", "threads", 32768, "pid_max"),
              scalefit.Limit("up", "fds", 1024, "ulimit -n"),
              scalefit.Limit("up", "wall_s", 30.0, "a goal")]
    found = scalefit.first_exhausted(ROWS, limits)
    assert [(e.limit.what, e.hosts) for e in found] == [
        ("a goal", pytest.approx(100.0)),         # 5 + 0.25·N
        ("ulimit -n", pytest.approx(510.0)),      # 4 + 2·N
        ("pid_max", None)]


def test_the_table_orders_sizes_then_phases_and_prints_integers_plainly():
    header, body = scalefit.table(list(reversed(ROWS)))
    assert header[:3] == ["hosts", "phase", "wall_s"] and header[-1] == "left"
    assert [row[:2] for row in body] == [["4", "up"], ["4", "down"], ["16", "up"], ["16", "down"], ["64", "up"]]
    up4 = dict(zip(header, body[0]))
    assert (up4["wall_s"], up4["fds"], up4["cores"], up4["left"]) == ("6", "12", "-", "-")
    assert dict(zip(header, body[1]))["left"] == "0"


def test_the_projection_table_has_a_row_per_fitted_figure():
    header, body = scalefit.projection_table(ROWS, targets=(1000,))
    assert header == ["phase", "metric", "fit", "N=1000"]
    rows = {(r[0], r[1]): r for r in body}
    assert rows[("up", "wall_s")][3] == "255"
    assert rows[("down", "wall_s")][2] == "1.67 + 0.0833·N"
    assert ("down", "fds") not in rows


def test_steady_cores_is_the_cpu_rate_between_the_window_samples():
    points = [(0.0, 1.0), (10.0, 2.0), (20.0, 2.5), (30.0, 3.0)]
    assert steady_cores(points, 10.0, 30.0) == pytest.approx(0.05)
    assert steady_cores(points[:1], 0.0, 30.0) is None


def test_manylab_addresses_fill_a_slash_16_253_hosts_per_slash_24():
    assert manylab.address_of("127.79", 1) == "127.79.0.2"
    assert manylab.address_of("127.79", 253) == "127.79.0.254"
    assert manylab.address_of("127.79", 254) == "127.79.1.2"
    assert manylab.address_of("127.79", 1023) == "127.79.4.12"


def test_manylab_refuses_sizes_and_subnets_it_cannot_hold(tmp_path):
    with pytest.raises(ValueError, match="1 to 1023"):
        manylab.ManyLab(1024, tmp_path)
    with pytest.raises(ValueError, match="/16"):
        manylab.ManyLab(4, tmp_path, subnet="127.79.3")


def test_inventory_groups_put_a_ps_and_a_worker_on_every_host():
    assert manylab.inventory_groups(["a", "b", "c"]) == {"ps": ["a", "b", "c"], "worker": ["a", "b", "c"]}
    assert manylab.inventory_groups(["a", "b", "c"], ps_every=2)["ps"] == ["a", "c"]


def test_the_standin_status_reply_decodes_as_a_tensorflow_servers():
    (device,) = parse_get_status(standin.get_status_response("ps", 3))
    assert device.name == "/job:ps/replica:0/task:3/device:CPU:0"
    assert (device.device_type, device.memory_limit) == ("CPU", 268435456)


def test_the_standin_reads_its_task_from_tf_config():
    config = '{"cluster": {"ps": ["h1:42000", "h2:42000"]}, "task": {"type": "ps", "index": 1}}'
    assert standin.task_of(config) == ("ps", 1, "h2:42000")


def test_an_http2_frame_header_round_trips():
    raw = standin.frame(standin.HEADERS, standin.END_HEADERS, 5, b"abc")
    assert standin._header(raw[:9]) == (3, standin.HEADERS, standin.END_HEADERS, 5)
    assert raw[9:] == b"abc"


def test_up_is_projected_from_the_work_per_host_with_the_waits_share_taken_out():
    """work = CPU - idle·N·wall, a line from 16 hosts up; W = (wall16 + slope·984) / (1 - idle·1000).
    At 1 ms a host and second the 1,000 hosts' waiting alone takes a core: never done."""
    rows = [{"hosts": 16, "phase": "up", "cpu_s": 1.0, "wall_s": 5.0},
            {"hosts": 64, "phase": "up", "cpu_s": 3.0, "wall_s": 20.0},
            {"hosts": 64, "phase": "check", "cpu_s": 99.0, "wall_s": 99.0}]
    assert scalefit.project_up(rows, 1000.0).ratio == math.inf
    projected = scalefit.project_up(rows, 100.0)
    slope = ((3.0 - 0.0001 * 64 * 20) - (1.0 - 0.0001 * 16 * 5)) / 48
    assert projected.per_host == pytest.approx(slope)
    assert projected.wall == pytest.approx((5.0 + slope * 984) / 0.9)
    assert projected.ratio == pytest.approx(projected.wall / 5.0)
    assert scalefit.project_up(rows[1:], 100.0) is None            # no 16-host run
    assert scalefit.project_up(rows[:1], 100.0) is None            # nothing larger


def test_up_with_helpers_is_the_base_time_plus_the_longer_of_the_control_process_and_the_busiest_helper():
    parent = {64: 0.5 + 0.004 * 64, 256: 0.5 + 0.004 * 256}            # 4 ms a host here
    # helpers: 20 ms a host of work, plus 100 µs a host and second while up waits 30 s
    helpers = {64: (0.8 + 0.020 * 64 + 1e-4 * 64 * 30, 30.0), 256: (0.8 + 0.020 * 256 + 1e-4 * 256 * 30, 30.0)}
    projected = scalefit.project_spread_up(6.0, parent, helpers, 100.0, hosts=1000, helper_count=8)
    assert projected.parent_slope == pytest.approx(0.004) and projected.helper_slope == pytest.approx(0.020)
    assert projected.parent_s == pytest.approx(0.004 * 984)
    assert projected.helper_s == pytest.approx(0.020 * 125 / (1 - 1e-4 * 125))      # its wait paid again
    assert projected.wall_s == pytest.approx(6.0 + 0.004 * 984)       # the control process is the longer
    assert projected.ratio == pytest.approx(projected.wall_s / 6.0)
    one_helper = scalefit.project_spread_up(6.0, parent, helpers, 100.0, hosts=1000, helper_count=1)
    assert one_helper.wall_s == pytest.approx(6.0 + 0.020 * 1000 / (1 - 0.1))     # the helper is
    assert scalefit.project_spread_up(6.0, parent, helpers, 1000.0, helper_count=1).wall_s == math.inf
    with pytest.raises(ValueError):
        scalefit.project_spread_up(6.0, {64: 1.0}, helpers, 100.0)
