"""Lab tooling: what tests, demos and benchmarks run, never the daemon or the agents.

- :mod:`slurmgpu.lab.cluster`: a real multi-node Slurm cluster with fake GPUs on this host
  (``sgpu cluster up``), and the renderer of its config (also used by ``docker-slurm/``);
- :mod:`slurmgpu.lab.fakeload`: the fake GPU load a lab job declares for the simulated
  probe (``sgpu fakeload``);
- :mod:`slurmgpu.lab.benchrun`: the JSON record every script in ``bench/`` writes.

Nothing outside ``slurmgpu.lab`` and the commands that front it (``cli/cluster.py``,
``cli/fakeload.py``) imports from here (tests/unit/test_lab_boundary.py checks it).
"""
