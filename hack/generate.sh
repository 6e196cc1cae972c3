#!/usr/bin/env bash
# Regenerates deepcopy functions and CRD manifests with the pinned controller-gen.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
cache=${PRISM_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/prism}
gen="$cache/bin/controller-gen-$(cat "$root/hack/tools/controller-gen/go.sum" | sha256sum | cut -c1-16)"
if [[ ! -x "$gen" ]]; then
	echo "[generate] building controller-gen" >&2
	(cd "$root/hack/tools/controller-gen" && go build -o "$gen" sigs.k8s.io/controller-tools/cmd/controller-gen)
fi
cd "$root"
"$gen" object:headerFile=hack/boilerplate.go.txt paths=./api/...
"$gen" crd:allowDangerousTypes=false paths=./api/prism/... output:crd:artifacts:config=deployments/crds
