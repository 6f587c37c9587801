#!/usr/bin/env bash
# Issue 15's table, before and after side by side in one run (bench/lab/history/summary.md,
# "Issue 15 side by side"): two revisions, each measured by its own bench from
# a `git archive`, alternated BEFORE AFTER BEFORE AFTER on one local broker.
#
#   bench/lab/side_by_side.sh BEFORE AFTER [OUT]      e.g. 9883f92 HEAD /tmp/sbs
#
# Per side and round: `python -m bench --only fold_speed,throughput,quix_peer
# --runs 3` (the side's default build: the compiled wheel where its bench has
# one, else its source), then `--only latency --runs 5` with a second busy
# process on the box (BENCH_LATENCY_BUSY where the bench has it, else one
# started here); every non-internal topic is deleted after each side.  Then
# `bench.lab.fold_cli_ab` (`processor fold` of a 150k-event log against a bare
# orjson parse, three alternated rounds; the output SHA-256 must agree) and
# `bench.fold_speed` by CPU, three alternated rounds.  Results land in
# OUT/res/<side><round>/ (the benches' JSON and logs), OUT/fold_cli_ab.log and
# OUT/fold_speed_<side><round>.json; a summary is printed at the end.
set -euo pipefail
cd "$(dirname "$0")/../.."
[ $# -ge 2 ] || { echo "usage: $0 BEFORE AFTER [OUT]" >&2; exit 2; }
OUT=${3:-$(mktemp -d)}
mkdir -p "$OUT"
OUT=$(cd "$OUT" && pwd)
declare -A REV=([before]=$1 [after]=$2)
for side in before after; do
  rm -rf "$OUT/$side" && mkdir -p "$OUT/$side"
  git archive "${REV[$side]}" | tar -x -C "$OUT/$side"
done
BOOT=${KAFKA_BOOTSTRAP_SERVERS:-}
if [ -z "$BOOT" ]; then
  BOOT=$(python3 -m processor.devbroker start --dir "$OUT/broker")
  trap 'python3 -m processor.devbroker stop --dir "$OUT/broker" --purge' EXIT
fi
export KAFKA_BOOTSTRAP_SERVERS=$BOOT

drop_topics() {
  python3 - "$BOOT" <<'PY'
import sys
from confluent_kafka.admin import AdminClient
admin = AdminClient({"bootstrap.servers": sys.argv[1]})
topics = [t for t in admin.list_topics(timeout=10).topics if not t.startswith("__")]
for future in (admin.delete_topics(topics).values() if topics else []):
    future.result()
PY
}

run_side() { # side round
  local dir=$OUT/$1 res=$OUT/res/$1$2
  mkdir -p "$res/lat"
  echo "== $(date -u +%T) $1 (${REV[$1]}) round $2, load $(cut -d' ' -f1 /proc/loadavg)"
  (cd "$dir" && rm -f bench/results/*.json \
    && python3 -m bench --only fold_speed,throughput,quix_peer --runs 3 --no-report \
      > "$res/main.log" 2>&1 && cp bench/results/*.json "$res/")
  local busy=""
  grep -q BENCH_LATENCY_BUSY "$dir/bench/latency.py" || {
    python3 -c "while True: pass" & busy=$!
  }
  (cd "$dir" && rm -f bench/results/*.json \
    && BENCH_LATENCY_BUSY=1 BENCH_LATENCY_TUNED=0 python3 -m bench --only latency --runs 5 \
      --no-report > "$res/lat.log" 2>&1 && cp bench/results/*.json "$res/lat/")
  [ -z "$busy" ] || kill "$busy"
  drop_topics
}

for round in 1 2; do
  run_side before $round
  run_side after $round
done

# `processor fold` by each side installed in a venv: the compiled wheel the
# after side's bench built, a source install of the before side unless its
# bench built one too
venv_of() { # side
  local built=$OUT/$1/bench/results/tmp/venv-compiled/bin/python
  if [ -x "$built" ]; then echo "$built"; return; fi
  python3 -m venv --system-site-packages "$OUT/venv-$1" >&2
  "$OUT/venv-$1/bin/pip" install -q wheel >&2
  "$OUT/venv-$1/bin/pip" install -q --no-deps --no-build-isolation "$OUT/$1" >&2
  echo "$OUT/venv-$1/bin/python"
}
PY_BEFORE=$(venv_of before)
PY_AFTER=$(venv_of after)
python3 -m bench.lab.fold_cli_ab --events 150000 --rounds 3 \
  "before=$PY_BEFORE" "after=$PY_AFTER" | tee "$OUT/fold_cli_ab.log"

# bench.fold_speed by CPU in each side's venv (a folder holding only a link to
# the side's bench/ on PYTHONPATH, so the venv's installed package is imported)
for round in 1 2 3; do
  for side in before after; do
    mkdir -p "$OUT/link-$side"
    ln -sfn "$OUT/$side/bench" "$OUT/link-$side/bench"
    py=$PY_BEFORE
    [ $side = before ] || py=$PY_AFTER
    (cd "$OUT/link-$side" && PYTHONSAFEPATH=1 PYTHONPATH="$OUT/link-$side" "$py" -m bench.fold_speed \
      --events 30000 --runs 5 --out "$OUT/fold_speed_$side$round.json" > /dev/null)
  done
done

python3 - "$OUT" <<'PY'
import json, sys
from pathlib import Path
out = Path(sys.argv[1])
for side in ("before", "after"):
    print(side)
    for r in (1, 2):
        res = out / "res" / f"{side}{r}"
        row = []
        for fig in ("fold_speed", "throughput", "quix_peer"):
            d = json.loads((res / f"{fig}.json").read_text())
            row.append(f"{fig} {d['ratio']['median']} ({d['value']['median']:,.0f} {d['value']['unit']})")
        lat = json.loads((res / "lat" / "latency.json").read_text())
        p50 = [round(run["p50_ms"]) for run in lat["raw"]["runs"]]
        row.append(f"latency p99/I {lat['ratio']['samples']} p50 ms {p50}")
        print(f"  round {r}: " + "; ".join(row))
    for r in (1, 2, 3):
        d = json.loads((out / f"fold_speed_{side}{r}.json").read_text())
        print(f"  fold_speed {r}: wall {d['ratio_fold_to_envelope']}, "
              f"CPU {d.get('ratio_fold_to_envelope_cpu')}, fold {d['events_per_s']['fold']['median']:,} events/s")
PY
