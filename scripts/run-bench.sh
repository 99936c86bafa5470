#!/usr/bin/env bash
# Load one VM's PostgreSQL with pgbench and watch the autoscaler react.
#
#   VM_NAME=pg-vm scripts/run-bench.sh            cluster path (kind/up.sh, then an example)
#   scripts/run-bench.sh --local [--duration S]   one machine, no cluster (docs/LOCAL.md)
#   scripts/run-bench.sh --local --help           every option of the local path
#   scripts/run-bench.sh --help                   show this text
#
# Cluster path: pgbench runs in a throwaway pod next to the VM (so the load does not go through
# a port-forward, which would be the bottleneck), while this terminal shows the extender's
# view: the VM's permitted vCPUs and every node's free CPU (scripts/watch-vcpus over a
# port-forward to the extender's /state). The VM runs the postgres guest image
# (vm_runner/Dockerfile): PostgreSQL 15 with role bench, password bench and database pgbench,
# filled at scale 5 when the guest boots. After the load the script waits for the VM to shrink
# back and ends with a verdict line (grew to N, pgbench's tps, shrank in Y s) and a plot of the run
# (OUT below), as the local path does.
#
# Environment (cluster path):
#   VM_NAME          the VM pod, e.g. pg-vm (required)
#   VM_NAMESPACE     its namespace (default: default)
#   KUBE_CONTEXT     kubectl context (default: the current one)
#   PGBENCH_IMAGE    image with pgbench and pg_isready (default: postgres:16-alpine)
#   PGUSER PGDATABASE PGPASSWORD   passed to pgbench (defaults: bench, pgbench, bench: the
#                    guest image's)
#   SCALE            re-run pgbench -i at this scale first (default: unset, use the guest's 5)
#   BUILTIN          pgbench built-in script (default: select-only, CPU-bound in the guest)
#   CLIENTS          pgbench clients, and threads (default: 8)
#   DURATION         seconds of load (default: 120)
#   PG_WAIT          seconds to wait for PostgreSQL in the VM to accept connections: the
#                    guest fills its database at boot, tens of seconds under TCG (default: 300)
#   COOLDOWN         seconds to wait after the load for the VM to shrink back (default: 120)
#   STATE_PORT       local port for the extender's /state (default: 10298)
#   AGENT_PORT       local port for the VM's node's agent /metrics (default: 10301)
#   OUT              directory for bench.png and bench.json, the samples the plot draws: the
#                    VM's vCPUs, permit and wanted size, the node's free CPU and pgbench's tps
#                    each second, as the local path draws them (default: out/cluster-bench;
#                    needs the virtualenv of scripts/setup, or there is no plot)
#   WATCH_INTERVAL   seconds between the VM's rows shown during the load (default: 5)
#
# Exit status: 0 when the VM grew under the load and shrank back after it; 1 when a tool or
# the cluster failed (PostgreSQL not ready within PG_WAIT included); 2 for arguments the
# cluster path does not take (it is configured by the environment above); 3 when the benchmark
# ran but the VM did not grow, or did not shrink back within COOLDOWN.
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
: "${VM_NAME:?set VM_NAME to the VM pod, e.g. VM_NAME=pg-vm $0}"
VM_NAMESPACE="${VM_NAMESPACE:-default}"
PGBENCH_IMAGE="${PGBENCH_IMAGE:-postgres:16-alpine}"
PGUSER="${PGUSER:-bench}"
PGDATABASE="${PGDATABASE:-pgbench}"
PGPASSWORD="${PGPASSWORD:-bench}"
SCALE="${SCALE:-}"
BUILTIN="${BUILTIN:-select-only}"
CLIENTS="${CLIENTS:-8}"
DURATION="${DURATION:-120}"
PG_WAIT="${PG_WAIT:-300}"
COOLDOWN="${COOLDOWN:-120}"
STATE_PORT="${STATE_PORT:-10298}"
AGENT_PORT="${AGENT_PORT:-10301}"
OUT="${OUT:-$ROOT/out/cluster-bench}"
WATCH_INTERVAL="${WATCH_INTERVAL:-5}"

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
VM_NODE="$("${KUBECTL[@]}" -n "$VM_NAMESPACE" get pod "$VM_NAME" -o 'jsonpath={.spec.nodeName}')"
VCPU_MODE=hotplug
[[ "$("${KUBECTL[@]}" -n "$VM_NAMESPACE" get pod "$VM_NAME" \
  -o 'jsonpath={.metadata.annotations.vm-autoscaling\.io/hypervisor}')" == qmp+qga:* ]] \
  && VCPU_MODE=online

