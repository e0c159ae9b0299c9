#!/usr/bin/env bash
# Reliability and security at the end of the demo, against demo.sh's running daemon
# (environment from demo.sh: PATH with .venv/bin, SGPU_DB, SGPU_CONFIG, PORT, ROOT).
# Usage: scripts/demo_reliability.sh
set -euo pipefail
PORT=${PORT:-8787}

echo "== a second daemon on the same database refuses to start (one line, exit 1)"
if sgpu daemon --once --no-api 2>&1 | grep '^sgpu:'; then :; fi

echo "== the status API: root (admin) sees every job, nobody sees only its own"
python3 - "$PORT" <<'PY'
import hashlib, json, subprocess, sys, urllib.error, urllib.request

port = sys.argv[1]
payload = b"status\n" + hashlib.sha256(b"").hexdigest().encode()

def ask(argv, label):
    cred = subprocess.run(argv, input=payload, capture_output=True, check=True).stdout
    req = urllib.request.Request(f"http://127.0.0.1:{port}/v1/jobs")
    req.add_header("Authorization", "Munge " + cred.decode().strip())
    try:
        with urllib.request.urlopen(req, timeout=10) as r:
            doc = json.loads(r.read())
        print(f"{label}: admin={doc['admin']}, {len(doc['jobs'])} job(s)")
    except urllib.error.HTTPError as exc:
        print(f"{label}: HTTP {exc.code} {json.loads(exc.read())['error']}")

ask(["munge"], "root  ")
ask(["runuser", "-u", "nobody", "--", "munge"], "nobody")
PY

echo "== admin actions in the audit, with the caller's uid"
sgpu actions --policy admin --json | python3 -c '
import json, sys
for r in json.load(sys.stdin):
    print(r["at"][:19], r["kind"], "uid", r["caller_uid"], "-", r["reason"])'

echo "== sgpu policy show prints a config file: policy check accepts it"
shown=$(mktemp --suffix=.toml)
sgpu policy show > "$shown"
sgpu policy check "$shown"
rm -f "$shown"

echo "== a trace with a bad row is refused in one line naming its line (blank lines counted)"
trace=$(mktemp --suffix=.csv)
printf 'timestamp,duration,num_gpus\n2017-10-09 07:01:55,66,1\n\n2017-10-09 07:02:00,1e308,1\n' > "$trace"
if sgpu simulate --policies slurm "$trace" 2>&1 | grep '^sgpu:'; then :; fi
rm -f "$trace"
