"""roles.tfruntime: TensorFlow loads without matplotlib, which stays importable afterwards."""
from __future__ import annotations

import json
import subprocess
import sys

import pytest

from tests.helpers import REPO

pytest.importorskip("matplotlib")

PROBE = """
import json, os, sys, time
from roles.tfconfig import ThreadConfig
from roles.tfruntime import import_tensorflow
began = time.process_time()
tf = import_tensorflow(ThreadConfig())
seconds = time.process_time() - began
loaded = "matplotlib" in sys.modules
import matplotlib.pyplot
print(json.dumps({"loaded_with_tf": loaded, "seconds": seconds, "server": hasattr(tf.distribute, "Server"),
                  "later": "matplotlib.pyplot" in sys.modules}))
"""


def _probe(**env):
    out = subprocess.run([sys.executable, "-c", PROBE], cwd=REPO, capture_output=True, text=True, timeout=300,
                         env={"PATH": "/usr/bin:/bin", "TF_CPP_MIN_LOG_LEVEL": "2", "PYTHONPATH": str(REPO), **env})
    assert out.returncode == 0, out.stderr[-2000:]
    return json.loads(out.stdout.splitlines()[-1])


def test_tensorflow_loads_without_matplotlib_and_matplotlib_loads_after():
    hidden = _probe()
    assert hidden["loaded_with_tf"] is False and hidden["server"] and hidden["later"]


def test_the_escape_hatch_loads_it_as_tensorflow_would():
    assert _probe(PSCLUSTER_TF_PLOTTING="1")["loaded_with_tf"] is True
