#!/usr/bin/env bash
# How the H100 starter dataset in this folder was measured: coloc's own profiling worker
# (nvml backend: NVML, then Nsight Compute) on six PyTorch workloads, then `coloc
# calibrate` on every pair of them, `coloc train` and Rank for every target. Run from the
# repository root on a machine with one NVIDIA GPU, PyTorch with torchvision, Nsight
# Compute and a release build of coloc:
#
#   datasets/h100/measure.sh profile   OUT_DIR [COLOC_BINARY]   # profiles -> OUT_DIR/profiled.db
#   datasets/h100/measure.sh calibrate OUT_DIR [COLOC_BINARY] [PROFILED_DB]
#
# calibrate runs every pair of the profiled workloads (only those with $CALIBRATE_WITH when
# set), then, when $PROFILE_AFTER holds commands, runs them with the profiler on and
# profiles what they register; then trains and ranks every target both ways.
#
# Each phase fits in ten minutes on an H100 and leaves at most eight files in OUT_DIR (the
# logs, the database after the phase, the raw measurements as one archive).
set -uo pipefail

phase=${1:?profile or calibrate}
out=${2:?output folder}
coloc=$(readlink -f "${3:-target/release/coloc}")
mkdir -p "$out"
out=$(readlink -f "$out")
work=$(mktemp -d /tmp/coloc-h100-XXXX)
deadline=$((SECONDS + ${COLOC_PHASE_BUDGET_S:-540}))
exec > >(tee -a "$out/$phase.log") 2>&1

echo "== $(date -u +%FT%TZ) phase $phase on $(hostname)"
gpu=$(nvidia-smi --query-gpu=name --format=csv,noheader | head -1)
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv
ncu=$(command -v ncu || ls -d /opt/nvidia/nsight-compute/*/ncu /usr/local/cuda/bin/ncu 2>/dev/null | tail -1)
echo "ncu: $ncu: $("$ncu" --version | tail -1)"
python3 -c 'import sys, torch, torchvision; print("python", sys.version.split()[0], "torch", torch.__version__, "cuda", torch.version.cuda, "torchvision", torchvision.__version__)'
echo "mps: $(command -v nvidia-cuda-mps-control || echo 'not installed')"

# The worker runs the program an allow-list names, resolved; a virtual environment's
# python3 resolves to the base interpreter, which then needs the environment's packages.
python=$(command -v python3)
export PYTHONPATH=$(python3 -c 'import site; print(":".join(site.getsitepackages()))')
export COLOC__PROFILER__ALLOWED_PROGRAMS=$(readlink -f "$python")
export COLOC__PROFILER__NCU_PATH=$ncu
export COLOC__DATABASE__URL=sqlite://$work/coloc.db
export COLOC__SERVER__LISTEN=127.0.0.1:50051
export COLOC__MODEL__DEFAULT_GPU=$gpu
export COLOC__PROFILER__NCU_LAUNCH_SKIP=1000 COLOC__PROFILER__NCU_LAUNCH_COUNT=200
timing=(--seconds 8 --warmup 5)

serve() {
    "$coloc" serve --log-format json >>"$out/serve.log" 2>&1 &
    server=$!
    for _ in $(seq 100); do "$coloc" health >/dev/null 2>&1 && return 0; sleep 0.2; done
    echo "the server did not start"; tail -20 "$out/serve.log"; exit 1
}
stop() { kill "$server"; wait "$server"; }

case $phase in
profile)
    export COLOC__PROFILER__BACKEND=nvml
    export COLOC__PROFILER__KEEP_RAW_DIR=$work/raw
    serve
    register() { # NAME MODE MODEL BATCH SCRIPT ARGS...
        local name=$1 mode=$2 model=$3 batch=$4 script=$5
        shift 5
        local args=(--arg "examples/workloads/$script")
        local spec=()
        while (($#)); do
            if [[ $1 == --nvtx-range ]]; then spec+=(--nvtx-range "$2"); shift 2; continue; fi
            args+=(--arg "$1"); shift
        done
        for a in --batch-size "$batch" "${timing[@]}"; do args+=(--arg "$a"); done
        "$coloc" workloads register "$name" --mode "$mode" --model "$model" --batch-size "$batch" \
            --program "$python" "${args[@]}" --working-dir "$PWD" --profile-on "$gpu" "${spec[@]}"
    }
    register resnet18_batch32-train training resnet-18 32 resnet18_train.py
    register bert-encoder_batch16-inf inference bert-encoder 16 transformer_infer.py
    register bmm-2048_batch8-inf inference bmm-2048 8 matmul_loop.py
    register resnet50_batch32-train training resnet-50 32 torchvision_model.py --model resnet50 --mode train
    register vit-b-16_batch8-inf inference vit-b-16 8 torchvision_model.py --model vit_b_16 --mode inf
    # Thousands of kernels a step: Nsight Compute reads 200 of them, 1,000 launches in.
    register gpt-decoder_batch4-inf inference gpt-decoder 4 gpt_decode.py --nvtx-range ""
    while "$coloc" workloads list --state pending-profile | grep -q _batch; do
        if ((SECONDS > deadline)); then echo "out of time; stopping"; break; fi
        sleep 2
    done
    "$coloc" workloads --json list >"$out/workloads.json"
    "$coloc" workloads list
    "$coloc" backup "$out/profiled.db"
    stop
    tar czf "$out/raw.tgz" -C "$work" raw
    ;;
calibrate) # every pair of the profiled workloads; then profile any still pending
    cp "${4:?the profiled database}" "$work/coloc.db"
    serve
    "$coloc" workloads list
    t0=$SECONDS
    "$coloc" calibrate --pairs 100 --sharing auto ${CALIBRATE_WITH:+--with "$CALIBRATE_WITH"} || {
        echo "calibration under MPS failed: plain sharing instead"
        "$coloc" calibrate --pairs 100 --sharing shared ${CALIBRATE_WITH:+--with "$CALIBRATE_WITH"}
    }
    echo "calibration took $((SECONDS - t0)) s"
    stop
    if [[ -n ${PROFILE_AFTER:-} ]]; then
        export COLOC__PROFILER__BACKEND=nvml COLOC__PROFILER__KEEP_RAW_DIR=$work/raw
        serve
        eval "$PROFILE_AFTER"
        while "$coloc" workloads list --state pending-profile | grep -q _batch; do
            if ((SECONDS > deadline)); then echo "out of time; stopping"; break; fi
            sleep 2
        done
        stop
        [[ -d $work/raw ]] && tar czf "$out/raw.tgz" -C "$work" raw
        export COLOC__PROFILER__BACKEND=off
    fi
    serve
    "$coloc" workloads list
    "$coloc" train --gpu "$gpu"
    mkdir -p "$work/rank"
    for target in $("$coloc" workloads list --state profiled | awk 'NR > 1 {print $1}'); do
        for objective in throughput normalized; do
            "$coloc" rank "$target" --json --objective "$objective" --include-below-break-even --top 10 \
                >"$work/rank/$target.$objective.json" || echo "rank $target $objective failed"
        done
    done
    tar czf "$out/rank.tgz" -C "$work" rank
    "$coloc" backup "$out/calibrated.db"
    stop
    ;;
*)
    echo "unknown phase $phase"; exit 2 ;;
esac
echo "== $(date -u +%FT%TZ) phase $phase done in $SECONDS s"