BENCH_POD="pgbench-${VM_NAME}"
PF_PID=""
AGENT_PF_PID=""
WATCH_PID=""
SAMPLER_PID=""
cleanup() {
  [[ -n "$WATCH_PID" ]] && kill "$WATCH_PID" 2>/dev/null
  # Only a run that failed gets here with the sampler running: no plot, the error stays last.
  [[ -n "$SAMPLER_PID" ]] && { kill -KILL "$SAMPLER_PID"; wait "$SAMPLER_PID" || true; } 2>/dev/null
  [[ -n "$PF_PID" ]] && kill "$PF_PID" 2>/dev/null
  [[ -n "$AGENT_PF_PID" ]] && kill "$AGENT_PF_PID" 2>/dev/null
  "${KUBECTL[@]}" -n "$VM_NAMESPACE" delete pod "$BENCH_POD" --ignore-not-found --wait=false \
    >/dev/null 2>&1
  return 0
}
trap cleanup EXIT INT TERM

# The extender's /state is on its loopback-only verbs port; port-forward reaches it from
# inside the pod's network namespace. The leader's: the standby holds every VM at its maximum.
LEADER=$("${KUBECTL[@]}" -n vm-autoscaling get pod -l vm-autoscaling.io/extender-role=leader \
  -o name | head -n 1)
[[ -n "$LEADER" ]] || die "no scheduler pod is labelled vm-autoscaling.io/extender-role=leader"
say "port-forwarding the extender's /state ($LEADER) to 127.0.0.1:$STATE_PORT"
"${KUBECTL[@]}" -n vm-autoscaling port-forward "$LEADER" \
  "$STATE_PORT:10298" >/dev/null 2>&1 &
PF_PID=$!
for _ in $(seq 1 20); do
  python3 "$ROOT/scripts/watch-vcpus" --once --url "http://127.0.0.1:$STATE_PORT/state" \
    >/dev/null 2>&1 && break
  sleep 0.5
done

# The plot's samples (scripts/cluster_bench.py): the agent of the VM's node has the VM's
# vCPUs, online count and wanted size; the extender's /state its permit and the node's room.
PHASE_FILE="$(mktemp)"
BENCH_LOG="$(mktemp)"
echo idle >"$PHASE_FILE"
AGENT_POD=$("${KUBECTL[@]}" -n vm-autoscaling get pod -l app.kubernetes.io/name=autoscaler-agent \
  --field-selector "spec.nodeName=$VM_NODE" -o name | head -n 1)
if [[ ! -x "$ROOT/.venv/bin/python" ]]; then
  say "no virtualenv at $ROOT/.venv (scripts/setup): no plot"
elif [[ -z "$AGENT_POD" ]]; then
  say "no autoscaler-agent pod on $VM_NODE: no plot"
else
  "${KUBECTL[@]}" -n vm-autoscaling port-forward "$AGENT_POD" "$AGENT_PORT:10301" \
    >/dev/null 2>&1 &
  AGENT_PF_PID=$!
  "$ROOT/.venv/bin/python" "$ROOT/scripts/cluster_bench.py" \
    --state-url "http://127.0.0.1:$STATE_PORT/state" \
    --agent-url "http://127.0.0.1:$AGENT_PORT/metrics" --vm "$VM_NAMESPACE/$VM_NAME" \
    --node "$VM_NODE" --vcpu-mode "$VCPU_MODE" --phase-file "$PHASE_FILE" \
    --bench-log "$BENCH_LOG" --out "$OUT" &
  SAMPLER_PID=$!
fi

say "before the load:"
python3 "$ROOT/scripts/watch-vcpus" --once --url "http://127.0.0.1:$STATE_PORT/state" \
  || say "(the extender's /state is not reachable; the benchmark runs anyway)"

# Every WATCH_INTERVAL s, the VM's row and its node's free CPU, interleaved with pgbench's
# progress lines. Also kept in WATCH_LOG: the verdict reads the VM's peak from it.
WATCH_LOG="$(mktemp)"
python3 "$ROOT/scripts/watch-vcpus" --no-clear --interval "$WATCH_INTERVAL" \
  --vm "$VM_NAMESPACE/$VM_NAME" \
  --url "http://127.0.0.1:$STATE_PORT/state" > >(tee "$WATCH_LOG" >&2) &
WATCH_PID=$!

# The VM's permitted vCPUs and minimum in the extender's /state ("N MIN"), nothing if unknown.
vm_permit() {
  python3 - "http://127.0.0.1:$STATE_PORT/state" "$VM_NAMESPACE/$VM_NAME" <<'PY' 2>/dev/null || true
import json, sys, urllib.request
url, pod = sys.argv[1:]
state = json.load(urllib.request.urlopen(url, timeout=5))
for node in state["nodes"]:
    for alloc in node.get("allocations") or ():
        if alloc.get("pod") == pod and alloc.get("vm"):
            print(alloc["vm"]["vcpus"], alloc["vm"]["minVcpus"])
PY
}
read -r _ MIN_VCPUS <<<"$(vm_permit)" || true
MIN_VCPUS="${MIN_VCPUS:-1}"

