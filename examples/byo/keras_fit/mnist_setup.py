"""The helper module of TensorFlow's "Multi-worker training with Keras" tutorial, as it is
written there, except that MNIST comes from a local file (no download at run time): the
dataset and the compiled CNN, with ``tf.keras`` (so ``TF_USE_LEGACY_KERAS=1`` switches it to
tf-keras, which is what ``pscluster run --keras legacy`` sets)."""
import os

import numpy as np
import tensorflow as tf

HERE = os.path.dirname(os.path.abspath(__file__))
# Where a local copy of MNIST is looked for, first found wins: ./data/mnist.npz, then the copy
# bundled with pscluster (beside this folder in a checkout, or in a host's workdir).
DATA_CANDIDATES = (
    os.path.join("data", "mnist.npz"),
    os.path.join(HERE, "data", "mnist.npz"),
    os.path.join(HERE, "..", "..", "distributed_mnist", "data", "mnist.npz"),
    os.path.join("examples", "distributed_mnist", "data", "mnist.npz"),
)


def load_mnist(path=None):
    """((x_train, y_train), (x_test, y_test)) from a local mnist.npz (the file
    tf.keras.datasets.mnist.load_data() would download)."""
    for candidate in ([path] if path else DATA_CANDIDATES):
        if os.path.isfile(candidate):
            with np.load(candidate) as arrays:
                return ((arrays["x_train"], arrays["y_train"]), (arrays["x_test"], arrays["y_test"]))
    raise SystemExit("no MNIST file found: pass --data PATH/mnist.npz")


def mnist_dataset(batch_size, path=None):
    (x_train, y_train), _ = load_mnist(path)
    # The `x` arrays are in uint8 and have values in the [0, 255] range.
    # You need to convert them to float32 with values in the [0, 1] range.
    x_train = x_train / np.float32(255)
    y_train = y_train.astype(np.int64)
    train_dataset = tf.data.Dataset.from_tensor_slices(
        (x_train, y_train)).shuffle(60000).repeat().batch(batch_size)
    return train_dataset


def mnist_test_dataset(batch_size, path=None):
    _, (x_test, y_test) = load_mnist(path)
    return tf.data.Dataset.from_tensor_slices(
        (x_test / np.float32(255), y_test.astype(np.int64))).batch(batch_size)


def build_and_compile_cnn_model(learning_rate=0.001):
    model = tf.keras.Sequential([
        tf.keras.layers.InputLayer(input_shape=(28, 28)),
        tf.keras.layers.Reshape(target_shape=(28, 28, 1)),
        tf.keras.layers.Conv2D(32, 3, activation='relu'),
        tf.keras.layers.Flatten(),
        tf.keras.layers.Dense(128, activation='relu'),
        tf.keras.layers.Dense(10)
    ])
    model.compile(
        loss=tf.keras.losses.SparseCategoricalCrossentropy(from_logits=True),
        optimizer=tf.keras.optimizers.SGD(learning_rate=learning_rate),
        metrics=['accuracy'])
    return model
