#!/usr/bin/env bash
# Lays out the public data sets coloc's tools read where they look for them (docs/data.md,
# "Fetching the data"): the KACE artifact (nba556677go/KACE-artifact) and Alibaba's GPU trace
# v2023 (alibaba/clusterdata).
#
#   scripts/fetch-data.sh [--from DIR] [DEST]
#
# DEST defaults to ../shared/data beside the repository, the tools' default paths. With
# --from DIR, DIR holds clones of both repositories (DIR/KACE-artifact, DIR/clusterdata) and
# nothing is fetched; without it, both are cloned (git, network) into DEST/.sources at the
# commits docs/data.md names. Every source file is checked before anything is written; a data
# set folder that already exists in DEST is left as it is.
set -euo pipefail

KACE_REPO=https://github.com/nba556677go/KACE-artifact
KACE_COMMIT=25299ecd
ALIBABA_REPO=https://github.com/alibaba/clusterdata
ALIBABA_COMMIT=7a6c496

usage() {
    echo "usage: $0 [--from DIR] [DEST]" >&2
    exit 2
}

from=""
dest=""
while [ $# -gt 0 ]; do
    case "$1" in
        --from) [ $# -ge 2 ] || usage; from="$2"; shift 2 ;;
        -h|--help) sed -n '2,13p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
        -*) usage ;;
        *) [ -z "$dest" ] || usage; dest="$1"; shift ;;
    esac
done
root="$(cd "$(dirname "$0")/.." && pwd)"
dest="${dest:-$root/../shared/data}"
mkdir -p "$dest"

if [ -z "$from" ]; then
    from="$dest/.sources"
    mkdir -p "$from"
    for pair in "KACE-artifact $KACE_REPO $KACE_COMMIT" "clusterdata $ALIBABA_REPO $ALIBABA_COMMIT"; do
        set -- $pair
        if [ ! -d "$from/$1/.git" ]; then
            git clone --quiet "$2" "$from/$1"
        fi
        git -C "$from/$1" checkout --quiet "$3"
    done
fi

kace="$from/KACE-artifact"
ali="$from/clusterdata/cluster-trace-gpu-v2023/csv"
nway="$kace/scripts/multiinstance/dataset"
comb3="$nway/comb3/batch2-8/MPS100/unseen_partition_batch/rand10/KACE/trainbatch2"

# (source, destination) pairs, destination relative to DEST.
plan=(
    "$kace/profiling/system_metrics/KACE/baseline_labels.csv|kace-v100/profiling/system_metrics/KACE/baseline_labels.csv"
    "$kace/output/dataset/MPS100/MPS100_kernel_labels_targetMPS100.csv|kace-v100/output/dataset/MPS100/MPS100_kernel_labels_targetMPS100.csv"
    "$nway/KACE/0907_total_labels_comb4_batch2-8_targetMPS100.csv|kace-4way/artifact/0907_total_labels_comb4_batch2-8_targetMPS100.csv"
    "$comb3/training_set.csv|kace-3way/artifact/training_set.csv"
    "$comb3/testing_set.csv|kace-3way/artifact/testing_set.csv"
    "$ali/openb_pod_list_default.csv|alibaba-gpu-v2023/openb_pod_list_default.csv"
    "$ali/openb_pod_list_gpushare100.csv|alibaba-gpu-v2023/openb_pod_list_gpushare100.csv"
    "$ali/openb_node_list_gpu_node.csv|alibaba-gpu-v2023/openb_node_list_gpu_node.csv"
)
kernels="$kace/profiling/kernel_metrics/output_KACE/kernel_total"
missing=0
for entry in "${plan[@]}"; do
    source="${entry%%|*}"
    if [ ! -f "$source" ]; then
        echo "missing: $source" >&2
        missing=1
    fi
done
if ! compgen -G "$kernels/*.csv" >/dev/null; then
    echo "missing: $kernels/*.csv" >&2
    missing=1
fi
if [ "$missing" -ne 0 ]; then
    echo "nothing laid out: $from lacks the files above (docs/data.md names their sources)" >&2
    exit 1
fi

# kace-3way/runs.csv: the artifact's training_set.csv then testing_set.csv, one run per row,
# columns selected and renamed only (../shared/data/kace-3way/README.md), with the sum of the
# three throughputs and the file each run came from.
derive_3way() {
    python3 - "$1" "$2" <<'PY'
import csv, sys
src, out = sys.argv[1], sys.argv[2]
members = ["workload%d" % i for i in (1, 2, 3)]
speeds = ["w%dthroughput" % i for i in (1, 2, 3)]
alone = ["w%dexclusive_throughput" % i for i in (1, 2, 3)]
with open(out, "w", newline="") as f:
    writer = csv.writer(f, lineterminator="\n")
    writer.writerow(["run_id"] + members + speeds + alone + ["throughput_sum", "artifact_file"])
    run_id = 0
    for name in ("training_set.csv", "testing_set.csv"):
        with open("%s/%s" % (src, name), newline="") as rows:
            for row in csv.DictReader(rows):
                missing = [c for c in members + speeds + alone if not row.get(c)]
                if missing:
                    sys.exit("%s: a run lacks %s" % (name, ", ".join(missing)))
                run_id += 1
                total = sum(float(row[c]) for c in speeds)
                writer.writerow([run_id] + [row[c] for c in members + speeds + alone]
                                + [repr(total), name])
PY
}

for set_dir in kace-v100 kace-3way kace-4way alibaba-gpu-v2023; do
    if [ -e "$dest/$set_dir" ]; then
        echo "kept: $dest/$set_dir (already there)"
        continue
    fi
    staging="$dest/.$set_dir.partial"
    rm -rf "$staging"
    for entry in "${plan[@]}"; do
        target="${entry#*|}"
        [ "${target%%/*}" = "$set_dir" ] || continue
        mkdir -p "$(dirname "$staging/${target#*/}")"
        cp "${entry%%|*}" "$staging/${target#*/}"
    done
    if [ "$set_dir" = kace-3way ]; then
        derive_3way "$staging/artifact" "$staging/runs.csv"
    fi
    if [ "$set_dir" = kace-v100 ]; then
        mkdir -p "$staging/profiling/kernel_metrics/output_KACE/kernel_total"
        cp "$kernels"/*.csv "$staging/profiling/kernel_metrics/output_KACE/kernel_total/"
    fi
    mv "$staging" "$dest/$set_dir"
    echo "laid out: $dest/$set_dir"
done
echo "kace-4way/runs.csv (the 4-way runs, columns selected and renamed, and the artifact's evaluated subset) is not derived here: docs/data.md says how"
