#!/usr/bin/env bash
# Builds the test-bed binaries (etcd, Kubernetes control plane, kubelet, kubectl, helm)
# from the Go module proxy into a cache keyed by each tool module's go.mod and go.sum.
# A second run with the same key builds nothing. Prints the bin directory on stdout's
# last line so callers can do: BIN=$(hack/testbed-bins.sh | tail -1)
set -euo pipefail

root=$(cd "$(dirname "$0")/.." && pwd)
cache=${PRISM_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/prism}
kube_version=v1.37.1
goversion=$(go env GOVERSION)

log() { printf '[testbed-bins] %s\n' "$*" >&2; }

# key hashes one tool module's dependency pins together with the Go toolchain.
key() {
	cat "$root/hack/tools/$1/go.mod" "$root/hack/tools/$1/go.sum" | { cat; echo "$goversion"; } | sha256sum | cut -c1-16
}

# build TOOL_MODULE BINARY PACKAGE [LDFLAGS]
build() {
	local mod=$1 bin=$2 pkg=$3 ldflags=${4:-}
	local dir="$cache/bin/$mod-$(key "$mod")"
	local stamp="$dir/.$bin.stamp"
	mkdir -p "$dir"
	if [[ -x "$dir/$bin" && -f "$stamp" ]]; then
		log "$bin: cached"
	else
		log "$bin: building $pkg (a cold build takes minutes)"
		local start=$SECONDS
		(cd "$root/hack/tools/$mod" && CGO_ENABLED=0 go build -trimpath -ldflags "-s -w $ldflags" -o "$dir/$bin.tmp" "$pkg")
		mv "$dir/$bin.tmp" "$dir/$bin"
		date -u +%FT%TZ >"$stamp"
		log "$bin: built in $((SECONDS - start))s"
	fi
	ln -sfn "$dir/$bin" "$cache/bin/current/$bin"
}

mkdir -p "$cache/bin/current"
kube_ldflags=""
for pkg in k8s.io/component-base/version k8s.io/client-go/pkg/version; do
	kube_ldflags+=" -X $pkg.gitVersion=$kube_version -X $pkg.gitMajor=1 -X $pkg.gitMinor=37"
	kube_ldflags+=" -X $pkg.gitTreeState=clean -X $pkg.buildDate=1970-01-01T00:00:00Z"
done

total=$SECONDS
build etcd etcd go.etcd.io/etcd/server/v3
for b in kube-apiserver kube-controller-manager kube-scheduler kubelet kubectl; do
	build kube "$b" "k8s.io/kubernetes/cmd/$b" "$kube_ldflags"
done
if [[ -d "$root/hack/tools/helm" ]]; then
	build helm helm helm.sh/helm/v3/cmd/helm
fi
log "all test-bed binaries ready in $((SECONDS - total))s"
echo "$cache/bin/current"
