"""Standing TensorFlow server: ``python -m roles.server``.

Runs a ps or worker task that only serves: in async mode (ps and workers, driven by the
chief's ClusterCoordinator) and in sync-ps mode (ps, used by the workers' graphs). It
reads the cluster and its own task from ``TF_CONFIG``, starts a gRPC
``tf.distribute.Server`` and blocks in ``join()`` until killed.

Start-up is on the critical path of ``pscluster up``, so this loads only TensorFlow's server
modules (``roles.tfruntime.import_server_runtime``: 0.6 CPU-s instead of 4.4 for the whole API)
and does no work before starting the server. Termination: ``join()`` blocks
in C++, where a Python signal handler would never run, so SIGTERM and SIGINT keep (or
are reset to) their default action and end the process at once. A server holds no
state worth saving: checkpoints are the chief's business.

Exit codes: 0 never happens (the server runs until killed); 2 = bad TF_CONFIG or
environment; 1 = the server could not start (typically: port in use).
"""

from __future__ import annotations

import signal
import sys


def main() -> int:
    # Default actions: die at once even while blocked inside TensorFlow's C++ join().
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    signal.signal(signal.SIGINT, signal.SIG_DFL)

    from roles.tfconfig import ConfigError, task_from_env, threads_from_env

    try:
        task = task_from_env()
        threads = threads_from_env()
    except ConfigError as e:
        print(f"roles.server: {e}", file=sys.stderr, flush=True)
        return 2

    from roles.tfruntime import import_server_runtime, server_config

    tf = import_server_runtime(threads)     # the server's modules only, not the whole API
    try:
        server = tf.Server(
            tf.ClusterSpec(task.cluster_dict()),
            job_name=task.task_type,
            task_index=task.task_index,
            protocol="grpc",
            config=server_config(tf, threads),
            start=True,
        )
    except tf.start_errors as e:
        print(f"roles.server: could not start {task.name} on {task.address}: {getattr(e, 'message', e)}",
              file=sys.stderr, flush=True)
        return 1
    print(f"roles.server: {task.name} serving at {server.target} "
          f"(cluster: {task.cluster_dict()})", file=sys.stderr, flush=True)
    server.join()
    return 0


if __name__ == "__main__":
    sys.exit(main())
