#!/usr/bin/env bash
# Issue #9's multi-GPU validation on one node of 4 or 8 GPUs (NCCL), in one call that ends inside its budget:
#   benchmarks/multigpu.sh OUT_DIR [STAGE ...]        stages: numerics bridge sweep (default: all three)
#   MULTIGPU_DRY_RUN=1 MULTIGPU_GPUS=8 benchmarks/multigpu.sh OUT_DIR     # CPU: print the plan; only the
#                                                     # sweep's planner runs (throughput --simulate)
# numerics  the distributed adapter tests on nccl (HYBRIDFLOW_TEST_DEVICE=cuda: fp32, TF32 off, their CPU
#           tolerances) and the one-GPU bf16 step; a test file runs only where the GPUs cover its world size.
# bridge    the bridge's distributed tests on nccl, an NCCL all-gather probe, and benchmarks/reshard.py
#           (8B shape, bf16) under torchrun for the (TP_t, PP_t, TP_g) pairs this GPU count accepts.
# sweep     benchmarks.throughput, one placement per call (colocated, split, auto) on one random checkpoint
#           of the experiment's shape built once (ppo_llama3_8b on 8 GPUs, ppo_llama3_8b_4gpu on 4), a short
#           workload; the tables and chart are merged into one table.md / stage_times.png.
# Every step runs under min(its limit, what is left of MULTIGPU_BUDGET_S, default 560 s), so a 600 s device
# call ends with the results packed; a step that no longer fits is skipped and says so. OUT_DIR gets 7 files
# at most: device.txt, numerics.log, bridge.log, sweep.log (step tails), summary.md, stage_times.png,
# results.tar.gz (tables, JSON, chart, every step's full log). Knobs: MULTIGPU_GPUS, NUMERICS_TESTS,
# BRIDGE_PAIRS, BRIDGE_SHAPE, SWEEP_EXPERIMENT, SWEEP_PLACEMENTS, SWEEP_WORKLOAD, SWEEP_MODEL_ARGS,
# SWEEP_WARMUP, SWEEP_STEPS, <STEP>_S limits (see benchmarks/README.md).
set -uo pipefail

out="${1:?usage: benchmarks/multigpu.sh OUT_DIR [numerics] [bridge] [sweep]}"
shift
stages=("$@")
[ ${#stages[@]} -eq 0 ] && stages=(numerics bridge sweep)
repo="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
dry="${MULTIGPU_DRY_RUN:-0}"
py="${PYTHON:-python3}"
budget="${MULTIGPU_BUDGET_S:-560}"
deadline=$((SECONDS + budget))
reserve=35 # seconds kept for a killed step's grace (30 s) and the summary and archive
work=/tmp/multigpu
mkdir -p "$out"
out="$(cd "$out" && pwd)"
cd "$repo" || exit 1
rm -rf "$work" && mkdir -p "$work/logs" "$work/numerics" "$work/bridge" "$work/sweep"
rm -f "$out"/{device.txt,numerics.log,bridge.log,sweep.log,summary.md,stage_times.png,results.tar.gz}

# NVLink multicast stays off (the lent machines set these; a program started with its own env keeps them).
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 PYTHONUNBUFFERED=1

if [ -n "${MULTIGPU_GPUS:-}" ]; then
    gpus="$MULTIGPU_GPUS"
    gpu_name="${MULTIGPU_GPU_NAME:-NVIDIA H100 80GB HBM3}"
elif command -v nvidia-smi >/dev/null; then
    gpus="$(nvidia-smi -L 2>/dev/null | grep -c '^GPU ')"
    gpu_name="$(nvidia-smi --query-gpu=name --format=csv,noheader 2>/dev/null | head -n 1)"
else
    gpus=0
    gpu_name=none
fi
if ((gpus >= 8)); then n=8; elif ((gpus >= 4)); then n=4; elif ((gpus >= 2)); then n=2; else n=$gpus; fi
case "$gpu_name" in
*H200*) gpu_type=H200 tbps=4.8 ;; # cluster.gpu_type; datasheet HBM TB/s for reshard.py's nominal floor
*) gpu_type=H100 tbps=3.35 ;;
esac

