"""``pscluster bench``: the study (``study``: configurations, runs, efficiency) and its plots
(``plot``, the only matplotlib user)."""
