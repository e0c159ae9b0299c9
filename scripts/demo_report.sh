#!/usr/bin/env bash
# The efficiency report at the end of the demo: `sgpu report` in the terminal, then the
# self-contained HTML file. Runs against demo.sh's store (environment from demo.sh:
# PATH with .venv/bin, SGPU_DB, SGPU_CONFIG, ROOT). Usage: scripts/demo_report.sh [OUT.html]
set -euo pipefail
out=${1:-${ROOT:-.}/report.html}
echo "== sgpu report --since 1d (jobs that ended today, by user)"
sgpu report --since 1d
echo "== sgpu report --since 1d --by partition --format csv"
sgpu report --since 1d --by partition --format csv
echo "== sgpu whatif --since 1d (this store's jobs replayed under each policy set against plain Slurm)"
sgpu whatif --since 1d
sgpu report --since 1d --format html -o "$out"
echo "== HTML report written to $out (self-contained: open it in any browser, offline)"
