"""Keras 3 optimizers translated to their ``tf.compat.v1.train`` twins (sync-ps).

``SyncReplicasOptimizer`` wraps a TF1 ``Optimizer`` (it calls ``compute_gradients``
and ``apply_gradients(..., global_step)``); a Keras 3 optimizer has neither method in
that form and cannot run in a TF1 graph. Jobs stay mode-agnostic by returning a Keras
optimizer; this module reads its config and builds the equivalent TF1 optimizer.
Anything that would change the update rule silently (schedules, weight decay,
clipping, EMA, accumulation, AMSGrad) is refused with a clear error instead.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Mapping

import tensorflow as tf

from roles.jobs import JobError

SUPPORTED = ("SGD", "Adam", "RMSprop", "Adagrad")

# Config keys that must hold their neutral value for the translation to be exact
# (also for roles.raw_updates' fused kernels).
NEUTRAL = {
    "weight_decay": (None, 0, 0.0),
    "clipnorm": (None,),
    "clipvalue": (None,),
    "global_clipnorm": (None,),
    "use_ema": (False, None),
    "loss_scale_factor": (None, 1, 1.0),
    "gradient_accumulation_steps": (None, 1),
    "amsgrad": (False, None),
}


def inexact_setting(config: Mapping[str, Any]) -> str | None:
    """The first setting in a Keras optimizer's ``config`` that a fixed update rule cannot
    reproduce, as ``key=value`` (None: all neutral); shared with roles.raw_updates."""
    for key, neutral in NEUTRAL.items():
        if key in config and config[key] not in neutral:
            return f"{key}={config[key]!r}"
    return None


def constant_rate(config: Mapping[str, Any]) -> float | None:
    """The learning rate in ``config`` when it is a constant number, else None (a schedule)."""
    lr = config.get("learning_rate")
    if isinstance(lr, bool) or not isinstance(lr, (int, float)):
        return None
    return float(lr)


class UnsupportedOptimizer(JobError):
    """The job's optimizer cannot run in sync-ps mode as written."""


@dataclass(frozen=True)
class V1OptimizerSpec:
    """A TF1 optimizer to build: its class name in ``tf.compat.v1.train`` and kwargs.

    Read from the Keras optimizer eagerly: Keras' ``get_config`` reads variables
    with ``.numpy()``, which fails inside the TF1 graph where the spec is built.
    """

    name: str
    kwargs: tuple[tuple[str, Any], ...]

    def build(self) -> Any:
        return getattr(tf.compat.v1.train, self.name)(**dict(self.kwargs))


def v1_spec(keras_optimizer: Any, job_path: str = "job") -> V1OptimizerSpec:
    """The TF1 optimizer equivalent to ``keras_optimizer``; call eagerly.

    Raises:
        UnsupportedOptimizer: the optimizer or one of its settings has no exact TF1
            equivalent; the message names the job file and the setting.
    """
    kind = type(keras_optimizer).__name__
    if kind not in SUPPORTED:
        raise UnsupportedOptimizer(
            f"{job_path}: optimizer() returned {kind}; sync-ps mode supports "
            f"{', '.join(SUPPORTED)}")
    config: Mapping[str, Any] = keras_optimizer.get_config()
    setting = inexact_setting(config)
    if setting is not None:
        key = setting.split("=", 1)[0]
        raise UnsupportedOptimizer(
            f"{job_path}: {kind}({setting}) has no sync-ps equivalent; "
            f"leave {key} unset for sync-ps")
    lr = constant_rate(config)
    if lr is None:
        raise UnsupportedOptimizer(
            f"{job_path}: sync-ps needs a constant learning rate, got {config.get('learning_rate')!r}")

    def spec(name: str, **kwargs: Any) -> V1OptimizerSpec:
        return V1OptimizerSpec(name, tuple(sorted(kwargs.items())))

    if kind == "SGD":
        momentum = float(config.get("momentum", 0.0))
        if momentum:
            return spec("MomentumOptimizer", learning_rate=lr, momentum=momentum,
                        use_nesterov=bool(config.get("nesterov", False)))
        return spec("GradientDescentOptimizer", learning_rate=lr)
    if kind == "Adam":
        return spec("AdamOptimizer", learning_rate=lr, beta1=float(config["beta_1"]),
                    beta2=float(config["beta_2"]), epsilon=float(config["epsilon"]))
    if kind == "RMSprop":
        return spec("RMSPropOptimizer", learning_rate=lr, decay=float(config["rho"]),
                    momentum=float(config.get("momentum", 0.0)),
                    epsilon=float(config["epsilon"]),
                    centered=bool(config.get("centered", False)))
    return spec("AdagradOptimizer", learning_rate=lr, initial_accumulator_value=float(
        config.get("initial_accumulator_value", 0.1)))
