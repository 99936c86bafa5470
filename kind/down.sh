#!/usr/bin/env bash
# Delete the kind cluster kind/up.sh created. Idempotent: no cluster, nothing to do.
#
#   kind/down.sh          delete it (needs kind on PATH)
#   kind/down.sh --help   show this text
#
# Environment:
#   CLUSTER_NAME   kind cluster name (default: vm-autoscaling)
set -euo pipefail

usage() { sed -n '2,/^set -euo pipefail/{/^#/s/^# \{0,1\}//p}' "${BASH_SOURCE[0]}"; }
case "${1:-}" in
  -h | --help) usage; exit 0 ;;
esac

CLUSTER_NAME="${CLUSTER_NAME:-vm-autoscaling}"

command -v kind >/dev/null 2>&1 \
  || { echo "error: kind is not installed or not on PATH" >&2; exit 1; }

if kind get clusters 2>/dev/null | grep -qx "$CLUSTER_NAME"; then
  echo "==> deleting kind cluster '$CLUSTER_NAME'" >&2
  kind delete cluster --name "$CLUSTER_NAME"
else
  echo "==> no kind cluster '$CLUSTER_NAME'; nothing to delete" >&2
fi
# The VM sockets' host directories (kind-config.yaml) hold only stale sockets now. The
# kubelet created their subdirectories as root, so this may need sudo; it is only tidying.
rm -rf /tmp/vm-autoscaling/worker /tmp/vm-autoscaling/worker2 2>/dev/null \
  || echo "note: could not remove /tmp/vm-autoscaling/worker* (root-owned); remove with sudo" >&2
