"""A TF_CONFIG + MultiWorkerMirroredStrategy custom loop split over two files, as programs
grow: this script and ``mnist_data.py`` beside it (data and model), imported by name.

    pscluster run inventories/local.yaml --mode sync -- python examples/byo/custom_loop/main.py

Hosts that do not share this checkout get the whole folder (``run`` copies the script's
folder, less what ``.gitignore`` / ``.psclusterignore`` leave out), and a host that lacks a
module the two files import (numpy, tensorflow) is named before anything starts. Worker 0
ends by printing

    final test_accuracy=0.9650 test_loss=0.1180 steps=600 seconds=21.0
"""
import argparse
import json
import os
import sys
import time

import numpy as np

import mnist_data

parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
parser.add_argument("--steps", type=int, default=600)
parser.add_argument("--batch_size", type=int, default=128, help="global batch, split over the workers (a multiple of their number)")
parser.add_argument("--learning_rate", type=float, default=1e-3)
parser.add_argument("--data", help="mnist.npz (default: data/mnist.npz, else pscluster's bundled copy)")
args = parser.parse_args()
started = time.monotonic()
task = json.loads(os.environ["TF_CONFIG"])["task"]

import keras               # noqa: E402  (after the flags: --help needs no TensorFlow)
import tensorflow as tf    # noqa: E402

strategy = tf.distribute.MultiWorkerMirroredStrategy()
x_train, y_train, x_test, y_test = mnist_data.load(args.data)
with strategy.scope():
    model = mnist_data.build_model(keras)
    optimizer = keras.optimizers.Adam(args.learning_rate)
    optimizer.build(model.trainable_variables)
iterator = iter(strategy.distribute_datasets_from_function(
    mnist_data.dataset_fn(tf, x_train, y_train, args.batch_size)))
cross_entropy = keras.losses.SparseCategoricalCrossentropy(from_logits=True, reduction="none")


def step_fn(images, labels):
    with tf.GradientTape() as tape:
        per_example = cross_entropy(labels, model(images, training=True))
        loss = tf.nn.compute_average_loss(per_example, global_batch_size=args.batch_size)
    grads = tape.gradient(loss, model.trainable_variables)
    optimizer.apply_gradients(zip(grads, model.trainable_variables))     # all-reduces the gradients
    return loss


@tf.function
def train_step(it):
    images, labels = next(it)
    return strategy.reduce(tf.distribute.ReduceOp.SUM, strategy.run(step_fn, args=(images, labels)), axis=None)


for step in range(1, args.steps + 1):
    loss = float(train_step(iterator))
    if step % 100 == 0:
        print(f"{task['type']} {task['index']}: step {step}/{args.steps}, loss {loss:.4f}", flush=True)
# One last collective: every worker has finished every step before anyone leaves.
strategy.reduce(tf.distribute.ReduceOp.SUM, strategy.run(lambda: tf.constant(1.0)), axis=None)
if task["index"] == 0:
    # A plain call outside strategy.run reads this worker's copy of the variables: no collective.
    logits = np.concatenate([model(x_test[i:i + 2000], training=False).numpy() for i in range(0, len(x_test), 2000)])
    accuracy = float(np.mean(np.argmax(logits, axis=1) == y_test))
    test_loss = float(np.mean(cross_entropy(y_test, logits)))
    print(f"final test_accuracy={accuracy:.4f} test_loss={test_loss:.4f} steps={args.steps} "
          f"seconds={time.monotonic() - started:.1f}", flush=True)
sys.stdout.flush()
os._exit(0)     # destroying a distributed iterator can stall for seconds in TensorFlow's teardown
