"""What runs on a host: the only package of pscluster that imports TensorFlow.

Entry points (``python -m roles.X`` from the host's workdir):

* ``roles.server`` -- a standing ``tf.distribute.Server`` (ps, async workers);
* ``roles.train`` -- one training process of a job, in a mode: ``async_driver``
  (ParameterServerStrategy, on the chief), ``sync_driver`` (MultiWorkerMirroredStrategy,
  on every worker), ``syncps_driver`` (SyncReplicasOptimizer with ps, on every worker);
* ``roles.hostctl`` -- the orchestrator's host agent (standard library only).

Supporting modules: ``jobs`` (the job API and loader; its docstring is the
job-author guide), ``plan`` (batch/step/learning-rate arithmetic), ``events`` (the
JSON-lines contract with the orchestrator), ``reporting`` (progress events),
``guardian`` (guardian process: signals, start deadline), ``checkpoint``,
``datasets``, ``evaluation``, ``syncps_rendezvous``, ``v1_optimizers``, ``tfconfig``,
``tfruntime``. Only ``tfruntime``, the drivers and the modules they use import
TensorFlow, and only after the training process has forked its guardian.
"""
