#!/usr/bin/env bash
# Chaos under load (minutes, not hours; not in CI): one daemon on 127.0.0.1, CPU, the tiny models
# of tests/fixtures, mutual TLS on both ports (a test CA made with openssl), the load of
# tools/soak_load.py. Two scenarios, each with its own daemon:
#
# kill   `kill -9` of the daemon under mixed load (JPEG over gRPC, REST JSON, REST binary, system
#        shared memory; the load generator retries what the daemon's absence fails: gRPC
#        UNAVAILABLE, refused/reset connections, a shared-memory region the new daemon does not
#        know, re-registered first), then a restart on the same ports and files. Checks: the new
#        daemon serves (ready, requests succeed after it), no request failed for good, the client
#        saw UNAVAILABLE, and the daemon left nothing behind: /dev/shm holds no entry that was not
#        there before it started (the load generator's own regions aside, removed when it ends) and
#        its folder no lock or other new file.
# churn  model_control explicit: rtdetr_tiny loaded at start and under load (JPEG over gRPC and
#        REST binary), while a second model `churn` has its folder replaced (new files written to
#        a staging folder, then renamed into the repository; alternately the files of
#        rtdetr_tiny_basic and rtdetr_v2_tiny) and is loaded, asked one inference and unloaded
#        CHAOS_CYCLES times (RepositoryModelLoad/Unload over gRPC). Checks: no failed request on
#        rtdetr_tiny, every load/infer/unload succeeded; reports RSS before and after the cycles
#        (medians over CHAOS_RSS_WINDOW seconds under load) and 30 s after the load.
#
#   scripts/chaos.sh [BUILD_DIR] [kill|churn|all]        (defaults: build, all)
# Environment (defaults): CHAOS_OUT (a new /tmp folder: summary.md, per scenario server*.log,
#   load.json, steps.csv, rss.csv) CHAOS_CONCURRENCY=16 CHAOS_CYCLES=100 CHAOS_NICE=10
#   CHAOS_KILL_AFTER=40 (seconds of load before kill -9) CHAOS_AFTER=40 (seconds of load after the
#   restart) CHAOS_RSS_WINDOW=20
# Exit: 0 every check passed, 1 one failed, 2 setup.
set -euo pipefail
cd "$(dirname "$0")/.."
. scripts/test-ca.sh
root=$(pwd)
build=${1:-build}
case $build in /*) ;; *) build=$root/$build ;; esac
what=${2:-all}
venv=${LIBREYOLO_VENV:-$HOME/.cache/libreyolo-server/venv-torch2.11}
py=$venv/bin/python
out=${CHAOS_OUT:-$(mktemp -d /tmp/libreyolo-chaos.XXXXXX)}
conc=${CHAOS_CONCURRENCY:-16}
cycles=${CHAOS_CYCLES:-100}
nice_n=${CHAOS_NICE:-10}
kill_after=${CHAOS_KILL_AFTER:-40}
after=${CHAOS_AFTER:-40}
rss_window=${CHAOS_RSS_WINDOW:-20}
image=$root/tests/fixtures/images/astronaut.jpg
mkdir -p "$out"
for b in libreyolo-server libreyolo-client; do
  [ -x "$build/bin/$b" ] || { echo "chaos: $build/bin/$b is not built" >&2; exit 2; }
done
# Copies: others may rebuild BUILD_DIR meanwhile (RUNPATH $ORIGIN/../lib finds lib/).
mkdir -p "$out/bin" "$out/lib"
cp "$build/bin/"{libreyolo-server,libreyolo-client} "$out/bin/"
cp -P "$build/lib/"*.so* "$out/lib/"
server_bin=$out/bin/libreyolo-server
client_bin=$out/bin/libreyolo-client

# Test CA, the daemon's certificate (localhost, 127.0.0.1), a client certificate.
t=$out/tls
make_test_ca "$t" chaos
client_tls=(--tls-ca "$t/ca.crt" --tls-cert "$t/client.crt" --tls-key "$t/client.key")
load_tls=(--ca "$t/ca.crt" --cert "$t/client.crt" --key "$t/client.key")

free_port() {
  "$py" -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'
}
put_model() {  # put_model FIXTURE DEST: DEST/1/{config.json, model.safetensors, preprocessor_config.json}
  mkdir -p "$2/1"
  cp "$root/tests/fixtures/models/$1/"{config.json,model.safetensors,preprocessor_config.json} "$2/1/"
  printf 'warmup: false\n' >"$2/serving.yaml"
}
write_config() {  # write_config DIR GRPC_PORT HTTP_PORT EXTRA_SERVER_YAML
  cat >"$1/server.yaml" <<EOF
server:
  grpc_address: 127.0.0.1:$2
  http_address: 127.0.0.1:$3
  drain_seconds: 0
  log_level: warn
  tls:
    cert_file: $t/server.crt
    key_file: $t/server.key
    client_ca_file: $t/ca.crt
$4
model_repository: $1/repo
device: cpu
kernels:
  hub_kernels: off
EOF
}
daemon=
sampler=
loadpid=
start_daemon() {  # start_daemon DIR GRPC_PORT LOG: starts and waits until ready
  nice -n "$nice_n" "$server_bin" --config "$1/server.yaml" >>"$3" 2>&1 &
  daemon=$!
  for _ in $(seq 480); do
    "$client_bin" health --server "127.0.0.1:$2" --service readiness "${client_tls[@]}" >/dev/null 2>&1 && return 0
    kill -0 "$daemon" 2>/dev/null || { echo "chaos: the daemon exited during start-up:" >&2; tail -20 "$3" >&2; return 1; }
    sleep 0.25
  done
  echo "chaos: the daemon did not turn ready in 120 s" >&2
  return 1
}
stop_all() {
  [ -n "$loadpid" ] && kill -TERM "$loadpid" 2>/dev/null && wait "$loadpid" 2>/dev/null || true
  loadpid=
  [ -n "$sampler" ] && kill "$sampler" 2>/dev/null || true
  sampler=
  if [ -n "$daemon" ] && kill -0 "$daemon" 2>/dev/null; then
    kill -TERM "$daemon" 2>/dev/null || true
    for _ in $(seq 100); do kill -0 "$daemon" 2>/dev/null || break; sleep 0.1; done
    kill -KILL "$daemon" 2>/dev/null || true
  fi
  daemon=
}
trap stop_all EXIT
sample_rss() {  # sample_rss CSV: VmRSS every 2 s of the daemon named in $daemon_file (a restart too)
  echo "epoch_s,pid,rss_kb" >"$1"
  (
    while :; do
      p=$(cat "$daemon_file" 2>/dev/null || true)
      r=$(awk '/^VmRSS:/ {print $2}' "/proc/$p/status" 2>/dev/null || echo 0)
      echo "$(date +%s),$p,${r:-0}" >>"$1"
      sleep 2
    done
  ) &
  sampler=$!
}
failed=0
fail() { echo "chaos: FAIL: $*" | tee -a "$out/summary.md" >&2; failed=1; }
note() { echo "$*" | tee -a "$out/summary.md"; }
echo "# chaos $(date -u +%FT%TZ), $(git -C "$root" rev-parse --short HEAD 2>/dev/null || echo '?'), $(nproc) cores" >"$out/summary.md"

# ---- kill -9 under load, restart --------------------------------------------------------------
chaos_kill() {
  local d=$out/kill gp hp
  mkdir -p "$d"
  put_model rtdetr_tiny "$d/repo/rtdetr_tiny"
  gp=$(free_port); hp=$(free_port)
  write_config "$d" "$gp" "$hp" ""
  ls -A /dev/shm | sort >"$d/shm-before.txt"
  find "$d" -type f | sort >"$d/files-before.txt"
  daemon_file=$d/daemon.pid
  start_daemon "$d" "$gp" "$d/server.log" || return 1
  echo "$daemon" >"$daemon_file"
  sample_rss "$d/rss.csv"
  nice -n "$nice_n" "$py" "$root/tools/soak_load.py" --grpc "127.0.0.1:$gp" --http "127.0.0.1:$hp" \
    --image "$image" --concurrency "$conc" --duration 100000 --step 5 --timeout 60 --retry --retry-for 180 \
    "${load_tls[@]}" --csv "$d/steps.csv" --json "$d/load.json" >"$d/load.txt" 2>&1 &
  loadpid=$!
  sleep "$kill_after"
  local first=$daemon
  kill -KILL "$daemon"
  wait "$daemon" 2>/dev/null || true
  local killed_at; killed_at=$(date +%s.%N)
  sleep 2
  # Whatever the daemon created would be left now: compare with before it started (the load
  # generator's regions are its own, named libreyolo_soak_<pid>_<worker>).
  ls -A /dev/shm | sort >"$d/shm-after-kill.txt"
  local stale; stale=$(comm -13 "$d/shm-before.txt" "$d/shm-after-kill.txt" | grep -v '^libreyolo_soak_' || true)
  [ -z "$stale" ] || fail "kill: /dev/shm entries left after kill -9: $stale"
  local new_files; new_files=$(find "$d" -type f | sort | comm -13 "$d/files-before.txt" - |
    grep -v -E '/(server\.log|rss\.csv|steps\.csv|load\.txt|load\.json|daemon\.pid|shm-[a-z-]+\.txt|files-[a-z-]+\.txt)$' || true)
  [ -z "$new_files" ] || fail "kill: files left by the killed daemon: $new_files"
  echo "--- restart after kill -9 ---" >>"$d/server.log"
  start_daemon "$d" "$gp" "$d/server.log" || { fail "kill: the daemon did not start again"; return 1; }
  echo "$daemon" >"$daemon_file"
  local ready_s; ready_s=$("$py" -c "import time; print(f'{time.time() - $killed_at:.1f}')")
  local restarted_at; restarted_at=$(date +%s)
  sleep "$after"
  kill -TERM "$loadpid"
  local rc=0
  wait "$loadpid" || rc=$?
  loadpid=
  kill "$sampler" 2>/dev/null || true
  sampler=
  stop_all
  ls -A /dev/shm | sort >"$d/shm-end.txt"
  local left; left=$(comm -13 "$d/shm-before.txt" "$d/shm-end.txt" || true)
  [ -z "$left" ] || fail "kill: /dev/shm entries left at the end: $left"
  "$py" - "$d" "$rc" "$ready_s" "$first" <<'PY' | tee -a "$out/summary.md"
import json, sys
d, rc, ready_s, first = sys.argv[1], int(sys.argv[2]), sys.argv[3], sys.argv[4]
load = json.load(open(f"{d}/load.json"))
print(f"\n## kill -9 under load (daemon pid {first}), restart\n")
print(f"Load: {load['concurrency']} workers, {load['seconds']} s; kill -9 after the first part; ready "
      f"again {ready_s} s after the kill (LibTorch and the model loading again).\n")
print("| kind | requests OK | failed for good | requests retried | failures seen (then retried) |")
print("|---|---|---|---|---|")
bad = []
for k, v in load["kinds"].items():
    seen = "; ".join(f"{m} x{n}" for m, n in sorted(v["retried_errors"].items())) or "-"
    print(f"| {k} | {v['ok']} | {v['errors']} | {v['retried_requests']} | {seen} |")
    if v["errors"]:
        bad.append(f"{k}: {v['errors_by_message']}")
grpc_seen = " ".join(m for k in ("grpc_jpeg", "shm") if k in load["kinds"] for m in load["kinds"][k]["retried_errors"])
if "UNAVAILABLE" not in grpc_seen:
    bad.append("the gRPC clients never saw UNAVAILABLE")
# Served after the restart: rows of the last steps have requests OK.
rows = [l.split(",") for l in open(f"{d}/steps.csv").read().split("\n")[1:] if l]
last = [r for r in rows if float(r[0]) >= max(float(x[0]) for x in rows) - 15]
if not any(int(r[2]) for r in last):
    bad.append("no request succeeded in the last 15 s")
for b in bad:
    print(f"\nchaos: FAIL: kill: {b}")
sys.exit(1 if bad or rc > 1 else 0)
PY
  [ "${PIPESTATUS[0]}" = 0 ] || failed=1
}

# ---- explicit model control: replace, load, unload x CHAOS_CYCLES under load ------------------
chaos_churn() {
  local d=$out/churn gp hp
  mkdir -p "$d/staging" "$d/trash"
  put_model rtdetr_tiny "$d/repo/rtdetr_tiny"
  put_model rtdetr_tiny_basic "$d/repo/churn"
  gp=$(free_port); hp=$(free_port)
  write_config "$d" "$gp" "$hp" "  model_control: explicit
  load_models: [rtdetr_tiny]"
  daemon_file=$d/daemon.pid
  start_daemon "$d" "$gp" "$d/server.log" || return 1
  echo "$daemon" >"$daemon_file"
  sample_rss "$d/rss.csv"
  nice -n "$nice_n" "$py" "$root/tools/soak_load.py" --grpc "127.0.0.1:$gp" --http "127.0.0.1:$hp" \
    --image "$image" --kinds grpc_jpeg,rest_binary --concurrency "$conc" --duration 100000 --step 10 \
    --timeout 60 "${load_tls[@]}" --csv "$d/steps.csv" --json "$d/load.json" >"$d/load.txt" 2>&1 &
  loadpid=$!
  sleep $((rss_window + 10))
  local rc=0
  nice -n "$nice_n" "$py" - "$d" "127.0.0.1:$gp" "$t" "$cycles" "$root/tests/fixtures/models" "$image" \
    >"$d/cycles.txt" 2>&1 <<'PY' || rc=$?
import json, os, shutil, sys, time
import numpy as np
import tritonclient.grpc as g
d, url, t, cycles, fixtures, image = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4]), sys.argv[5], sys.argv[6]
c = g.InferenceServerClient(url, ssl=True, root_certificates=f"{t}/ca.crt", private_key=f"{t}/client.key",
                            certificate_chain=f"{t}/client.crt")
jpeg = np.array([open(image, "rb").read()], dtype=np.object_)
t0 = time.time()
marks = {"start": t0}
load_s, failures = [], []
for i in range(cycles):
    src = ("rtdetr_v2_tiny", "rtdetr_tiny_basic")[i % 2]
    try:
        # New files in a staging folder of the same file system, then renamed in; the old folder
        # is renamed out and deleted (a model being replaced under the daemon's repository).
        stage = f"{d}/staging/churn"
        os.makedirs(f"{stage}/1")
        for f in ("config.json", "model.safetensors", "preprocessor_config.json"):
            shutil.copyfile(f"{fixtures}/{src}/{f}", f"{stage}/1/{f}")
        open(f"{stage}/serving.yaml", "w").write("warmup: false\n")
        os.rename(f"{d}/repo/churn", f"{d}/trash/churn-{i}")
        os.rename(stage, f"{d}/repo/churn")
        shutil.rmtree(f"{d}/trash/churn-{i}")
        s = time.time()
        c.load_model("churn")
        load_s.append(time.time() - s)
        if not c.is_model_ready("churn"):
            raise RuntimeError("not ready after RepositoryModelLoad")
        inp = g.InferInput("images", [1], "BYTES")
        inp.set_data_from_numpy(jpeg)
        r = c.infer("churn", [inp], client_timeout=60)
        if r.as_numpy("scores") is None:
            raise RuntimeError("no scores")
        c.unload_model("churn")
        if c.is_model_ready("churn"):
            raise RuntimeError("ready after RepositoryModelUnload")
    except Exception as e:  # noqa: BLE001
        failures.append(f"cycle {i} ({src}): {type(e).__name__}: {str(e)[:200]}")
    print(f"cycle {i} {src} done at {time.time() - t0:.1f} s", flush=True)
marks["end"] = time.time()
load_s.sort()
json.dump({"cycles": cycles, "failures": failures, "seconds": round(marks["end"] - t0, 1),
           "load_p50_s": round(load_s[len(load_s) // 2], 2) if load_s else None,
           "load_max_s": round(load_s[-1], 2) if load_s else None,
           "start": t0, "end": marks["end"]}, open(f"{d}/cycles.json", "w"))
sys.exit(1 if failures else 0)
PY
  sleep "$rss_window"
  kill -TERM "$loadpid"
  local lrc=0
  wait "$loadpid" || lrc=$?
  loadpid=
  sleep 30
  local idle_kb; idle_kb=$(awk '/^VmRSS:/ {print $2}' "/proc/$daemon/status" 2>/dev/null || echo 0)
  kill "$sampler" 2>/dev/null || true
  sampler=
  stop_all
  "$py" - "$d" "$rc" "$lrc" "$idle_kb" "$rss_window" <<'PY' | tee -a "$out/summary.md"
import csv, json, os, sys
d, rc, lrc, idle_kb, win = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4]), float(sys.argv[5])
cy = json.load(open(f"{d}/cycles.json")) if os.path.exists(f"{d}/cycles.json") else {"failures": ["no cycles.json"], "cycles": 0}
load = json.load(open(f"{d}/load.json"))
rows = [(float(r["epoch_s"]), int(r["rss_kb"])) for r in csv.DictReader(open(f"{d}/rss.csv")) if int(r["rss_kb"] or 0) > 0]
def med(v):
    v = sorted(v); return v[len(v) // 2] / 1024 if v else 0
before = med([kb for t, kb in rows if cy.get("start", 0) - win <= t < cy.get("start", 0)])
after = med([kb for t, kb in rows if cy.get("end", 0) <= t < cy.get("end", 0) + win])
print(f"\n## explicit model control: replace + load + infer + unload x {cy['cycles']} under load\n")
print(f"Cycles took {cy.get('seconds')} s (RepositoryModelLoad p50 {cy.get('load_p50_s')} s, max {cy.get('load_max_s')} s); "
      f"failed cycles: {len(cy['failures'])}.\n")
print("| kind (rtdetr_tiny) | requests OK | errors |")
print("|---|---|---|")
bad = list(cy["failures"])
for k, v in load["kinds"].items():
    print(f"| {k} | {v['ok']} | {v['errors']} |")
    if v["errors"]:
        bad.append(f"{k}: {v['errors_by_message']}")
print(f"\nRSS (median of {win:.0f} s under load): {before:.0f} MB before the cycles, {after:.0f} MB after them "
      f"({after - before:+.0f} MB); {idle_kb / 1024:.0f} MB 30 s after the load stopped.")
for b in bad:
    print(f"\nchaos: FAIL: churn: {b}")
sys.exit(1 if bad or rc or lrc > 1 else 0)
PY
  [ "${PIPESTATUS[0]}" = 0 ] || failed=1
}

echo "chaos: output $out"
case $what in
  kill) chaos_kill || failed=1 ;;
  churn) chaos_churn || failed=1 ;;
  all) chaos_kill || failed=1; chaos_churn || failed=1 ;;
  *) echo "chaos: kill, churn or all, not $what" >&2; exit 2 ;;
esac
[ "$failed" = 0 ] && echo "chaos: all checks passed ($out/summary.md)" || echo "chaos: FAILED ($out/summary.md)"
exit "$failed"
