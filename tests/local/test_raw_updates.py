"""roles.raw_updates: the fused kernels give Keras' own update, to float32 round-off.

Async mode applies a supported optimizer's update as one TensorFlow kernel per variable
instead of Keras 3's ops (docs/benchmarks.md). Here both paths run side by side on
identical variables for a few steps of the same gradients, in a tf.function as in the
driver, and every variable, slot and the step counter must agree. Settings without an
exact kernel must be refused, so that the driver keeps Keras' path for them.
"""
from __future__ import annotations

import json
import subprocess
import sys
import textwrap

import pytest

from tests.helpers import REPO

pytestmark = pytest.mark.tf

SCRIPT = textwrap.dedent("""
    import json
    import numpy as np
    import keras
    import tensorflow as tf
    from roles.raw_updates import fused_apply, unsupported

    def model():
        keras.utils.set_random_seed(3)
        m = keras.Sequential([keras.Input((6,)), keras.layers.Dense(5, activation="relu"),
                              keras.layers.Dense(3)])
        return m

    CASES = {
        "adam": lambda: keras.optimizers.Adam(2e-3),
        "adam-b1-eps": lambda: keras.optimizers.Adam(1e-2, beta_1=0.5, beta_2=0.99, epsilon=1e-4),
        "sgd": lambda: keras.optimizers.SGD(0.1),
        "momentum": lambda: keras.optimizers.SGD(0.05, momentum=0.9),
        "nesterov": lambda: keras.optimizers.SGD(0.05, momentum=0.9, nesterov=True),
    }
    out = {"diff": {}, "refused": {}}
    rng = np.random.default_rng(0)
    for name, make in CASES.items():
        paths = []
        for fused in (False, True):
            m, opt = model(), make()
            opt.build(m.trainable_variables)
            apply = fused_apply(opt, m.trainable_variables) if fused else None
            assert (apply is None) != fused, (name, unsupported(opt, m.trainable_variables))
            grads = [[tf.constant(np.random.default_rng(s * 10 + i).normal(size=v.shape), tf.float32)
                      for i, v in enumerate(m.trainable_variables)] for s in range(6)]

            @tf.function
            def step(g):
                if apply is None:
                    opt.apply_gradients(zip(g, m.trainable_variables))
                else:
                    apply(g)

            for g in grads:
                step(g)
            paths.append([np.array(v) for v in list(m.trainable_variables) + list(opt.variables)])
        keras_path, fused_path = paths
        out["diff"][name] = max(float(np.max(np.abs(a - b))) for a, b in zip(keras_path, fused_path))
        out.setdefault("moved", {})[name] = max(float(np.max(np.abs(a - b)))
                                                for a, b in zip(keras_path, [np.array(v) for v in model().trainable_variables]))
        out.setdefault("steps", {})[name] = int(opt.iterations.numpy())

    REFUSED = {
        "rmsprop": lambda: keras.optimizers.RMSprop(1e-3),
        "amsgrad": lambda: keras.optimizers.Adam(1e-3, amsgrad=True),
        "weight_decay": lambda: keras.optimizers.Adam(1e-3, weight_decay=0.01),
        "clipnorm": lambda: keras.optimizers.SGD(0.1, clipnorm=1.0),
        "schedule": lambda: keras.optimizers.Adam(keras.optimizers.schedules.ExponentialDecay(1e-3, 10, 0.9)),
    }
    for name, make in REFUSED.items():
        m, opt = model(), make()
        opt.build(m.trainable_variables)
        out["refused"][name] = [fused_apply(opt, m.trainable_variables) is None,
                                unsupported(opt, m.trainable_variables)]
    print(json.dumps(out))
""")


@pytest.fixture(scope="module")
def result() -> dict:
    proc = subprocess.run([sys.executable, "-c", SCRIPT], cwd=REPO, capture_output=True, text=True,
                          timeout=300, env={"PYTHONPATH": str(REPO), "TF_CPP_MIN_LOG_LEVEL": "2",
                                            "PATH": "/usr/bin:/bin"})
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


@pytest.mark.parametrize("case", ["adam", "adam-b1-eps", "sgd", "momentum", "nesterov"])
def test_fused_kernels_match_keras_updates(result, case):
    # Every variable, slot and the counter after 6 steps; the variables really moved.
    assert result["diff"][case] < 1e-5, result["diff"]
    assert result["moved"][case] > 1e-3, result["moved"]
    assert result["steps"][case] == 6


@pytest.mark.parametrize("case", ["rmsprop", "amsgrad", "weight_decay", "clipnorm", "schedule"])
def test_settings_without_an_exact_kernel_keep_keras_path(result, case):
    refused, reason = result["refused"][case]
    assert refused and reason, result["refused"]
