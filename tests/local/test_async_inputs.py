"""What async mode ships to its workers, checked on real TensorFlow graphs.

In async mode the chief traces each worker's input pipeline into a function and sends it
to the workers. Arrays that become constants of that graph are copied several times by
every worker's graph optimizer: 47 MB of MNIST cost about 4 s of start-up
(docs/benchmarks.md). distributed_mnist's ``dataset`` makes them eager tensors, which the
function captures as inputs. The chief's evaluation reads the variables once per pass
(``make_evaluator(read_once=True)``) and must give the sums the plain evaluator gives.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap

import pytest

from tests.helpers import REPO

pytestmark = pytest.mark.tf

SCRIPT = textwrap.dedent("""
    import json
    import numpy as np
    import tensorflow as tf
    from roles.datasets import eval_dataset
    from roles.evaluation import make_evaluator
    from roles.jobs import Shard, load_job

    job = load_job("examples/distributed_mnist")
    # As the async driver traces it: the worker's index is a tensor.
    pipeline = tf.function(lambda i: job.dataset(Shard(index=i, count=2, split="train", seed=1)))
    concrete = pipeline.get_concrete_function(tf.TensorSpec([], tf.int64))
    captured = sum(int(np.prod(t.shape)) * t.dtype.size for t in concrete.captured_inputs)

    model = job.build_model()
    data = eval_dataset(job, Shard(0, 1, "test", 1), 500)
    model(next(iter(data))[0][:2])
    plain = make_evaluator(job, model)(data).numpy().tolist()
    once = make_evaluator(job, model, read_once=True)(data).numpy().tolist()
    print(json.dumps({"graph_bytes": concrete.graph.as_graph_def().ByteSize(),
                      "captured_bytes": captured, "plain": plain, "once": once}))
""")


@pytest.fixture(scope="module")
def measured():
    env = dict(os.environ, PYTHONPATH=str(REPO), TF_CPP_MIN_LOG_LEVEL="2", MNIST_MODEL="cnn",
               OMP_NUM_THREADS="1")
    proc = subprocess.run([sys.executable, "-c", SCRIPT], cwd=REPO, env=env, capture_output=True,
                          text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


def test_worker_pipeline_carries_the_arrays_as_inputs_not_graph_constants(measured):
    assert measured["graph_bytes"] < 100_000, measured["graph_bytes"]      # was 47,101,856
    assert measured["captured_bytes"] >= 60_000 * 28 * 28, measured["captured_bytes"]


def test_evaluation_on_values_read_once_matches_the_plain_pass(measured):
    loss, correct, count = measured["once"]
    assert count == 10_000
    assert correct == measured["plain"][1]
    assert loss == pytest.approx(measured["plain"][0], rel=1e-6)
