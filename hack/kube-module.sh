#!/usr/bin/env bash
# Writes the pinned tool module that hack/testbed-bins.sh builds an older Kubernetes
# release of the test bed from: hack/tools/kube-vMAJOR.MINOR/{go.mod,go.sum,tools.go}.
# The staging modules are pinned to the release's v0 tags, taken from the release's own
# go.mod, so that k8s.io/kubernetes never enters the project's go.mod. Run it once per
# release and commit what it writes; the build cache is keyed by those files.
#   hack/kube-module.sh v1.34.2
set -euo pipefail

version=${1:?usage: hack/kube-module.sh vMAJOR.MINOR.PATCH}
[[ $version =~ ^v1\.([0-9]+)\.([0-9]+)$ ]] || { echo "not a Kubernetes release: $version" >&2; exit 2; }
staging="v0.${BASH_REMATCH[1]}.${BASH_REMATCH[2]}"
root=$(cd "$(dirname "$0")/.." && pwd)
dir="$root/hack/tools/kube-${version%.*}"

upstream=$(go mod download -json "k8s.io/kubernetes@$version" | awk -F'"' '/"GoMod"/ { print $4 }')
[[ -f $upstream ]] || { echo "go.mod of k8s.io/kubernetes@$version not found" >&2; exit 1; }
godirective=$(awk '/^go / { print $2; exit }' "$upstream")

mkdir -p "$dir"
{
	echo "// Builds the Kubernetes $version control plane, kubelet and kubectl for the test bed's"
	echo "// version matrix (make test-versions). Written by hack/kube-module.sh."
	echo "module github.com/prismgpu/prism/hack/tools/kube-${version%.*}"
	echo
	echo "go $godirective"
	echo
	echo "require k8s.io/kubernetes $version"
	echo
	echo "replace ("
	sed -n '/^replace (/,/^)/p' "$upstream" | awk -v v="$staging" '$2 == "=>" && $3 ~ /^\.\/staging\// { printf "\t%s => %s %s\n", $1, $1, v }'
	echo ")"
} >"$dir/go.mod"
cp "$root/hack/tools/kube/tools.go" "$dir/tools.go"
(cd "$dir" && GOFLAGS=-mod=mod go mod tidy)
echo "wrote $dir for Kubernetes $version" >&2
