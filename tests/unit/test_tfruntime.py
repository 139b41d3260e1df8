"""roles.tfruntime: TensorFlow loads without matplotlib, which stays importable afterwards; a
standing server's import leaves Keras out, and ``tf.keras`` still loads it on first use."""
from __future__ import annotations

import functools
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


@functools.cache     # one TensorFlow import per environment (~6 CPU-s each), shared by the tests
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


SERVER_PROBE = """
import json, socket, sys, time
from roles.tfconfig import ThreadConfig
from roles.tfruntime import import_server_runtime, server_config
began = time.process_time()
rt = import_server_runtime(ThreadConfig(intra_op=1))
with socket.socket() as s:
    s.bind(("127.0.0.1", 0)); port = s.getsockname()[1]
server = rt.Server(rt.ClusterSpec({"worker": ["127.0.0.1:%d" % port]}), job_name="worker", task_index=0,
                   protocol="grpc", config=server_config(rt, ThreadConfig(intra_op=1)), start=True)
seconds = time.process_time() - began
modules = sum(1 for m in sys.modules if m == "tensorflow" or m.startswith("tensorflow."))
api = "tensorflow._api.v2" in sys.modules or "keras" in sys.modules
try:
    rt.Server(rt.ClusterSpec({"worker": ["127.0.0.1:%d" % port]}), job_name="worker", task_index=0,
              protocol="grpc", start=True)
    busy = "started"
except rt.start_errors as e:
    busy = type(e).__name__
import tensorflow as tf                  # the real package afterwards, as TensorFlow loads it
value = int(tf.constant(2) + 1)
print(json.dumps({"light": rt.light, "modules": modules, "api": api, "busy": busy, "value": value,
                  "target": server.target, "full": hasattr(tf.distribute, "Server")}))
"""


def _server_probe(**env):
    out = subprocess.run([sys.executable, "-c", SERVER_PROBE], cwd=REPO, capture_output=True, text=True,
                         timeout=300, env={"PATH": "/usr/bin:/bin", "TF_CPP_MIN_LOG_LEVEL": "2",
                                           "PYTHONPATH": str(REPO), **env})
    assert out.returncode == 0, out.stderr[-2000:]
    return json.loads(out.stdout.splitlines()[-1])


def test_a_server_loads_only_tensorflows_server_modules_and_tensorflow_loads_in_full_later():
    light = _server_probe()
    assert light["light"] is True and light["target"].startswith("grpc://127.0.0.1:")
    # The whole API is ~2,300 modules; the server's own part a few hundred, no API tree, no Keras.
    assert light["modules"] < 600 and light["api"] is False, light
    assert light["busy"] == "UnknownError"          # a taken port is the error roles.server reports
    assert light["value"] == 3 and light["full"] is True


def test_a_plugin_folder_or_the_escape_hatch_loads_tensorflow_in_full(tmp_path):
    assert _server_probe(PSCLUSTER_TF_FULL_IMPORT="1")["light"] is False
    # TensorFlow loads every library in a tensorflow-plugins folder beside any site-packages on
    # sys.path; a server must run those kernels too, so it takes the full import.
    plugins = tmp_path / "site-packages" / "tensorflow-plugins"
    plugins.mkdir(parents=True)
    full = _server_probe(PYTHONPATH=f"{REPO}:{tmp_path / 'site-packages'}")
    assert full["light"] is False and full["api"] is True and full["busy"] == "UnknownError"
