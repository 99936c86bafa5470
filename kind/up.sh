#!/usr/bin/env bash
# Bring up a kind cluster running vm-autoscaling, from this checkout.
#
#   kind/up.sh            create the cluster (if absent), build + load images, apply, wait
#   kind/up.sh --help     show this text
#
# Needs docker, kind and kubectl on PATH (exit 1 naming the missing one).
#
# Idempotent: an existing cluster is reused, images are rebuilt (docker's cache makes that
# cheap) and re-loaded, and `kubectl apply -k` converges the manifests.
#
# Environment:
#   CLUSTER_NAME           kind cluster name (default: vm-autoscaling, as in kind-config.yaml)
#   VM_RUNNER_DOCKERFILE   Dockerfile of the VM pod image (default: vm_runner/Dockerfile)
#   SKIP_BUILD=1           load/apply only, reuse the images already built
set -euo pipefail

usage() { sed -n '2,/^set -euo pipefail/{/^#/s/^# \{0,1\}//p}' "${BASH_SOURCE[0]}"; }
case "${1:-}" in
  -h | --help) usage; exit 0 ;;
esac

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
CLUSTER_NAME="${CLUSTER_NAME:-vm-autoscaling}"
VM_RUNNER_DOCKERFILE="${VM_RUNNER_DOCKERFILE:-vm_runner/Dockerfile}"
NAMESPACE="vm-autoscaling"

# The image names the manifests use (imagePullPolicy IfNotPresent: kind-loaded, never pulled).
EXTENDER_IMAGE="vm-autoscaling/scheduler-extender:dev"
AGENT_IMAGE="vm-autoscaling/autoscaler-agent:dev"
RUNNER_IMAGE="vm-autoscaling/vm-runner:dev"

say() { printf '==> %s\n' "$*" >&2; }
die() { printf 'error: %s\n' "$*" >&2; exit 1; }

need() {
  command -v "$1" >/dev/null 2>&1 || die "$1 is not installed or not on PATH ($2)"
}

need docker "https://docs.docker.com/engine/install/"
need kind "https://kind.sigs.k8s.io/docs/user/quick-start/#installation"
need kubectl "https://kubernetes.io/docs/tasks/tools/"
docker info >/dev/null 2>&1 || die "docker is installed but its daemon is not reachable"

cd "$ROOT"

# The per-node socket directories that kind-config.yaml mounts must exist before the nodes
# start, or docker creates them root-owned.
mkdir -p /tmp/vm-autoscaling/worker /tmp/vm-autoscaling/worker2

if kind get clusters 2>/dev/null | grep -qx "$CLUSTER_NAME"; then
  say "kind cluster '$CLUSTER_NAME' exists; reusing it"
else
  say "creating kind cluster '$CLUSTER_NAME' (1 control plane, 2 workers)"
  kind create cluster --name "$CLUSTER_NAME" --config kind/kind-config.yaml --wait 120s
fi
CONTEXT="kind-$CLUSTER_NAME"
KUBECTL=(kubectl --context "$CONTEXT")

if [[ "${SKIP_BUILD:-0}" != 1 ]]; then
  say "building $EXTENDER_IMAGE"
  docker build -f Dockerfile.extender -t "$EXTENDER_IMAGE" .
  say "building $AGENT_IMAGE"
  docker build -f Dockerfile.agent -t "$AGENT_IMAGE" .
  [[ -f "$VM_RUNNER_DOCKERFILE" ]] \
    || die "$VM_RUNNER_DOCKERFILE not found (set VM_RUNNER_DOCKERFILE to the VM runner's Dockerfile)"
  say "building $RUNNER_IMAGE"
  docker build -f "$VM_RUNNER_DOCKERFILE" -t "$RUNNER_IMAGE" .
fi

for image in "$EXTENDER_IMAGE" "$AGENT_IMAGE" "$RUNNER_IMAGE"; do
  say "loading $image into the nodes"
  kind load docker-image --name "$CLUSTER_NAME" "$image"
done

say "applying manifests/"
"${KUBECTL[@]}" apply -k manifests/

# Re-loaded images keep their :dev tag, so an unchanged Deployment would not restart on its
# own; restart explicitly so a re-run of up.sh really runs the code just built.
if [[ "${SKIP_BUILD:-0}" != 1 ]]; then
  "${KUBECTL[@]}" -n "$NAMESPACE" rollout restart deployment/scheduler-extender \
    daemonset/autoscaler-agent deployment/vm-controller
fi

say "waiting for the extender, the agents and the vm-controller"
"${KUBECTL[@]}" -n "$NAMESPACE" rollout status deployment/scheduler-extender --timeout=180s
"${KUBECTL[@]}" -n "$NAMESPACE" rollout status daemonset/autoscaler-agent --timeout=180s
"${KUBECTL[@]}" -n "$NAMESPACE" rollout status deployment/vm-controller --timeout=180s

cat <<NEXT

vm-autoscaling is running in kind cluster '$CLUSTER_NAME' (context $CONTEXT).

Next steps:
  # one PostgreSQL VM (VirtualMachine pg-vm), or two competing ones (pg-vm-a, pg-vm-b)
  kubectl --context $CONTEXT apply -k manifests/examples/
  kubectl --context $CONTEXT apply -k manifests/examples/double/

  # load it with pgbench and watch its vCPUs follow
  VM_NAME=pg-vm scripts/run-bench.sh

  # or just watch the extender's view of every node and VM (/state is on the extender's
  # loopback-only verbs port, so forward to the leading pod, not the Service)
  kubectl --context $CONTEXT -n $NAMESPACE port-forward \
    "\$(kubectl --context $CONTEXT -n $NAMESPACE get pod -o name \
      -l vm-autoscaling.io/extender-role=leader)" 10298:10298 &
  scripts/watch-vcpus

  kind/down.sh    # delete the cluster
NEXT
