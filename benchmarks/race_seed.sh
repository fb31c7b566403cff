#!/usr/bin/env bash
# One side's seeds of the grpo_smollm2 race against TRL (issue #43), for a GPU lease of one call per seed:
#   benchmarks/race_seed.sh OUT SIDE SEEDS      SIDE: smollm2 | smollm2-vllm | trl-curve; SEEDS: 1 or 1,2,3
# Every call adds its runs to /tmp/race (kept while the machine stays warm), so the last call's OUT/<tag>/race.tar.gz
# holds every seed run so far; `python -m benchmarks.time_to_accuracy DIR` on it (here) gives the headline.
# RACE_ARGS overrides the curve's arguments (default --steps 40 --eval-every 5), CURVE_S the limit per call, and
# CURVE_OVERRIDES adds Hydra overrides to hybridflow's side.
set -u
cd "$(dirname "$0")/.."
out=${1:?usage: benchmarks/race_seed.sh OUT SIDE SEEDS}
side=${2:?side}
seeds=${3:?seeds}
tag=${side}_${seeds//,/}
# Both sides need SmolLM2's pieces; TRL's side and rollout=vllm need the vLLM bundle's (a call without them fails
# after its start-up, spending device time: stop 53's first TRL call did).
compgen -G "/tmp/sp/smollm2.tar.part*" >/dev/null || { echo "race_seed: no SmolLM2 pieces in /tmp/sp; send .sp/s0 and .sp/s1 first" >&2; exit 2; }
if [ "$side" != smollm2 ] && ! compgen -G "/tmp/vb/vllm_bundle.tar.part*" >/dev/null; then
    echo "race_seed: $side needs the vLLM bundle in /tmp/vb; send .vp/p0 .. .vp/p6 first" >&2; exit 2
fi
SEEDS=$seeds CURVE_ARGS="${RACE_ARGS:---steps 40 --eval-every 5}" CURVE_S=${CURVE_S:-560} CURVE_DIR=/tmp/race \
    FIGURES_WORK="/tmp/race_work_$tag" bash benchmarks/h200_figures.sh "/tmp/race_out/$tag" "$side" > "/tmp/race_$tag.txt" 2>&1
tail -n 4 "/tmp/race_$tag.txt" | cut -c1-300
mkdir -p "$out/$tag" && cp "/tmp/race_out/$tag/race.tar.gz" "$out/$tag/" 2>/dev/null
grep -h "seed\|accuracy" "/tmp/race_out/$tag/$side.log" 2>/dev/null | tail -n 8 | cut -c1-250
