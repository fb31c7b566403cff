#!/usr/bin/env bash
# Everything the H200 lacks, made here in one go before a device session (all paths are git-ignored):
#   .whl/        megatron-core, hydra-core, omegaconf, antlr4 runtime: pure wheels at the versions .venv runs
#   .carry/trl/  TRL and the dependencies the H200 lacks (benchmarks/README.md, "the TRL side"), for the trl stages
#   .vp/p0..p6   vLLM 0.20.2 in 7 pieces (../shared/gpu/vllm_bundle.sh make, cut again to 47 MiB)
#   .sp/s0, s1   SmolLM2-135M-Instruct and gguf in 2 pieces (../shared/gpu/smollm2_pieces.sh make, cut again)
# Usage: benchmarks/gpu_pieces.sh [whl trl vllm smollm2]   (default: all four; existing ones are kept)
# Then follow benchmarks/README.md, "Not yet run: the next single-GPU session": each device call carries .whl
# and .carry, and the first seven move .vp/pK and .sp/sK.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
parts=("$@")
[ ${#parts[@]} -eq 0 ] && parts=(whl trl vllm smollm2)
py=.venv/bin/python
[ -x "$py" ] || { echo "gpu_pieces: no .venv; run scripts/setup_env.sh first" >&2; exit 1; }
version() { "$py" -c "import importlib.metadata as m; print(m.version('$1'))"; }
download() {  # download DIR SPEC...: wheels only, for the H200's CPython 3.12 on x86-64 Linux
    local dir=$1; shift
    "$py" -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
        --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 \
        --platform any -d "$dir" "$@"
}
# A call carries 64 MiB with the tracked tree (~12 MiB by stop 56, recorded results included): 52 MiB pieces no
# longer fit beside it. recut DIR SUBDIR NAME SUFFIX_LEN: the pieces DIR/SUBDIR*/NAME* joined and cut again into
# 47 MiB ones (SmolLM2 stays two), piece K
# in DIR/SUBDIR<K> (the order of the names, which the GPU side joins with `cat NAME*`, is kept).
recut() {
    local dir=$1 sub=$2 name=$3 len=$4 tmp
    tmp=$(mktemp -d)
    cat "$dir/$sub"*/"$name"* | split -b 47M -d -a "$len" - "$tmp/$name"
    rm -rf "${dir:?}/$sub"*
    local k=0 piece
    for piece in "$tmp/$name"*; do mkdir -p "$dir/$sub$k" && mv "$piece" "$dir/$sub$k/"; k=$((k + 1)); done
    rmdir "$tmp"
}
for part in "${parts[@]}"; do
    case "$part" in
    whl)
        [ -n "$(ls .whl/*.whl 2>/dev/null)" ] && { echo "gpu_pieces: .whl kept"; continue; }
        download .whl "megatron-core==$(version megatron-core)" "hydra-core==$(version hydra-core)" \
            "omegaconf==$(version omegaconf)"
        # the antlr4 runtime hydra pins (4.9.x) is a source archive on PyPI: build its pure wheel here
        "$py" -m pip wheel -q --no-deps -w .whl "antlr4-python3-runtime==$(version antlr4-python3-runtime)" ;;
    trl)
        [ -n "$(ls .carry/trl/*.whl 2>/dev/null)" ] && { echo "gpu_pieces: .carry/trl kept"; continue; }
        # the H200's image has pandas, pyarrow, xxhash, python-dateutil and six (device/KINDS.md); with them
        # the pieces would pass the 64 MiB a call carries
        download .carry/trl trl==1.16.0 datasets==5.2.0 dill==0.4.1 multiprocess==0.70.19 fsspec==2026.9.0 ;;
    vllm)
        [ -d .vp/p0 ] && { echo "gpu_pieces: .vp kept (rm -rf .vp to make it again)"; continue; }
        bash ../shared/gpu/vllm_bundle.sh make .vp && recut .vp p vllm_bundle.tar.part 2 ;;
    smollm2)
        [ -d .sp/s0 ] && { echo "gpu_pieces: .sp kept"; continue; }
        bash ../shared/gpu/smollm2_pieces.sh make .sp && recut .sp s smollm2.tar.part 1 ;;
    *) echo "gpu_pieces: unknown part '$part' (use whl, trl, vllm, smollm2)" >&2; exit 2 ;;
    esac
done
du -sh .whl .carry/trl .vp .sp 2>/dev/null || true
