"""The policy cycle shared by the daemon and the simulator.

One cycle (:class:`~slurmgpu.cycle.core.PolicyCycle`): confirm what earlier cycles
started, observe (build the PolicySnapshot from pluggable sources), decide (the
engine), plan (drop unchanged verdicts) and act (an executor carries the decisions out
through a SlurmClient), then remember what was taken for the engine's guardrails
(:class:`~slurmgpu.cycle.guardrails.GuardrailRecords`). The daemon wires it to its
store (``daemon.policy_cycle``), the simulator to SimSlurm (``sim.run``).
"""
