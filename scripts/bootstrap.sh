#!/usr/bin/env bash
# Install what slurmgpu's demo and tests need on a Debian 12/13 machine (run as root):
# Debian's Slurm (slurm-wlm) and MUNGE, PostgreSQL (for the store's tests), a Python
# >= 3.11 with venv, and the project itself in .venv with its dev extras. Safe to run
# again: it skips what is present.
set -euo pipefail
cd "$(dirname "$0")/.."

need_apt=()
command -v slurmctld-wlm >/dev/null 2>&1 || [ -x /usr/sbin/slurmctld-wlm ] || need_apt+=(slurm-wlm)
command -v sinfo >/dev/null 2>&1 || need_apt+=(slurm-client)
[ -x /usr/sbin/munged ] || need_apt+=(munge)
# A throwaway PostgreSQL server for the store's tests (tests/conftest.py postgres_url;
# ~25 MB, ~15 s); the services it would start are not used.
compgen -G '/usr/lib/postgresql/*/bin/initdb' >/dev/null || need_apt+=(postgresql)
# slurmdbd and MariaDB for the lab's accounting and its site profile (LabCluster
# profile="site", `sgpu cluster up --profile site`): the lab starts its own mariadbd on a
# port of its own, never the distribution's service.
[ -x /usr/sbin/slurmdbd ] || need_apt+=(slurmdbd)
[ -x /usr/sbin/mariadbd ] || need_apt+=(mariadb-server)
# Lua interpreters to unit-test plugins/job_submit.lua outside slurmctld (5.1 is what
# Debian's Slurm embeds; 5.4 catches what newer Lua would reject). Small.
command -v lua5.1 >/dev/null 2>&1 || need_apt+=(lua5.1)
command -v lua5.4 >/dev/null 2>&1 || need_apt+=(lua5.4)
# Headless Chromium renders the HTML report in its test (tests/unit/test_report_html.py).
command -v chromium >/dev/null 2>&1 || need_apt+=(chromium)
# Debian's Prometheus: promtool checks and unit-tests the shipped rules
# (tests/unit/test_monitoring_rules.py) and a real prometheus scrapes the lab's daemon
# (tests/slurm/test_prometheus_real.py) on a port of its own; ~120 MB. Installed apart,
# below, so that its own service neither starts nor is left enabled.
need_prometheus=0
{ command -v promtool && command -v prometheus; } >/dev/null 2>&1 || need_prometheus=1

PY=""
# Debian 13's python3 imports venv without python3-venv, and only `-m venv` then fails
# (ensurepip is not available): so a candidate must really make a venv with pip.
venv_works() {
  local t ok=1
  t=$(mktemp -d)
  "$1" -m venv "$t/v" >/dev/null 2>&1 && [ -x "$t/v/bin/pip" ] && ok=0
  rm -rf "$t"
  return $ok
}
for cand in python3.13 python3.12 python3.11 python3; do
  if command -v "$cand" >/dev/null 2>&1 && "$cand" -c 'import sys, venv; sys.exit(sys.version_info < (3, 11))' 2>/dev/null &&
     { [ -x .venv/bin/python ] || venv_works "$cand"; }; then
    PY=$(command -v "$cand"); break
  fi
done
[ -n "$PY" ] || need_apt+=(python3 python3-venv python3-pip)

