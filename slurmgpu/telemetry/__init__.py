"""What a job really uses: GPU probes (NVML, simulated), process → job attribution, host usage.

The seam is ``GpuProbe``; ``NvmlProbe`` is the real implementation and ``SimulatedGpuProbe``
the one the lab cluster's fake GPUs use. ``attribute`` turns device samples into per-job rows.

Import the modules themselves (``telemetry.nvml``, ``telemetry.gpupower``, ...): this
package loads none of them, so the simulator can read the power model without NVML or
psutil.
"""
