"""Test beds shared by the tests and the benchmarks (never shipped: the wheel holds only
``cluster`` and ``roles``, setup.cfg ``[options.packages.find]``).

* :mod:`testbed.netlab` -- fake SSH hosts in network namespaces (``Lab``, ``write_inventory``);
  ``python -m testbed.netlab up|down|reap`` by hand.
* :mod:`testbed.slurmlab` -- a real Slurm 22.05 with its nodes in network namespaces.
* :mod:`testbed.procs` -- read-only views of the processes a cluster left (``cluster_pids``,
  ``netns_of``), for asserting that nothing survives.
* :mod:`testbed.fake_nvidia_smi` -- a stand-in ``nvidia-smi`` answering from a JSON file
  (``install``, ``write_config``), for ``benchmarks/gpu_check.py --fake`` and its tests.

Standard library only, no pytest: benchmarks import these directly, tests through their
fixtures (tests/conftest.py, tests/slurm/conftest.py).
"""
