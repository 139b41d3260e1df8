"""roles.tfruntime: TensorFlow loads without matplotlib, which stays importable afterwards; a
standing server's import leaves Keras out, and ``tf.keras`` still loads it on first use."""
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
tf = import_tensorflow(ThreadConfig(), keras=os.environ.get("PROBE_KERAS") != "0")
keras_with_tf = "keras" in sys.modules
seconds = time.process_time() - began
loaded = "matplotlib" in sys.modules
import matplotlib.pyplot
layer = type(tf.keras.layers.Dense(2)).__module__
print(json.dumps({"loaded_with_tf": loaded, "seconds": seconds, "server": hasattr(tf.distribute, "Server"),
                  "later": "matplotlib.pyplot" in sys.modules, "keras_with_tf": keras_with_tf, "layer": layer}))
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


def test_a_servers_import_leaves_keras_out_and_tf_keras_loads_it_later():
    server, full = _probe(PROBE_KERAS="0"), _probe()
    assert server["keras_with_tf"] is False and full["keras_with_tf"] is True
    assert server["server"] and server["layer"].startswith("keras.") and server["later"]