if [ ${#need_apt[@]} -gt 0 ]; then
  if [ "$(id -u)" -ne 0 ]; then
    echo "bootstrap: need root to install: ${need_apt[*]}" >&2; exit 1
  fi
  echo "bootstrap: apt-get install ${need_apt[*]}"
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq
  apt-get install -y -qq --no-install-recommends "${need_apt[@]}" >/dev/null
fi
if [ "$need_prometheus" = 1 ]; then
  if [ "$(id -u)" -ne 0 ]; then
    echo "bootstrap: need root to install: prometheus" >&2; exit 1
  fi
  echo "bootstrap: apt-get install prometheus (its service left stopped and disabled)"
  export DEBIAN_FRONTEND=noninteractive
  [ ${#need_apt[@]} -gt 0 ] || apt-get update -qq
  # policy-rc.d 101: invoke-rc.d / deb-systemd-invoke start no service during this install
  # (the tests start their own prometheus; Debian's would hold port 9090 and scrape
  # nothing of ours). One already there (containers often have one) is kept as it is.
  own_policy=0
  if [ ! -e /usr/sbin/policy-rc.d ]; then
    printf '#!/bin/sh\nexit 101\n' >/usr/sbin/policy-rc.d
    chmod 755 /usr/sbin/policy-rc.d
    own_policy=1
  fi
  apt-get install -y -qq --no-install-recommends prometheus >/dev/null || {
    [ "$own_policy" = 0 ] || rm -f /usr/sbin/policy-rc.d; exit 1; }
  [ "$own_policy" = 0 ] || rm -f /usr/sbin/policy-rc.d
  # The package enabled it for the next boot: not wanted (works without a running systemd).
  if [ -d /run/systemd/system ]; then
    systemctl disable --now prometheus.service >/dev/null 2>&1 || true
  else
    systemctl disable prometheus.service >/dev/null 2>&1 || true
  fi
fi
[ -n "$PY" ] || PY=$(command -v python3)

if [ ! -x .venv/bin/python ]; then
  echo "bootstrap: creating .venv with $PY"
  "$PY" -m venv .venv
fi
log=$(mktemp)
if ! { .venv/bin/python -m pip install -q --disable-pip-version-check -U pip &&
       .venv/bin/python -m pip install -q --disable-pip-version-check -e '.[dev]'; } >"$log" 2>&1; then
  echo "bootstrap: pip install failed:" >&2; tail -n 30 "$log" >&2; rm -f "$log"; exit 1
fi
rm -f "$log"
# torch for the malleable PyTorch tests and examples/torch_ddp_elastic.py: pinned, the CPU
# build the machines hold locally (an unpinned torch pulls a CUDA build of several GB);
# pip keeps the wheel in its cache. Skipped when a torch is already installed.
if ! .venv/bin/python -c 'import torch' >/dev/null 2>&1; then
  echo "bootstrap: pip install torch==2.13.0"
  .venv/bin/python -m pip install -q --disable-pip-version-check torch==2.13.0 ||
    { echo "bootstrap: torch==2.13.0 failed to install" >&2; exit 1; }
fi
# transformers + accelerate for the malleable Hugging Face Trainer test and example
# (slurmgpu[huggingface]): pinned to the tested versions, after torch so torch stays as is.
if ! .venv/bin/python -c 'import transformers, accelerate' >/dev/null 2>&1; then
  echo "bootstrap: pip install transformers==5.25.0 accelerate==1.16.0"
  .venv/bin/python -m pip install -q --disable-pip-version-check transformers==5.25.0 \
    accelerate==1.16.0 || { echo "bootstrap: transformers failed to install" >&2; exit 1; }
fi
# Lightning for tests/integration/test_elastic_lightning.py (slurmgpu[lightning]), after
# torch so that it finds its torch requirement met and keeps the CPU build.
if ! .venv/bin/python -c 'import lightning' >/dev/null 2>&1; then
  echo "bootstrap: pip install lightning==2.6.6"
  .venv/bin/python -m pip install -q --disable-pip-version-check lightning==2.6.6 ||
    { echo "bootstrap: lightning==2.6.6 failed to install" >&2; exit 1; }
fi
.venv/bin/python -c 'import slurmgpu' || { echo "bootstrap: install failed" >&2; exit 1; }
echo "bootstrap: ready ($(.venv/bin/sgpu --version), $(/usr/sbin/slurmctld-wlm -V 2>/dev/null || echo 'slurm ?'))"
