#!/usr/bin/env bash
# The fuzzing campaign (docs/FUZZING.md): runs each target for a number of executions or seconds
# with $JOBS workers sharing one corpus, then records per target the executions, the rate, the
# coverage (libFuzzer's cov: edges and ft: features of the final corpus) and the crashes in the
# table of docs/FUZZING.md, with the date, the commit and the machine; the raw logs go to
# tests/fuzz/campaign/<target>.log.
#
#   scripts/fuzz-campaign.sh [--runs N | --seconds S] [--no-table] [target ...]
#       --runs N     executions per target, all workers together (default 10000000)
#       --seconds S  wall-clock seconds per target instead (slow targets: 3600)
#       targets      default: every binary in the fuzz build (names without _fuzz)
#   scripts/fuzz-campaign.sh --bundle DIR
#       copies the fuzz binaries and the project libraries they load into DIR/{bin,lib} (debug
#       info stripped), packs DIR.tar.gz and prints the sizes and each binary's `ldd` needs (to
#       run the campaign on another machine).
#
# Environment: JOBS (workers, default 1), BUILD_DIR (main build, default build),
# FUZZ_BIN_DIR (prebuilt binaries: no build, no clang needed; DIR/../lib is added to
# LD_LIBRARY_PATH, as is the torch wheel's lib folder of LIBREYOLO_VENV's python or of
# TORCH_LIB), FUZZ_CORPUS_DIR (the growing corpora, default $BUILD_DIR/fuzz-corpus; seeded from
# tests/fuzz/corpus/<target>), FUZZ_MACHINE (what the table says ran it; default from nproc and
# /proc/cpuinfo), FUZZ_COMMIT (the commit the binaries were built from, for prebuilt binaries
# run outside a git checkout). Run it under `nice -n 19` on a shared machine.
set -euo pipefail
cd "$(dirname "$0")/.."
root=$PWD
runs=10000000
seconds=""
table=1
bundle=""
targets=()
while [ $# -gt 0 ]; do
  case $1 in
    --runs) runs=$2; seconds=""; shift 2 ;;
    --seconds) seconds=$2; shift 2 ;;
    --no-table) table=0; shift ;;
    --bundle) bundle=$2; shift 2 ;;
    -h|--help) sed -n '2,26p' "$0"; exit 0 ;;
    *) targets+=("$1"); shift ;;
  esac
done
jobs=${JOBS:-1}
build=${BUILD_DIR:-build}
venv=${LIBREYOLO_VENV:-$HOME/.cache/libreyolo-server/venv-torch2.11}

if [ -n "${FUZZ_BIN_DIR:-}" ]; then
  bin=$(cd "$FUZZ_BIN_DIR" && pwd)
  torch_lib=${TORCH_LIB:-}
  if [ -z "$torch_lib" ] && [ -x "$venv/bin/python" ]; then
    torch_lib=$("$venv/bin/python" -c 'import os, torch; print(os.path.join(os.path.dirname(torch.__file__), "lib"))')
  fi
  export LD_LIBRARY_PATH="$bin/../lib${torch_lib:+:$torch_lib}${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
else
  FUZZ_BUILD_ONLY=1 bash scripts/test.d/10-fuzz.sh "$build"
  bin=$root/$build/fuzz/bin
fi

