"""The policy cycle shared by the daemon and the simulator.

One cycle (:class:`~slurmgpu.cycle.core.PolicyCycle`): confirm what earlier cycles
started, observe (build the PolicySnapshot from pluggable sources), decide (the
engine), plan (drop unchanged verdicts) and act (an executor carries the decisions out
through a SlurmClient), then remember what was taken for the engine's guardrails
(:class:`~slurmgpu.cycle.guardrails.GuardrailRecords`). The daemon wires it to its
store (``daemon.policy_cycle``), the simulator to SimSlurm (``sim.run``).

Resizes are transactions both run alike: :mod:`~slurmgpu.cycle.dispatch` sends a job's
to :mod:`~slurmgpu.cycle.resize` and an array pool's to :mod:`~slurmgpu.cycle.pool`,
each writing its steps through the :mod:`~slurmgpu.cycle.transactions` protocol (the
daemon's store, the simulator's memory) and acting through a SlurmClient. None of them
touches SQL, HTTP or Slurm's syntax.
"""
