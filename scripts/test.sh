#!/usr/bin/env bash
# The whole test suite: install everything, lint, type-check, run all tests including
# the real-cluster ones (they start their own slurmctld + 4 slurmd on 127.0.0.1).
# Usage (as root on Debian 12/13):  ./scripts/test.sh [extra pytest args]
set -euo pipefail
cd "$(dirname "$0")/.."
./scripts/bootstrap.sh
echo "== ruff"; .venv/bin/ruff check slurmgpu tests bench
echo "== mypy"; .venv/bin/mypy
echo "== pytest"; .venv/bin/pytest -q "$@"
