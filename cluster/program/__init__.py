"""The user's own program (``pscluster run``), the pure parts: ``runspec`` (placeholders, task
selection, environment), ``progfiles`` (which files travel), ``ignorerules`` (gitignore patterns)
and ``importscan`` (the modules a script imports). The job that runs it is
:mod:`cluster.supervision.program_job`."""