say "pgbench against $VM_NAME ($VM_IP:5432): scale ${SCALE:-5 (filled at boot)}, $CLIENTS clients, ${DURATION}s, -b $BUILTIN"
# Single-quoted on purpose: expanded by the pod's shell, from the env passed with --env.
# shellcheck disable=SC2016
BENCH_SCRIPT='
waited=0
until pg_isready -q -h "$VM_IP" -p 5432 -U "$PGUSER" -d "$PGDATABASE"; do
  if [ "$waited" -ge "$PG_WAIT" ]; then
    echo "run-bench: PostgreSQL in the VM did not accept connections within ${PG_WAIT}s" >&2
    exit 10
  fi
  echo "waiting for PostgreSQL in the VM (${waited}s; the guest fills its database at boot)..."
  sleep 5; waited=$((waited + 5))
done
if [ -n "$SCALE" ]; then pgbench -h "$VM_IP" -i -s "$SCALE" --quiet || exit 1; fi
echo "pgbench-starts"
pgbench -h "$VM_IP" -c "$CLIENTS" -j "$CLIENTS" -T "$DURATION" -P 5 -b "$BUILTIN" --no-vacuum
'
echo load >"$PHASE_FILE"
set +e
"${KUBECTL[@]}" -n "$VM_NAMESPACE" run "$BENCH_POD" --rm -i --restart=Never --quiet \
  --image="$PGBENCH_IMAGE" \
  --env="VM_IP=$VM_IP" --env="SCALE=$SCALE" --env="CLIENTS=$CLIENTS" \
  --env="DURATION=$DURATION" --env="PGUSER=$PGUSER" --env="PGDATABASE=$PGDATABASE" \
  --env="PGPASSWORD=$PGPASSWORD" --env="PG_WAIT=$PG_WAIT" --env="BUILTIN=$BUILTIN" \
  --command -- sh -c "$BENCH_SCRIPT" 2>&1 | tee "$BENCH_LOG"
bench_status=${PIPESTATUS[0]}
set -e
LOAD_ENDED=$SECONDS
echo cool >"$PHASE_FILE"

kill "$WATCH_PID" 2>/dev/null || true
WATCH_PID=""
if grep -q "^run-bench: PostgreSQL in the VM" "$BENCH_LOG"; then
  die "PostgreSQL in $VM_NAMESPACE/$VM_NAME ($VM_IP:5432) did not accept connections within ${PG_WAIT}s (PG_WAIT); is the VM pod running the postgres guest image (vm_runner/Dockerfile, built by kind/up.sh)? The guest's console: kubectl -n $VM_NAMESPACE logs $VM_NAME -c vm"
fi
[[ "$bench_status" -eq 0 ]] || die "pgbench failed (exit $bench_status); see above"
# The peak is what the watch printed during the load (its VM rows: pod, vCPUs, min, max, ...).
PEAK="$(grep -E "^ +$VM_NAMESPACE/$VM_NAME " "$WATCH_LOG" | awk '{print $2}' | sort -n | tail -1)"
TPS="$(sed -n 's/^tps = \([0-9.]*\).*/\1/p' "$BENCH_LOG" | head -1)"
say "after the load: waiting up to ${COOLDOWN}s for $VM_NAME to shrink back to $MIN_VCPUS"
SHRANK=""
while (( SECONDS - LOAD_ENDED < COOLDOWN )); do
  read -r now _ <<<"$(vm_permit)" || true
  if [[ "${now:-}" == "$MIN_VCPUS" ]]; then SHRANK=$((SECONDS - LOAD_ENDED)); break; fi
  sleep 2
done
python3 "$ROOT/scripts/watch-vcpus" --once --url "http://127.0.0.1:$STATE_PORT/state" || true
if [[ -n "$SAMPLER_PID" ]]; then
  kill "$SAMPLER_PID" 2>/dev/null || true
  wait "$SAMPLER_PID" || say "(the plot could not be drawn; see above)"
  SAMPLER_PID=""
fi
rm -f "$BENCH_LOG" "$WATCH_LOG" "$PHASE_FILE"
grew="DID NOT GROW"
[[ -n "$PEAK" && "$PEAK" -gt "$MIN_VCPUS" ]] && grew="grew to $PEAK"
shrank="DID NOT SHRINK within ${COOLDOWN}s"
[[ -n "$SHRANK" ]] && shrank="shrank to $MIN_VCPUS in ${SHRANK}s"
say "$VM_NAMESPACE/$VM_NAME: $grew (permitted vCPUs), pgbench ${TPS:-?} tps, $shrank"
[[ "$grew" != "DID NOT GROW" && -n "$SHRANK" ]] || exit 3
