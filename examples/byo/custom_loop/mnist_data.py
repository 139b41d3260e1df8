"""The helper module of ``main.py``: MNIST from a local file, sharded per worker, and the model.
It lies beside ``main.py`` and is imported by name (``import mnist_data``), which works because
Python puts the script's folder first on ``sys.path``; ``pscluster run`` copies the folder to
hosts that do not share this checkout, so it works there too."""
import os

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
# First found wins: ./data/mnist.npz, a copy beside this file, then the one bundled with
# pscluster (beside this folder in a checkout, or below a host's workdir).
DATA_CANDIDATES = (
    os.path.join("data", "mnist.npz"),
    os.path.join(HERE, "data", "mnist.npz"),
    os.path.join(HERE, "..", "..", "distributed_mnist", "data", "mnist.npz"),
    os.path.join("examples", "distributed_mnist", "data", "mnist.npz"),
)


def load(path=None):
    """(x_train, y_train, x_test, y_test) as uint8 images and int64 labels."""
    for candidate in ([path] if path else DATA_CANDIDATES):
        if os.path.isfile(candidate):
            with np.load(candidate) as arrays:
                return (arrays["x_train"], arrays["y_train"].astype(np.int64),
                        arrays["x_test"], arrays["y_test"].astype(np.int64))
    raise SystemExit(f"no MNIST file found (tried {', '.join(DATA_CANDIDATES)}): pass --data PATH/mnist.npz")


def dataset_fn(tf, x_train, y_train, global_batch):
    """The per-worker input function of ``distribute_datasets_from_function``: each worker
    reads its own shard, and the global batch is split over the workers."""
    def make(context):
        data = tf.data.Dataset.from_tensor_slices((x_train, y_train))
        data = data.shard(context.num_input_pipelines, context.input_pipeline_id)
        data = data.shuffle(10_000, seed=1234 + context.input_pipeline_id).repeat()
        return data.batch(context.get_per_replica_batch_size(global_batch)).prefetch(2)
    return make


def build_model(keras):
    """A 784-256-10 MLP (logits)."""
    model = keras.Sequential([keras.layers.Rescaling(1.0 / 255), keras.layers.Flatten(),
                              keras.layers.Dense(256, activation="relu"), keras.layers.Dense(10)])
    model.build((None, 28, 28))
    return model
