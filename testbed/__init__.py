"""Test beds shared by the tests and the benchmarks (never shipped: the wheel holds only
``cluster`` and ``roles``, setup.cfg ``[options.packages.find]``).

* :mod:`testbed.netlab` -- fake SSH hosts in network namespaces (``Lab``, ``write_inventory``);
  ``python -m testbed.netlab up|down|reap`` by hand.
* :mod:`testbed.slurmlab` -- a real Slurm 22.05 with its nodes in network namespaces.
* :mod:`testbed.procs` -- read-only views of the processes a cluster left (``cluster_pids``,
  ``netns_of``), for asserting that nothing survives.

Standard library only, no pytest: benchmarks import these directly, tests through their
fixtures (tests/conftest.py, tests/slurm/conftest.py).
"""
