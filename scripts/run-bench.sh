#!/usr/bin/env bash
# Load one VM's PostgreSQL with pgbench and watch the autoscaler react.
#
#   VM_NAME=pg-vm-0 scripts/run-bench.sh          cluster path (kind/up.sh, then an example)
#   scripts/run-bench.sh --local [--duration S]   one machine, no cluster (docs/LOCAL.md)
#   scripts/run-bench.sh --local --help           every option of the local path
#   scripts/run-bench.sh --help                   show this text
#
# Cluster path: pgbench runs in a throwaway pod next to the VM (so the load does not go through
# a port-forward, which would be the bottleneck), while this terminal shows the extender's
# view: the VM's permitted vCPUs and every node's free CPU (scripts/watch-vcpus over a
# port-forward to the extender's /state).
#
# Environment (cluster path):
#   VM_NAME          the VM pod, e.g. pg-vm-0 (required)
#   VM_NAMESPACE     its namespace (default: default)
#   KUBE_CONTEXT     kubectl context (default: the current one)
#   PGBENCH_IMAGE    image with pgbench and pg_isready (default: postgres:16-alpine)
#   PGUSER PGDATABASE PGPASSWORD   passed to pgbench (defaults: postgres, postgres, unset)
#   SCALE            pgbench -i scale factor (default: 10)
#   CLIENTS          pgbench clients, and threads (default: 8)
#   DURATION         seconds of load (default: 120)
#   STATE_PORT       local port for the extender's /state (default: 10298)
#
# Exit status: 0 when the benchmark ran; 1 when a tool or the cluster failed; 2 for arguments
# the cluster path does not take (it is configured by the environment above).
set -euo pipefail

usage() { sed -n '2,/^set -euo pipefail/{/^#/s/^# \{0,1\}//p}' "${BASH_SOURCE[0]}"; }
case "${1:-}" in
  -h | --help) usage; exit 0 ;;
esac

ROOT="$(cd "$(dirname "$(readlink -f "${BASH_SOURCE[0]}")")/.." && pwd)"

say() { printf '==> %s\n' "$*" >&2; }
die() { printf 'run-bench: %s\n' "$*" >&2; exit 1; }

# ---------------------------------------------------------------------------------------------
# LOCAL MODE: `--local` runs the benchmark on one machine without Kubernetes: PostgreSQL and
# pgbench on the host, the host's node_exporter, the minimal guest under vm_runner (QEMU), the
# extender in standalone mode (examples/local/) and the agent scaling the VM from the host's
# load. scripts/local_bench.py does the work; `--local --help` lists its options, docs/LOCAL.md
# explains the setup. VM_NAME picks the VM pod of examples/local/cluster.yaml (default pg-vm-0).
# ---------------------------------------------------------------------------------------------
run_local() {
  local python="$ROOT/.venv/bin/python"
  [[ -x "$python" ]] || die "no virtualenv at $ROOT/.venv; run scripts/setup first"
  "$python" "$ROOT/scripts/local_bench.py" "$@"
}

if [[ "${1:-}" == "--local" ]]; then
  shift
  run_local "$@"
  exit $?
