"""``python -m slurmgpu.lab.cluster --mode docker|native --out DIR``: render the config.

Standard library only (the docker entrypoint runs it with the image's ``python3``).
"""

from slurmgpu.lab.cluster.render import main

raise SystemExit(main())
