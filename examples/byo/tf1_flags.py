"""Classic between-graph replicated training, TF1 style: the script people run by hand.

    python tf1_flags.py --ps_hosts=h1:2222,h2:2222 --worker_hosts=h1:2223,h2:2223 \
        --job_name=worker --task_index=1

one terminal per process, parameter servers sitting in ``server.join()`` forever. With
pscluster the same file runs unchanged on every task:

    pscluster run inventories/local.yaml --on ps,worker -- python examples/byo/tf1_flags.py \
        --ps_hosts={ps_hosts} --worker_hosts={worker_hosts} \
        --job_name={job_name} --task_index={task_index}

What it does: ``tf.compat.v1`` graph, variables placed on the ps tasks by
``replica_device_setter``, a 784-256-10 MLP on MNIST trained with Adam through a
``MonitoredTrainingSession`` (asynchronous updates; ``--sync_replicas`` wraps the optimizer
in ``SyncReplicasOptimizer`` so every step averages one gradient per worker). Worker 0 (the
chief) evaluates the test split at the end and prints one line

    final test_accuracy=0.9612 test_loss=0.1301 steps=2000 seconds=41.2

Workers end with ``os._exit`` once their result is printed: TensorFlow's teardown of a
distributed TF1 session can wait on peers that are already gone.
"""
from __future__ import annotations

import argparse
import os
import sys
import time

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
# Where the data is looked for when --data is not given: beside the working directory (a
# project folder with data/mnist.npz), then the copy shipped with pscluster's example job.
DATA_CANDIDATES = ("data/mnist.npz", os.path.join(HERE, "..", "distributed_mnist", "data", "mnist.npz"))


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--ps_hosts", required=True, help="comma-separated host:port of the ps tasks")
    parser.add_argument("--worker_hosts", required=True, help="comma-separated host:port of the workers")
    parser.add_argument("--job_name", required=True, choices=["ps", "worker", "chief"], metavar="{ps,worker}",
                        help="this process's job (TF1 between-graph training has no 'chief' job: "
                             "worker 0 is the chief)")
    parser.add_argument("--task_index", type=int, required=True)
    parser.add_argument("--steps", type=int, default=2000, help="global steps to train (default 2000)")
    parser.add_argument("--batch_size", type=int, default=100, help="examples per worker step")
    parser.add_argument("--learning_rate", type=float, default=1e-3)
    parser.add_argument("--sync_replicas", action="store_true",
                        help="synchronous updates (SyncReplicasOptimizer, one gradient per worker per step)")
    parser.add_argument("--data", help="mnist.npz (default: data/mnist.npz here, else pscluster's bundled copy)")
    parser.add_argument("--join_timeout", type=float, default=120,
                        help="seconds the chief waits for every worker to join before training without them")
    parser.add_argument("--log_every", type=int, default=50, help="print progress every N local steps")
    args = parser.parse_args(argv)
    if args.job_name == "chief":
        parser.error("--job_name chief: TF1 between-graph training has no chief job (worker 0 is the chief); "
                     "under pscluster run, start it with --on ps,worker or on a --mode sync-ps cluster")
    hosts = {"ps": split_hosts(args.ps_hosts), "worker": split_hosts(args.worker_hosts)}
    if not hosts["worker"]:
        parser.error("--worker_hosts lists no worker")
    if not 0 <= args.task_index < len(hosts[args.job_name]):
        parser.error(f"--task_index {args.task_index} is not a {args.job_name} task "
                     f"({len(hosts[args.job_name])} listed)")
    if args.steps < 1 or args.batch_size < 1:
        parser.error("--steps and --batch_size must be >= 1")
    args.hosts = hosts
    return args


def split_hosts(text: str) -> list[str]:
    return [item.strip() for item in text.split(",") if item.strip()]


def data_path(given: str | None) -> str:
    """The MNIST file: --data as given, else the first candidate that exists."""
    if given:
        if not os.path.isfile(given):
            raise SystemExit(f"--data {given}: no such file")
        return given
    for candidate in DATA_CANDIDATES:
        if os.path.isfile(candidate):
            return candidate
    raise SystemExit("no MNIST file found: pass --data PATH/mnist.npz")


def load_mnist(path: str) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    with np.load(path) as arrays:
        def flat(x: np.ndarray) -> np.ndarray:
            return x.reshape(len(x), -1).astype(np.float32) / 255.0
        return (flat(arrays["x_train"]), arrays["y_train"].astype(np.int64),
                flat(arrays["x_test"]), arrays["y_test"].astype(np.int64))


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    import tensorflow as tf
    tf.compat.v1.disable_eager_execution()
    cluster = tf.train.ClusterSpec(args.hosts)
    server = tf.distribute.Server(cluster, job_name=args.job_name, task_index=args.task_index)
    if args.job_name == "ps":
        print(f"ps {args.task_index}: serving variables at {args.hosts['ps'][args.task_index]}", flush=True)
        server.join()                          # forever: someone (pscluster run) stops it
        return
    train(tf, args, cluster, server)