fi
if [[ $# -ne 0 ]]; then
  printf 'run-bench: unexpected arguments: %s (the cluster path is configured by environment variables: see scripts/run-bench.sh --help)\n' "$*" >&2
  exit 2
fi

# --- cluster path ----------------------------------------------------------------------------
: "${VM_NAME:?set VM_NAME to the VM pod, e.g. VM_NAME=pg-vm-0 $0}"
VM_NAMESPACE="${VM_NAMESPACE:-default}"
PGBENCH_IMAGE="${PGBENCH_IMAGE:-postgres:16-alpine}"
PGUSER="${PGUSER:-postgres}"
PGDATABASE="${PGDATABASE:-postgres}"
PGPASSWORD="${PGPASSWORD:-}"
SCALE="${SCALE:-10}"
CLIENTS="${CLIENTS:-8}"
DURATION="${DURATION:-120}"
STATE_PORT="${STATE_PORT:-10298}"

command -v kubectl >/dev/null 2>&1 || die "kubectl is not installed or not on PATH"
command -v python3 >/dev/null 2>&1 || die "python3 is needed for scripts/watch-vcpus"

KUBECTL=(kubectl)
[[ -n "${KUBE_CONTEXT:-}" ]] && KUBECTL+=(--context "$KUBE_CONTEXT")

# The VM must exist, be a VM, and be scheduled: its pod IP is where pgbench connects (the
# runner forwards the pod's 5432 to the guest).
is_vm="$("${KUBECTL[@]}" -n "$VM_NAMESPACE" get pod "$VM_NAME" \
  -o 'jsonpath={.metadata.labels.vm-autoscaling\.io/vm}' 2>/dev/null)" \
  || die "pod $VM_NAMESPACE/$VM_NAME not found (kubectl apply -k manifests/examples/ first)"
[[ "$is_vm" == "true" ]] || die "pod $VM_NAMESPACE/$VM_NAME has no label vm-autoscaling.io/vm=true"
say "waiting for $VM_NAMESPACE/$VM_NAME to run"
"${KUBECTL[@]}" -n "$VM_NAMESPACE" wait --for=jsonpath='{.status.phase}'=Running \
  "pod/$VM_NAME" --timeout=300s >/dev/null
VM_IP="$("${KUBECTL[@]}" -n "$VM_NAMESPACE" get pod "$VM_NAME" -o 'jsonpath={.status.podIP}')"
[[ -n "$VM_IP" ]] || die "pod $VM_NAMESPACE/$VM_NAME has no IP yet"

BENCH_POD="pgbench-${VM_NAME}"
PF_PID=""
WATCH_PID=""
cleanup() {
  [[ -n "$WATCH_PID" ]] && kill "$WATCH_PID" 2>/dev/null
  [[ -n "$PF_PID" ]] && kill "$PF_PID" 2>/dev/null
  "${KUBECTL[@]}" -n "$VM_NAMESPACE" delete pod "$BENCH_POD" --ignore-not-found --wait=false \
    >/dev/null 2>&1
  return 0
}
trap cleanup EXIT INT TERM

# The extender's /state is on its loopback-only verbs port; port-forward reaches it from
# inside the pod's network namespace.
say "port-forwarding the extender's /state to 127.0.0.1:$STATE_PORT"
"${KUBECTL[@]}" -n vm-autoscaling port-forward deploy/scheduler-extender \
  "$STATE_PORT:10298" >/dev/null 2>&1 &
PF_PID=$!
for _ in $(seq 1 20); do
  python3 "$ROOT/scripts/watch-vcpus" --once --url "http://127.0.0.1:$STATE_PORT/state" \
    >/dev/null 2>&1 && break
  sleep 0.5
done

say "before the load:"
python3 "$ROOT/scripts/watch-vcpus" --once --url "http://127.0.0.1:$STATE_PORT/state" \
  || say "(the extender's /state is not reachable; the benchmark runs anyway)"

# Every 5 s, the VM's row and its node's free CPU, interleaved with pgbench's progress lines.
python3 "$ROOT/scripts/watch-vcpus" --no-clear --interval 5 --vm "$VM_NAMESPACE/$VM_NAME" \
  --url "http://127.0.0.1:$STATE_PORT/state" >&2 &
WATCH_PID=$!

say "pgbench against $VM_NAME ($VM_IP:5432): scale $SCALE, $CLIENTS clients, ${DURATION}s"
# Single-quoted on purpose: expanded by the pod's shell, from the env passed with --env.
# shellcheck disable=SC2016
BENCH_SCRIPT='
until pg_isready -q -h "$VM_IP" -p 5432; do echo "waiting for PostgreSQL in the VM..."; sleep 2; done
pgbench -h "$VM_IP" -i -s "$SCALE" --quiet
pgbench -h "$VM_IP" -c "$CLIENTS" -j "$CLIENTS" -T "$DURATION" -P 5 --no-vacuum
'
"${KUBECTL[@]}" -n "$VM_NAMESPACE" run "$BENCH_POD" --rm -i --restart=Never --quiet \
  --image="$PGBENCH_IMAGE" \
  --env="VM_IP=$VM_IP" --env="SCALE=$SCALE" --env="CLIENTS=$CLIENTS" \
  --env="DURATION=$DURATION" --env="PGUSER=$PGUSER" --env="PGDATABASE=$PGDATABASE" \
  --env="PGPASSWORD=$PGPASSWORD" \
  --command -- sh -c "$BENCH_SCRIPT"

kill "$WATCH_PID" 2>/dev/null || true
WATCH_PID=""
say "after the load (the VM shrinks back after the agent's shrink_after_seconds of low load):"
python3 "$ROOT/scripts/watch-vcpus" --once --url "http://127.0.0.1:$STATE_PORT/state" || true
