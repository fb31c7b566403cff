#!/usr/bin/env bash
# The grpo_smollm2 step of several commits on one machine, a profile of one step each (issue #43's "profile before
# and after"). Two halves, because the GPU machine gets the working tree without git:
#
#   here:  benchmarks/step_ab.sh --prepare REF...   writes .carry/ab/REF/: REF's version of every file under
#          hybridflow/ and megatron_adapters/ that differs from the working tree (carry .carry)
#   there: benchmarks/step_ab.sh OUT [VARIANT...]   runs each VARIANT (a prepared REF laid over the working tree,
#          or "main" = the working tree as sent; default: every prepared REF, then main) through
#          benchmarks/h200_figures.sh's `runs` stage and prints the median stage times of steps 2.. per variant
#
# Environment: AB_STEPS (12) steps per run, AB_PROFILE (6) the profiled step, AB_S (170) seconds per run,
# AB_OVERRIDES extra Hydra overrides for every variant. Writes OUT/<variant>/{metrics.jsonl,*.txt (profiles)}.
set -u
cd "$(dirname "$0")/.."
if [ "${1:-}" = --prepare ]; then
    shift
    for ref in "$@"; do
        rm -rf ".carry/ab/$ref"
        for f in $( (git diff --name-only "$ref" -- hybridflow megatron_adapters
                     git ls-files --others --exclude-standard hybridflow megatron_adapters) | sort -u); do
            if git cat-file -e "$ref:$f" 2>/dev/null; then
                mkdir -p ".carry/ab/$ref/$(dirname "$f")" && git show "$ref:$f" > ".carry/ab/$ref/$f"
            fi
        done
        echo "$ref: $(find ".carry/ab/$ref" -type f 2>/dev/null | wc -l) files in .carry/ab/$ref"
    done
    exit 0
fi
out=${1:?usage: benchmarks/step_ab.sh OUT [VARIANT...] | --prepare REF...}
shift
variants=("$@")
[ ${#variants[@]} -eq 0 ] && variants=($(ls .carry/ab 2>/dev/null) main)
args="+experiment=grpo_smollm2 trainer.total_steps=${AB_STEPS:-12} trainer.profile_step=${AB_PROFILE:-6} ${AB_OVERRIDES:-}"
tree=$(mktemp -d)
cp -r hybridflow megatron_adapters "$tree/"
restore() { rm -rf hybridflow megatron_adapters && cp -r "$tree/hybridflow" "$tree/megatron_adapters" .; }
trap restore EXIT
for v in "${variants[@]}"; do
    restore
    if [ "$v" != main ]; then
        [ -d ".carry/ab/$v" ] || { echo "step_ab: no .carry/ab/$v; run --prepare $v here first" >&2; exit 2; }
        cp -r ".carry/ab/$v/." .
    fi
    work="/tmp/step_ab_$v"
    RUN_S=${AB_S:-170} RUNS="$v $args" FIGURES_WORK="$work" bash benchmarks/h200_figures.sh "$out/$v.raw" runs \
        > "/tmp/step_ab_$v.log" 2>&1
    tail -n 2 "$out/$v.raw/run-$v.log" 2>/dev/null | cut -c1-300
    mkdir -p "$out/$v"
    cp "$work/$v/metrics.jsonl" "$work/$v"/profile/*.txt "$out/$v/" 2>/dev/null
    rm -rf "$out/$v.raw"
    [ -f "$out/$v/metrics.jsonl" ] && python3 - "$v" "$out/$v/metrics.jsonl" <<'PY'
import json, statistics, sys
rl = [d for d in map(json.loads, open(sys.argv[2])) if d.get("phase") == "rl"]
keys = ["step_time_s", "time/generate", "time/ref", "time/old_logprobs", "time/update_actor", "response_length"]
print(sys.argv[1], f"{len(rl[1:])} steps, medians:", {k: round(statistics.median(d.get(k, 0) for d in rl[1:]), 3) for k in keys},
      "first steps:", [round(d["step_time_s"], 2) for d in rl[:2]])
PY
    grep "^== " "$out/$v"/*.txt 2>/dev/null
done
