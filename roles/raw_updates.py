"""A Keras 3 optimizer's update as one TensorFlow kernel per variable (async mode).

Keras 3 writes an update as about a dozen separate ops per variable, and reads the step
counter and the learning rate again for every variable. Under ParameterServerStrategy
those ops run on the ps that holds the variable, each read of ``iterations`` or the
learning rate held by another ps is one more RPC, and a ps runs a hundred-odd small ops
per step. TensorFlow has the same rules as single kernels (``ResourceApplyAdam``,
``ResourceApplyKerasMomentum``, ``ResourceApplyGradientDescent``): here each variable's
update is one op on its ps, and the counter and the learning rate are read once per step.
On the part-4 benchmark cluster that took async from 72 to 78 steps/s
(docs/benchmarks.md, "async step: fused updates and a warm start").

Exact equivalents only, on Keras' own slot variables (checkpoints are the same either
way). :func:`fused_apply` returns None for anything else (another optimizer, a schedule,
weight decay, clipping, EMA, accumulation, AMSGrad, a variable that is not one plain
resource variable) and the caller keeps Keras' ``apply_gradients``; a step whose
gradients include a sparse one also takes Keras' path. The counter goes up with one
atomic ``assign_add``: Keras' increment races between workers (roles/checkpoint.py).
"""

from __future__ import annotations

from typing import Any, Callable, Sequence

import tensorflow as tf

from roles.v1_optimizers import constant_rate, inexact_setting

Apply = Callable[[Sequence[Any]], None]


def unsupported(optimizer: Any, variables: Sequence[Any]) -> str | None:
    """Why ``optimizer`` cannot take the fused path for ``variables`` (None: it can)."""
    kind = type(optimizer).__name__
    if kind not in ("Adam", "SGD"):
        return f"{kind} has no fused kernel here (Adam and SGD do)"
    config = optimizer.get_config()
    setting = inexact_setting(config)
    if setting is not None:
        return f"{kind}({setting})"
    if constant_rate(config) is None:
        lr = config.get("learning_rate")
        shown = lr.get("class_name", "unknown") if isinstance(lr, dict) else repr(lr)
        return f"the learning rate is not a constant ({shown})"
    try:
        for v in variables:
            optimizer._get_variable_index(v)
            if not isinstance(v.value, tf.Variable) or getattr(v.value, "handle", None) is None:
                return f"variable {v.path} is not one resource variable"
    except (AttributeError, KeyError) as e:
        return f"this Keras keeps its optimizer state differently ({type(e).__name__}: {e})"
    if kind == "Adam" and not hasattr(optimizer, "_momentums"):
        return "this Keras keeps Adam's slots differently"
    if kind == "SGD" and optimizer.momentum and not hasattr(optimizer, "momentums"):
        return "this Keras keeps SGD's momentum differently"
    return None


def fused_apply(optimizer: Any, variables: Sequence[Any]) -> Apply | None:
    """``apply(grads)`` updating ``variables`` as ``optimizer.apply_gradients`` would,
    one kernel per variable; None when :func:`unsupported` gives a reason.

    Call it after ``optimizer.build(variables)``; call ``apply`` where the update should
    happen (inside the step function). A None gradient leaves its variable alone, as in
    Keras.
    """
    if unsupported(optimizer, variables) is not None:
        return None
    variables = list(variables)
    slots = [optimizer._get_variable_index(v) for v in variables]
    kind = type(optimizer).__name__

    def apply(grads: Sequence[Any]) -> None:
        if any(isinstance(g, tf.IndexedSlices) for g in grads):
            optimizer.apply_gradients(zip(grads, variables))
            return
        lr_value = tf.convert_to_tensor(optimizer.learning_rate)       # one read per step
        if kind == "Adam":
            b1, b2 = float(optimizer.beta_1), float(optimizer.beta_2)
            t = tf.cast(tf.convert_to_tensor(optimizer.iterations) + 1, tf.float32)   # as Keras, for float32
            powers = (tf.pow(tf.constant(b1), t), tf.pow(tf.constant(b2), t))
        for grad, var, slot in zip(grads, variables, slots):
            if grad is None:
                continue
            dtype = var.dtype
            lr = tf.cast(lr_value, dtype)
            grad = tf.cast(grad, dtype)
            if kind == "Adam":
                tf.raw_ops.ResourceApplyAdam(
                    var=var.value.handle, m=optimizer._momentums[slot].value.handle,
                    v=optimizer._velocities[slot].value.handle,
                    beta1_power=tf.cast(powers[0], dtype), beta2_power=tf.cast(powers[1], dtype),
                    lr=lr, beta1=tf.cast(b1, dtype), beta2=tf.cast(b2, dtype),
                    epsilon=tf.cast(float(optimizer.epsilon), dtype), grad=grad)
            elif optimizer.momentum:
                tf.raw_ops.ResourceApplyKerasMomentum(
                    var=var.value.handle, accum=optimizer.momentums[slot].value.handle, lr=lr,
                    grad=grad, momentum=tf.cast(float(optimizer.momentum), dtype),
                    use_nesterov=bool(optimizer.nesterov))
            else:
                tf.raw_ops.ResourceApplyGradientDescent(var=var.value.handle, alpha=lr, delta=grad)
        optimizer.iterations.value.assign_add(1)

    return apply
