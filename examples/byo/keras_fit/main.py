"""TensorFlow's "Multi-worker training with Keras" tutorial program: ``model.fit`` under
``tf.distribute.MultiWorkerMirroredStrategy``, every worker running this same file with its
``TF_CONFIG``, and the dataset and model in ``mnist_setup.py`` beside it.

With pscluster (TensorFlow 2.21: Keras 3's ``fit`` fails under the multi-worker strategies,
tf-keras' works, see the README, "Keras fit programs"):

    pip install 'pscluster[legacy-keras]'        # tf-keras, on every host
    pscluster run inventories/local.yaml --mode sync --keras legacy -- python examples/byo/keras_fit/main.py

``run`` gives each worker its TF_CONFIG and TF_USE_LEGACY_KERAS=1, and copies this folder
(main.py and mnist_setup.py) to hosts that do not share this checkout. The flags are
additions to the tutorial (whose values are their defaults); worker 0 ends by printing

    final test_accuracy=0.8512 test_loss=0.5233 epochs=3 seconds=41.2
"""
import argparse
import json
import os
import time

import tensorflow as tf

import mnist_setup

parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
parser.add_argument("--epochs", type=int, default=3)
parser.add_argument("--steps_per_epoch", type=int, default=70)
parser.add_argument("--per_worker_batch_size", type=int, default=64)
parser.add_argument("--learning_rate", type=float, default=0.001)
parser.add_argument("--data", help="mnist.npz (default: data/mnist.npz, else pscluster's bundled copy)")
args = parser.parse_args()
started = time.monotonic()

per_worker_batch_size = args.per_worker_batch_size
tf_config = json.loads(os.environ['TF_CONFIG'])
num_workers = len(tf_config['cluster']['worker'])

strategy = tf.distribute.MultiWorkerMirroredStrategy()

global_batch_size = per_worker_batch_size * num_workers
multi_worker_dataset = mnist_setup.mnist_dataset(global_batch_size, args.data)

with strategy.scope():
    # Model building/compiling need to be within `strategy.scope()`.
    multi_worker_model = mnist_setup.build_and_compile_cnn_model(args.learning_rate)

multi_worker_model.fit(multi_worker_dataset, epochs=args.epochs, steps_per_epoch=args.steps_per_epoch)

# Every worker evaluates (a collective, as fit is); worker 0 reports.
test_loss, test_accuracy = multi_worker_model.evaluate(
    mnist_setup.mnist_test_dataset(global_batch_size, args.data), verbose=0)
if tf_config['task']['index'] == 0:
    print(f"final test_accuracy={test_accuracy:.4f} test_loss={test_loss:.4f} epochs={args.epochs} "
          f"seconds={time.monotonic() - started:.1f}", flush=True)
