"""A parameter server moves to a spare in place, on real local TensorFlow servers (issue 44, TF13):
2 ps + an idle spare ps + 2 workers, a chief training an MLP 200 steps, ps:1's variables moved to
the spare (roles/psmove.py), 100 steps more; no step lost, the values carried over, nothing left
on ps:1, a checkpoint written after it reads back, and no server left running."""
from __future__ import annotations

import os

from benchmarks import ps_move
from tests.helpers import port_base


def test_a_ps_moves_to_a_spare_in_place(tmp_path):
    base = port_base()
    result = ps_move.trial("move-spare", tmp_path, ports=list(range(base, base + 6)))
    assert "failed" not in result, result
    assert result["placement"] == [0, 1]                    # the spare (ps:2) held nothing before
    assert result["moved_placement"] == [0, 2]
    assert result["steps_lost"] == 0
    assert result["step_end"] == result["step_before"] + ps_move.STEPS_AFTER
    assert result["equal"], (result["sum_before"], result["sum_moved"])
    assert result["checkpoint_after"]                       # saved after the move, read back equal
    for pid in result["server_pids"]:
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            continue
        raise AssertionError(f"server {pid} still runs")
