#!/usr/bin/env bash
# Builds the test-bed binaries (etcd, Kubernetes control plane, kubelet, kubectl, helm,
# Kueue and its CRDs, containerd with its runc shim and ctr) from the Go module proxy
# into a cache keyed by each tool module's go.mod and go.sum. A second run with the same
# key builds nothing. As root it also installs, once, the Debian packages the
# real-runtime test bed uses (runc, and containernetworking-plugins for the loopback CNI
# plugin).
# Prints the bin directory on stdout's last line so callers can do:
#   BIN=$(hack/testbed-bins.sh | tail -1)
# KUBE_VERSION picks another Kubernetes release for the version matrix (make
# test-versions); its pinned module is hack/tools/kube-vMAJOR.MINOR, written by
# hack/kube-module.sh, and its binaries get a bin directory of their own.
set -euo pipefail

root=$(cd "$(dirname "$0")/.." && pwd)
cache=${PRISM_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/prism}
default_kube_version=v1.37.1
kube_version=${KUBE_VERSION:-$default_kube_version}
goversion=$(go env GOVERSION)

kube_module=kube
out="$cache/bin/current"
if [[ $kube_version != "$default_kube_version" ]]; then
	[[ $kube_version =~ ^v1\.[0-9]+\.[0-9]+$ ]] || { echo "KUBE_VERSION=$kube_version is not a Kubernetes release (vMAJOR.MINOR.PATCH)" >&2; exit 2; }
	kube_module="kube-${kube_version%.*}"
	out="$cache/bin/kube-$kube_version"
fi
if ! grep -qx "require k8s.io/kubernetes $kube_version" "$root/hack/tools/$kube_module/go.mod" 2>/dev/null; then
	echo "hack/tools/$kube_module does not pin k8s.io/kubernetes $kube_version: run hack/kube-module.sh $kube_version and commit what it writes" >&2
	exit 2
fi

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
	ln -sfn "$dir/$bin" "$out/$bin"
}

mkdir -p "$out"
kube_minor=${kube_version#v1.}
kube_minor=${kube_minor%%.*}
kube_ldflags=""
for pkg in k8s.io/component-base/version k8s.io/client-go/pkg/version; do
	kube_ldflags+=" -X $pkg.gitVersion=$kube_version -X $pkg.gitMajor=1 -X $pkg.gitMinor=$kube_minor"
	kube_ldflags+=" -X $pkg.gitTreeState=clean -X $pkg.buildDate=1970-01-01T00:00:00Z"
done

total=$SECONDS
build etcd etcd go.etcd.io/etcd/server/v3
for b in kube-apiserver kube-controller-manager kube-scheduler kubelet kubectl; do
	build "$kube_module" "$b" "k8s.io/kubernetes/cmd/$b" "$kube_ldflags"
done
if [[ -d "$root/hack/tools/helm" ]]; then
	build helm helm helm.sh/helm/v3/cmd/helm
fi
# Kueue's controller manager for the Kueue e2e, with its CRDs copied from the module
# into the same cache directory (the test bed applies them without a network).
if [[ -d "$root/hack/tools/kueue" ]]; then
	kueue_version=$(awk '$1 == "require" && $2 == "sigs.k8s.io/kueue" { print $3 }' "$root/hack/tools/kueue/go.mod")
	build kueue kueue sigs.k8s.io/kueue/cmd/kueue "-X sigs.k8s.io/kueue/pkg/version.GitVersion=$kueue_version"
	kueue_crds="$cache/bin/kueue-$(key kueue)/crds"
	if [[ ! -f "$kueue_crds/.stamp" ]]; then
		src=$(cd "$root/hack/tools/kueue" && go mod download sigs.k8s.io/kueue && go list -m -f '{{.Dir}}' sigs.k8s.io/kueue)
		rm -rf "$kueue_crds" && mkdir -p "$kueue_crds"
		cp "$src"/config/components/crd/bases/*.yaml "$kueue_crds/"
		chmod u+w "$kueue_crds"/*.yaml
		date -u +%FT%TZ >"$kueue_crds/.stamp"
		log "kueue-crds: copied from $src"
	fi
	ln -sfn "$kueue_crds" "$out/kueue-crds"
fi
# containerd's version as its go.mod pins it, for `containerd --version` and the CRI's
# RuntimeVersion that the kubelet logs.
containerd_version=$(awk '{ for (i = 1; i < NF; i++) if ($i == "github.com/containerd/containerd/v2") { print $(i + 1); exit } }' "$root/hack/tools/containerd/go.mod")
for b in containerd containerd-shim-runc-v2 ctr; do
	build containerd "$b" "github.com/containerd/containerd/v2/cmd/$b" "-X github.com/containerd/containerd/v2/version.Version=$containerd_version"
done

# debs PROGRAM_OR_FILE... -- PACKAGE...: installs the packages unless every path exists.
debs() {
	local missing=0
	while [[ $1 != -- ]]; do
		[[ -e $1 ]] || command -v "$1" >/dev/null 2>&1 || missing=1
		shift
	done
	shift
	((missing)) || { log "$*: installed"; return 0; }
	if [[ $(id -u) -ne 0 ]]; then
		log "$*: missing, and only root installs them; the real-runtime e2e will fail without them"
		return 0
	fi
	log "$*: installing from Debian"
	export DEBIAN_FRONTEND=noninteractive
	apt-get install -y --no-install-recommends "$@" >&2 || { apt-get update >&2 && apt-get install -y --no-install-recommends "$@" >&2; }
}
debs runc /usr/lib/cni/loopback -- runc containernetworking-plugins

log "all test-bed binaries ready in $((SECONDS - total))s"
echo "$out"