if [ -n "$bundle" ]; then
  mkdir -p "$bundle/bin" "$bundle/lib"
  cp "$bin"/*_fuzz "$bundle/bin/"
  # The project's own libraries the torch targets load (the rest: the torch wheel and Debian 12).
  for lib in $(ldd "$bin"/*_fuzz | awk '/libreyolo_/ {print $3}' | sort -u); do cp "$lib" "$bundle/lib/"; done
  # Without DWARF (symbols stay: reports name the functions; line numbers come from replaying a
  # crash input with the unstripped build of the same commit): a third of the size.
  strip --strip-debug "$bundle"/bin/* "$bundle"/lib/*
  du -b "$bundle"/bin/* "$bundle"/lib/* | awk '{printf "%10.1f MiB  %s\n", $1/1048576, $2}'
  du -sb "$bundle" | awk '{printf "total %.1f MiB\n", $1/1048576}'
  tar czf "$bundle.tar.gz" -C "$(dirname "$bundle")" "$(basename "$bundle")"
  du -b "$bundle.tar.gz" | awk '{printf "%.1f MiB  %s (what to carry: tar xzf it there)\n", $1/1048576, $2}'
  for f in "$bundle"/bin/*_fuzz; do
    echo "== ldd $(basename "$f")"
    ldd "$f" | awk '{print "  " $1}' | grep -v -e linux-vdso -e ld-linux | sort
  done
  exit 0
fi

if [ ${#targets[@]} -eq 0 ]; then
  mapfile -t targets < <(cd "$bin" && ls *_fuzz | sed 's/_fuzz$//' | sort)
fi
corpus_root=${FUZZ_CORPUS_DIR:-$root/$build/fuzz-corpus}
source scripts/fuzz-max-len.sh
mkdir -p tests/fuzz/campaign "$corpus_root"
export LIBREYOLO_FUZZ_FIXTURES=$root/tests/fixtures LIBREYOLO_LOG_LEVEL=${LIBREYOLO_LOG_LEVEL:-error}
commit=${FUZZ_COMMIT:-$(git rev-parse --short HEAD 2>/dev/null || echo unknown)}
dirty=""
[ -n "${FUZZ_COMMIT:-}" ] || dirty=$(git status --porcelain --untracked-files=no 2>/dev/null | grep -q . && echo "+dirty" || true)
machine=${FUZZ_MACHINE:-"$(nproc) cores, $(sed -n 's/^model name[^:]*: //p' /proc/cpuinfo | head -1)"}

for t in "${targets[@]}"; do
  exe=$bin/${t}_fuzz
  [ -x "$exe" ] || { echo "campaign: no binary $exe"; exit 1; }
  corpus=$corpus_root/$t
  artifacts=$corpus_root/$t-artifacts
  mkdir -p "$corpus" "$artifacts"
  cp -n tests/fuzz/corpus/"$t"/* "$corpus/" 2>/dev/null || true
  log=tests/fuzz/campaign/$t.log
  logs=$(mktemp -d)
  start=$(date +%s)
  if [ -n "$seconds" ]; then what="$seconds s"; else what="$runs executions"; fi
  echo "campaign: $t ($what, $jobs workers)"
  "$exe" -runs=0 -artifact_prefix="$artifacts/" tests/fuzz/corpus/"$t" >"$logs/seeds.log" 2>&1 || true
  for ((w = 0; w < jobs; w++)); do
    if [ -n "$seconds" ]; then limit=(-max_total_time="$seconds"); else limit=(-runs=$(((runs + jobs - 1) / jobs))); fi
    limit+=(-max_len="$(fuzz_max_len "$t")")
    # -timeout 30 s / -rss_limit_mb 6 GiB per input; crashes are kept and the worker stops.
    "$exe" "${limit[@]}" -timeout=30 -rss_limit_mb=6144 -print_final_stats=1 \
      -artifact_prefix="$artifacts/" "$corpus" >"$logs/w$w.log" 2>&1 &
  done
  wait || true
  end=$(date +%s)
  # Coverage of the final corpus: one pass over it, nothing mutated.
  "$exe" -runs=0 -artifact_prefix="$artifacts/" "$corpus" >"$logs/final.log" 2>&1 || true
  execs=$(cat "$logs"/w*.log | sed -n 's/^stat::number_of_executed_units: *//p' | awk '{s += $1} END {print s + 0}')
  cov=$(grep -o 'INITED cov: [0-9]* ft: [0-9]*' "$logs/final.log" | tail -1 | awk '{print $3, $5}')
  [ -n "$cov" ] || cov=$(grep -o 'cov: [0-9]* ft: [0-9]*' "$logs/final.log" | tail -1 | awk '{print $2, $4}')
  crashes=$(find "$artifacts" -type f \( -name 'crash-*' -o -name 'timeout-*' -o -name 'oom-*' -o -name 'leak-*' \) | wc -l)
  files=$(find "$corpus" -type f | wc -l)
  secs=$((end - start > 0 ? end - start : 1))
  {
    echo "# $t: $(date -u +%Y-%m-%dT%H:%MZ), commit $commit$dirty, $machine, $jobs workers"
    for f in "$logs"/w*.log; do
      echo "## worker $(basename "$f" .log): first and last lines"
      head -n 40 "$f"; echo "..."; tail -n 40 "$f"
    done
    echo "## seed corpus replay"; tail -n 3 "$logs/seeds.log"
    echo "## final corpus pass"; tail -n 5 "$logs/final.log"
    find "$artifacts" -type f | sed 's/^/artifact: /'
  } >"$log"
  rm -rf "$logs"
  row="| \`$t\` | $execs | $((execs / secs)) | ${cov%% *} | ${cov##* } | $files | $crashes | $secs | $(date -u +%Y-%m-%d) | $commit$dirty | $machine, $jobs workers |"
  echo "campaign: $row"
  if [ "$table" = 1 ]; then
    python3 - "$t" "$row" <<'PY'
import re, sys
target, row = sys.argv[1], sys.argv[2]
path = "docs/FUZZING.md"
text = open(path).read()
begin, end = "<!-- campaign:begin -->", "<!-- campaign:end -->"
head, rest = text.split(begin)
body, tail = rest.split(end)
rows = [l for l in body.strip().splitlines() if l.startswith("| `")]
rows = [l for l in rows if not l.startswith("| `%s` " % target)] + [row]
rows.sort()
header = ("| target | executions | exec/s | cov | ft | corpus | crashes | seconds | date | commit | machine |\n"
          "|---|---:|---:|---:|---:|---:|---:|---:|---|---|---|\n")
open(path, "w").write(head + begin + "\n" + header + "\n".join(rows) + "\n" + end + tail)
PY
  fi
done
