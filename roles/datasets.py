"""Input pipelines around a job's ``dataset``: the part every mode does the same way.

The job yields unbatched examples of one shard; the driver decides how they are cut
into steps. Training data repeats forever (the budget is counted in steps, never
in end-of-data, as the ClusterCoordinator docs advise), is batched with
``drop_remainder`` so every step has a static, equal batch (sync modes average over a
fixed global batch), and is prefetched so input work overlaps compute.
"""

from __future__ import annotations

import tensorflow as tf

from roles.jobs import Job, JobError, Shard


def _job_dataset(job: Job, shard: Shard) -> tf.data.Dataset:
    ds = job.dataset(shard)
    if not isinstance(ds, tf.data.Dataset):
        raise JobError(f"{job.path}: dataset() must return a tf.data.Dataset, "
                       f"got {type(ds).__name__}")
    spec = ds.element_spec
    if not isinstance(spec, tuple) or len(spec) != 2:
        raise JobError(f"{job.path}: dataset() must yield (features, label) pairs, "
                       f"got elements of {spec}")
    return ds


def train_dataset(job: Job, shard: Shard, batch_size: int) -> tf.data.Dataset:
    """Endless batches of ``batch_size`` from this shard of the train split."""
    ds = _job_dataset(job, shard)
    return ds.repeat().batch(batch_size, drop_remainder=True).prefetch(tf.data.AUTOTUNE)


def eval_dataset(job: Job, shard: Shard, batch_size: int) -> tf.data.Dataset:
    """One pass over this shard of the test split, last batch possibly short."""
    ds = _job_dataset(job, shard)
    return ds.batch(batch_size).prefetch(tf.data.AUTOTUNE)


def sample_batch(job: Job, seed: int, size: int = 2) -> tuple[tf.Tensor, tf.Tensor]:
    """A tiny eager batch used to build the model's variables before training.

    Why: building lazily inside a traced, distributed step would create variables
    inside a replica function, which the strategies reject or place badly.
    """
    ds = _job_dataset(job, Shard(index=0, count=1, split="test", seed=seed))
    return next(iter(ds.batch(size).take(1)))