def train(tf, args: argparse.Namespace, cluster, server) -> None:
    started = time.monotonic()
    index, workers = args.task_index, len(args.hosts["worker"])
    x_train, y_train, x_test, y_test = load_mnist(data_path(args.data))
    rng = np.random.default_rng(1234 + index)
    is_chief = index == 0
    with tf.compat.v1.device(tf.compat.v1.train.replica_device_setter(
            worker_device=f"/job:worker/task:{index}", cluster=cluster)):
        images = tf.compat.v1.placeholder(tf.float32, [None, 784], name="images")
        labels = tf.compat.v1.placeholder(tf.int64, [None], name="labels")
        init = tf.compat.v1.glorot_uniform_initializer(seed=1)
        w1 = tf.compat.v1.get_variable("w1", [784, 256], initializer=init)
        b1 = tf.compat.v1.get_variable("b1", [256], initializer=tf.compat.v1.zeros_initializer())
        w2 = tf.compat.v1.get_variable("w2", [256, 10], initializer=init)
        b2 = tf.compat.v1.get_variable("b2", [10], initializer=tf.compat.v1.zeros_initializer())
        logits = tf.matmul(tf.nn.relu(tf.matmul(images, w1) + b1), w2) + b2
        loss = tf.reduce_mean(tf.nn.sparse_softmax_cross_entropy_with_logits(labels=labels, logits=logits))
        correct = tf.reduce_sum(tf.cast(tf.equal(tf.argmax(logits, 1), labels), tf.float32))
        global_step = tf.compat.v1.train.get_or_create_global_step()
        # How many workers have joined: the chief starts training when all have (see below).
        joined = tf.compat.v1.get_variable("workers_joined", [], tf.int32, trainable=False,
                                           initializer=tf.compat.v1.zeros_initializer())
        join = tf.compat.v1.assign_add(joined, 1)
        optimizer = tf.compat.v1.train.AdamOptimizer(args.learning_rate)
        hooks = [tf.compat.v1.train.StopAtStepHook(last_step=args.steps)]
        if args.sync_replicas:
            optimizer = tf.compat.v1.train.SyncReplicasOptimizer(
                optimizer, replicas_to_aggregate=workers, total_num_replicas=workers)
            hooks.append(optimizer.make_session_run_hook(is_chief))
        train_op = optimizer.minimize(loss, global_step=global_step)

    # Only the ps and this worker: without the filter the session waits for every worker.
    config = tf.compat.v1.ConfigProto(device_filters=["/job:ps", f"/job:worker/task:{index}"])
    if not is_chief:
        wait_for_chief(tf, server.target, config)
    local_steps, step = 0, 0
    with tf.compat.v1.train.MonitoredTrainingSession(master=server.target, is_chief=is_chief, hooks=hooks,
                                                     config=config, log_step_count_steps=None) as session:
        _, step = session.run([join, global_step])
        if is_chief:
            # Asynchronous training would otherwise start with the chief alone: the other workers
            # import TensorFlow and load the data later, and on a loaded 2-core machine the chief
            # finished short jobs (700 steps, ~5 s) before worker 1 ran a single step.
            # The workers that joined train meanwhile, and may finish the job first: each run
            # here passes the stop hook, and a monitored session refuses any run after it fired.
            deadline = time.monotonic() + args.join_timeout
            count = session.run(joined)
            while count < workers and time.monotonic() < deadline and not session.should_stop():
                time.sleep(0.1)
                count = session.run(joined)
            print(f"worker 0: {min(count, workers)} of {workers} workers joined, training", flush=True)
        while not session.should_stop():
            batch = rng.integers(0, len(x_train), args.batch_size)
            _, step, value = session.run([train_op, global_step, loss],
                                         {images: x_train[batch], labels: y_train[batch]})
            local_steps += 1
            if local_steps % args.log_every == 0:
                print(f"worker {index}: local step {local_steps}, global step {step}, loss {value:.4f}", flush=True)
        if is_chief:
            # The variables stay on the ps until every worker is done: evaluate through the raw
            # session (the monitored one refuses to run once its stop hook has fired).
            raw = session._tf_sess()  # noqa: SLF001 - the documented way out of MonitoredSession
            total_loss = hits = 0.0
            for start in range(0, len(x_test), 1000):
                feed = {images: x_test[start:start + 1000], labels: y_test[start:start + 1000]}
                batch_loss, batch_hits = raw.run([loss, correct], feed)
                total_loss += batch_loss * len(feed[labels])
                hits += batch_hits
            step = raw.run(global_step)      # the last step of any worker, not the one this one saw
            print(f"final test_accuracy={hits / len(x_test):.4f} test_loss={total_loss / len(x_test):.4f} "
                  f"steps={step} seconds={time.monotonic() - started:.1f}", flush=True)
        else:
            print(f"worker {index}: done after {local_steps} local steps (the job ended at step {step})", flush=True)
        # Leave without closing the session: its teardown can wait on peers that are gone.
        sys.stdout.flush()
        os._exit(0)


def wait_for_chief(tf, target: str, config, poll_seconds: float = 0.2, max_wait_seconds: float = 7200) -> None:
    """Block until the chief has initialized the variables on the ps.

    A non-chief worker's MonitoredTrainingSession checks for that and, if it is not done yet,
    sleeps 30 s before looking again (SessionManager's recovery_wait_secs, which
    MonitoredTrainingSession does not expose): on a 2-core machine the chief then ran a whole
    700-step job alone while worker 1 slept, and every run took 30 s longer. Polling here
    first, the session finds the model ready at once. Gives up after MonitoredTrainingSession's
    own bound (max_wait_secs, 2 h).
    """
    uninitialized = tf.compat.v1.report_uninitialized_variables(tf.compat.v1.global_variables())
    deadline = time.monotonic() + max_wait_seconds
    with tf.compat.v1.Session(target, config=config) as session:
        while len(session.run(uninitialized)):
            if time.monotonic() > deadline:
                raise SystemExit(f"the chief (worker 0) did not initialize the variables in {max_wait_seconds:.0f} s")
            time.sleep(poll_seconds)


if __name__ == "__main__":
    main()
