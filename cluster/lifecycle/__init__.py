"""A cluster's life on its hosts: the task primitives every command shares (``tasks``: records,
environments, starting, standbys, readiness, stopping), ``up`` and ``down`` (``updown``), the
status view (``status``) and ``scale`` (``resize``: a new plan applied to a cluster that is up,
with or without a running job)."""