# Pure-Python packages the image lacks (megatron-core, hydra-core, omegaconf, antlr4) come as wheels in .whl/.
if [ "${MULTIGPU_WHEELS:-1}" = 1 ] && compgen -G ".whl/*.whl" >/dev/null; then
    if [ "$dry" = 1 ]; then
        echo "== wheels: pip install --target /tmp/site .whl/*.whl (not in a dry run)"
    else
        "$py" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site \
            .whl/*.whl || exit 1
    fi
    export PYTHONPATH="/tmp/site:$repo${PYTHONPATH:+:$PYTHONPATH}"
else
    export PYTHONPATH="$repo${PYTHONPATH:+:$PYTHONPATH}"
fi
{
    echo "GPUs: $gpus ($gpu_name), variant: $n GPUs, cluster.gpu_type=$gpu_type, dry run: $dry, budget: ${budget}s"
    nvidia-smi --query-gpu=index,name,memory.total,driver_version --format=csv,noheader 2>&1
    nvidia-smi topo -m 2>&1
    "$py" -c 'import sys, torch; print("python", sys.version.split()[0], "torch", torch.__version__,
"cuda", torch.version.cuda, "visible GPUs", torch.cuda.device_count())' 2>&1
    "$py" -c 'import megatron.core, pytest; print("megatron-core", megatron.core.__version__, "pytest", pytest.__version__)' 2>&1
} >"$out/device.txt"
have_pytest=1
"$py" -c 'import pytest' 2>/dev/null || have_pytest=0
echo "| stage | step | result | seconds |" >"$work/steps.md"
echo "|---|---|---|---|" >>"$work/steps.md"

# --- helpers -------------------------------------------------------------------------------------------------
stage_end=$deadline # a stage may end its steps sooner (bridge: BRIDGE_S)
time_left() {
    local end=$((deadline - reserve))
    ((stage_end < end)) && end=$stage_end
    echo $((end - SECONDS))
}

note() { # note STAGE TEXT: a line in the stage's log and in the steps table
    echo "== $2" | tee -a "$out/$1.log"
    echo "| $1 | $2 | - | - |" >>"$work/steps.md"
}

step() { # step STAGE NAME LIMIT COMMAND...: run under min(LIMIT, time left); full log in $work/logs/NAME.log
    local stage="$1" name="$2" limit="$3"
    shift 3
    local left
    left="$(time_left)"
    ((limit > left)) && limit=$left
    if ((limit < 30)); then
        echo "== $name: skipped, ${left}s left (MULTIGPU_BUDGET_S=$budget, stage limit)" | tee -a "$out/$stage.log"
        echo "| $stage | $name | skipped: no time left | - |" >>"$work/steps.md"
        return 124
    fi
    echo "== $name (limit ${limit}s): $*" | tee -a "$out/$stage.log"
    if [ "$dry" = 1 ] && [ "${run_in_dry:-0}" != 1 ]; then
        echo "| $stage | $name | planned | limit $limit |" >>"$work/steps.md"
        return 0
    fi
    local start=$SECONDS rc
    # timeout leads its own process group: at the limit the whole group gets TERM, then KILL 30 s later
    # (torchrun's workers live in their own sessions; torchrun stops them itself on TERM).
    timeout --signal=TERM --kill-after=30 "$limit" "$@" </dev/null >"$work/logs/$name.log" 2>&1 &
    local pid=$!
    wait "$pid"
    rc=$?
    kill -KILL -- "-$pid" 2>/dev/null # ranks this step's launcher left behind (same process group)
    echo "== $name: rc=$rc in $((SECONDS - start))s" | tee -a "$out/$stage.log"
    # a run's build line (device memory outside torch per build stage: the communicators) may lie above the tail
    grep -h "GPU memory by build stage" "$work/logs/$name.log" >>"$out/$stage.log"
    tail -n 40 "$work/logs/$name.log" >>"$out/$stage.log"
    echo "| $stage | $name | rc=$rc | $((SECONDS - start)) |" >>"$work/steps.md"
    return "$rc"
}

# Helper programs, written where the steps read them (small; each prints or writes its result).
cat >"$work/nccl_allgather.py" <<'EOF'
"""All-gather bandwidth over the world and over rank pairs (nccl on GPUs, gloo on CPU): the bridge's floor."""
import json, os, sys, time
import torch
import torch.distributed as dist

cuda = torch.cuda.is_available()
device = torch.device("cuda", int(os.environ["LOCAL_RANK"])) if cuda else torch.device("cpu")
if cuda:
    torch.cuda.set_device(device)
dist.init_process_group("nccl" if cuda else "gloo")
world = dist.get_world_size()
pairs = dist.new_subgroups(2)[0] if world > 2 and world % 2 == 0 else None
rows = []
for label, group, size in (("world", None, world), ("pairs", pairs, 2)):
    if size < 2 or (label == "pairs" and group is None):
        continue
    for mib in (int(m) for m in sys.argv[1].split(",")):
        chunk = (mib << 20) // 2 // size  # bf16 elements per rank; the gathered output is `mib` MiB
        x = torch.randn(chunk, device=device).to(torch.bfloat16)
        y = torch.empty(chunk * size, dtype=torch.bfloat16, device=device)
        for _ in range(3):
            dist.all_gather_into_tensor(y, x, group=group)
        if cuda:
            torch.cuda.synchronize()
        dist.barrier()
        start = time.perf_counter()
        for _ in range(10):
            dist.all_gather_into_tensor(y, x, group=group)
        if cuda:
            torch.cuda.synchronize()
        seconds = (time.perf_counter() - start) / 10
        alg = y.numel() * 2 / seconds / 1e9
        rows.append({"group": f"{label} ({size} ranks)", "output_mib": mib, "seconds": seconds,
                     "algbw_gb_per_s": alg, "busbw_gb_per_s": alg * (size - 1) / size})
if dist.get_rank() == 0:
    print(json.dumps({"nccl_all_gather": rows, "world": world, "backend": dist.get_backend()}))
dist.destroy_process_group()
EOF
cat >"$work/bridge_table.py" <<'EOF'
"""bridge.md + reshard.jsonl from the reshard / all-gather step logs (their JSON lines)."""
import json, sys
from pathlib import Path

logs, out = Path(sys.argv[1]), Path(sys.argv[2])
def records(pattern, key):
    for log in sorted(logs.glob(pattern), key=lambda p: p.stat().st_mtime):  # run order
        for line in log.read_text(errors="replace").splitlines():
            if line.startswith("{") and key in line:
                yield json.loads(line)
reshard, probe = list(records("reshard-*.log", '"layout"')), list(records("nccl-allgather.log", "nccl_all_gather"))
(out / "reshard.jsonl").write_text("".join(json.dumps(r) + "\n" for r in reshard))
lines = ["## Bridge: benchmarks/reshard.py (colocated, every rank)", "",
         "| layout | world | shape | dtype | buckets | model GB/rank | best s | median s | read+write GB/s "
         "| received GB/rank | received GB/s/rank | copy GB/s | vs copy floor |", "|" + "---|" * 13]
for r in reshard:
    got = r["bytes_received_per_rank"] / 1e9
    lines.append(f"| {r['layout']} | {r['world']} | {r['shape']} | {r['dtype']} | {r['buckets']} | "
                 f"{r['model_gb_per_rank']:.2f} | {r['seconds_best']:.4f} | {r['seconds_median']:.4f} | "
                 f"{r['gb_per_s_read_write']:.1f} | {got:.2f} | {got / r['seconds_best']:.1f} | "
                 f"{r['copy_bandwidth_gb_per_s']:.0f} | {r['vs_floor']:.2f} |")
for p in probe:
    (out / "nccl_allgather.json").write_text(json.dumps(p, indent=2))
    lines += ["", f"NCCL all-gather ({p['backend']}, {p['world']} ranks; busbw = algbw x (n-1)/n):", "",
              "| group | output MiB | seconds | algbw GB/s | busbw GB/s |", "|---|---|---|---|---|"]
    lines += [f"| {x['group']} | {x['output_mib']} | {x['seconds']:.5f} | {x['algbw_gb_per_s']:.1f} | "
              f"{x['busbw_gb_per_s']:.1f} |" for x in p["nccl_all_gather"]]
(out / "bridge.md").write_text("\n".join(lines) + "\n")
print("\n".join(lines))
EOF
cat >"$work/make_checkpoint.py" <<'EOF'
"""A random HF checkpoint of the experiment's model shape (+ shape overrides) and the character tokenizer."""
import sys
from pathlib import Path
import torch
from hybridflow.config import load_experiment
from hybridflow.data import build_char_tokenizer
from hybridflow.trainer.model_files import random_hf_checkpoint

experiment, out, *overrides = sys.argv[1:]
with torch.device("cuda" if torch.cuda.is_available() else "cpu"):  # initialised on the GPU: seconds, not minutes
    random_hf_checkpoint(load_experiment(experiment, overrides).model, Path(out), seed=0)
build_char_tokenizer(Path(out))
print("checkpoint in", out, sorted(p.name for p in Path(out).iterdir()))
EOF
cat >"$work/sweep_table.py" <<'EOF'
"""One table.md / summary.json / stage_times.png over the per-placement benchmarks.throughput outputs."""
import json, sys
from pathlib import Path
from benchmarks.report import measured_table, plot_stage_times, stage_table

root, title, labels = Path(sys.argv[1]), sys.argv[2], sys.argv[3:]
runs = []
for label in labels:
    summary = root / label / "summary.json"
    if not summary.is_file():
        runs.append({"placement": label, "status": "not run", "reason": "no time left or the step was killed"})
        continue
    for run in json.loads(summary.read_text())["runs"]:
        runs.append({**run, "placement": label})
layouts = [f"- {r['placement']}: " + ", ".join(f"{k} {v}" for k, v in r.get("layouts", {}).items())
           + (f"  \n  `{r['command']}`" if r.get("command") else "") for r in runs]
table = (f"## Placement sweep: {title}\n\n" + measured_table(runs) + "\nstage seconds (mean per timed step):\n\n"
         + stage_table(runs) + "\nlayouts and commands:\n\n" + "\n".join(layouts) + "\n")
(root / "table.md").write_text(table)
(root / "summary.json").write_text(json.dumps({"runs": runs}, indent=2))
plot_stage_times(runs, root / "stage_times.png")
print(table)
EOF

# --- stages --------------------------------------------------------------------------------------------------
numerics() {
    stage_end=$deadline
    # shellcheck disable=SC2206  # NUMERICS_TESTS is a list of FILE:WORLD words
    local tests=(${NUMERICS_TESTS:-tests/megatron_adapters/test_model_parity.py:4 \
        tests/megatron_adapters/test_forward_backward.py:2 tests/megatron_adapters/test_logprobs.py:2 \
        tests/megatron_adapters/test_two_meshes.py:2 tests/megatron_adapters/test_optimizer.py:4 \
        tests/megatron_adapters/test_hf_weights_roundtrip.py:4 tests/megatron_adapters/test_runtime_gpu.py:1})
    local files=() item
    for item in "${tests[@]}"; do # FILE:WORLD, WORLD = the most ranks the file launches
        if ((${item##*:} <= gpus)); then files+=("${item%:*}"); else note numerics "${item%:*}: skipped, needs ${item##*:} GPUs, $gpus here"; fi
    done
    if ((${#files[@]} == 0)); then note numerics "no test file fits $gpus GPUs"; return; fi
    if ((have_pytest == 0)); then note numerics "pytest is not importable: add its wheels to .whl/"; return; fi
    step numerics numerics-tests "${NUMERICS_S:-150}" env HYBRIDFLOW_TEST_DEVICE=cuda "$py" -m pytest -v \
        -p no:cacheprovider -rfE --junitxml="$work/numerics/junit.xml" "${files[@]}"
}

bridge() {
    stage_end=$((SECONDS + ${BRIDGE_S:-150}))
    if ((n < 2)); then note bridge "needs 2 or more GPUs, $gpus here"; return; fi
    if ((gpus >= 4 && have_pytest == 1)); then
        step bridge bridge-tests "${BRIDGE_TESTS_S:-120}" env HYBRIDFLOW_TEST_DEVICE=cuda "$py" -m pytest -v \
            -p no:cacheprovider -rfE --junitxml="$work/bridge/junit.xml" \
            tests/megatron_adapters/bridge/test_bridge_distributed.py
    else
        note bridge "tests/megatron_adapters/bridge/test_bridge_distributed.py: skipped (4 GPUs and pytest needed)"
    fi
    local run=("$py" -m torch.distributed.run --standalone --nproc-per-node "$n")
    step bridge nccl-allgather "${NCCL_S:-60}" "${run[@]}" "$work/nccl_allgather.py" "${NCCL_MIB:-64,1024}"
    # (TP_t,PP_t,TP_g) over all n ranks, each checked against build_reshard_plan's rules for that world size;
    # (2,2,4) needs 8 ranks (TP_g/TP_t must divide DP_t) and (4,2,8) 16, so neither runs on 4 resp. 8 GPUs.
    local -A pairs=([2]="2,1,1 1,1,2" [4]="2,1,1 4,1,2 2,2,1 2,1,4" [8]="2,1,1 4,1,2 2,2,4 8,1,4 4,2,2")
    local pair t p g
    for pair in ${BRIDGE_PAIRS:-${pairs[$n]}}; do
        IFS=, read -r t p g <<<"$pair"
        step bridge "reshard-t${t}p${p}g${g}" "${RESHARD_S:-60}" "${run[@]}" benchmarks/reshard.py \
            --shape "${BRIDGE_SHAPE:-8b}" --train-tp "$t" --train-pp "$p" --gen-tp "$g" --dtype bf16 --iters 5 \
            --nominal-tbps "$tbps" --out "$work/bridge"
    done
    [ "$dry" = 1 ] || "$py" "$work/bridge_table.py" "$work/logs" "$work/bridge" >/dev/null 2>>"$out/bridge.log"
}

sweep() {
    stage_end=$deadline
    local experiment
    case "$n" in
    8) experiment="${SWEEP_EXPERIMENT:-ppo_llama3_8b}" ;;
    4) experiment="${SWEEP_EXPERIMENT:-ppo_llama3_8b_4gpu}" ;;
    *) note sweep "needs 4 or 8 GPUs, $gpus here"; return ;;
    esac
    # shellcheck disable=SC2206  # SWEEP_MODEL_ARGS / SWEEP_WORKLOAD are lists of hydra overrides
    local model=(${SWEEP_MODEL_ARGS:-}) ckpt="$work/sweep/model"
    # Short work per step (random weights: every response is max_new_tokens long); vLLM is not installed on
    # the lent machines and cannot serve a rollout on a subset of ranks (split), so the native engine runs.
    # shellcheck disable=SC2206
    local workload=(${SWEEP_WORKLOAD:-rollout=megatron data.source=builtin:add data.max_prompt_length=32 \
        data.seq_length=160 rollout.max_new_tokens=128 rollout.stop_token_ids=[] data.train_batch_size=32 \
        algorithm.mini_batch_size=32 trainer.parity_max_abs=2.0})
    [ "$gpu_type" = H200 ] && workload+=(cluster.gpu_type=H200)
    step sweep checkpoint "${CHECKPOINT_S:-150}" "$py" "$work/make_checkpoint.py" "$experiment" "$ckpt" "${model[@]}"
    local rc=$?
    if [ "$dry" != 1 ] && ((rc != 0)); then note sweep "no checkpoint (rc=$rc): placements not run"; return; fi
    local paths=("model.path=$ckpt" "data.tokenizer=$ckpt")
    [ "$dry" = 1 ] && paths=() # the planner needs no weights; the shape is the experiment's either way
    local labels=() placement extra
    for placement in ${SWEEP_PLACEMENTS:-colocated split auto}; do
        extra=()
        if [ "$placement" = split ] && ((n == 4)); then
            # conf/placement/split.yaml is the 8-GPU split (critic on 4-5): on 4 GPUs, policy on 0-1, critic on 2-3.
            extra=("placement.resources.actor=[0,1]" "placement.resources.rollout=[0,1]"
                "placement.resources.ref=[0,1]" "placement.resources.critic=[2,3]"
                roles.actor.parallel.tp=2 roles.critic.parallel.tp=2)
        fi
        labels+=("$placement")
        # Greedy: each placement may use what is left (a later one is skipped rather than all cut short).
        local limit
        limit="$(time_left)"
        ((limit > ${SWEEP_RUN_S:-600})) && limit=${SWEEP_RUN_S:-600}
        local cmd=("$py" -m benchmarks.throughput "+experiment=$experiment" "${paths[@]}" "${workload[@]}"
            "${model[@]}" "${extra[@]}" --placements "$placement" --warmup-steps "${SWEEP_WARMUP:-1}"
            --steps "${SWEEP_STEPS:-2}" --run-timeout $((limit > 90 ? limit - 45 : 45))
            --out "$work/sweep/$placement")
        if [ "$dry" = 1 ]; then
            cmd+=(--simulate --simulate-sizes 7b --simulate-gpus 16)
            run_in_dry=1 step sweep "sweep-$placement (planner only)" 60 "${cmd[@]}"
        else
            step sweep "sweep-$placement" "$limit" "${cmd[@]}"
        fi
        rm -rf "$work/sweep/$placement/$placement"/{final_hf,checkpoints}
    done
    "$py" "$work/sweep_table.py" "$work/sweep" "$experiment on $n x $gpu_name (${SWEEP_WARMUP:-1} warm-up + \
${SWEEP_STEPS:-2} timed steps)" "${labels[@]}" >/dev/null 2>>"$out/sweep.log"
    rm -rf "$ckpt"
}

for s in "${stages[@]}"; do
    case "$s" in
    numerics | bridge | sweep) "$s" ;;
    *) echo "unknown stage $s (use numerics, bridge, sweep)" >&2 ;;
    esac
done

# --- summary and archive -------------------------------------------------------------------------------------
{
    echo "# benchmarks/multigpu.sh $(date -u '+%Y-%m-%d %H:%M UTC'), commit $(git rev-parse --short HEAD 2>/dev/null)"
    echo
    head -n 1 "$out/device.txt"
    echo
    cat "$work/steps.md"
    for log in numerics-tests bridge-tests; do
        [ -f "$work/logs/$log.log" ] || continue
        echo
        echo "## $log (pytest, HYBRIDFLOW_TEST_DEVICE=cuda)"
        echo
        grep -E '^(FAILED|ERROR) |^=+ .*(passed|failed|error).* =+$' "$work/logs/$log.log" | sed 's/^/    /'
    done
    for md in "$work/bridge/bridge.md" "$work/sweep/table.md"; do
        [ -f "$md" ] && echo && cat "$md"
    done
} >"$out/summary.md"
[ -f "$work/sweep/stage_times.png" ] && cp "$work/sweep/stage_times.png" "$out/"
excludes=(--exclude=model --exclude=final_hf --exclude=checkpoints --exclude=init_model --exclude='*.safetensors'
    --exclude='*.distcp' --exclude=tensorboard)
tar -czf "$out/results.tar.gz" -C "$work" "${excludes[@]}" .
if (($(stat -c %s "$out/results.tar.gz") > 15 * 1024 * 1024)); then # 16 MiB is the most a file brings back
    tar -czf "$out/results.tar.gz" -C "$work" "${excludes[@]}" --exclude='logs/*rank*' --exclude='*.log' .
fi
cat "$out/summary.md"
ls -la "$out"
