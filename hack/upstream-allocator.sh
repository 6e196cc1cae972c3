#!/usr/bin/env bash
# Applies hack/upstream/dynamic-resource-allocation-<version>.patch to the
# pristine k8s.io/dynamic-resource-allocation module that go.mod requires
# (from the module cache, as the Go module proxy serves it) and writes a
# go.mod that builds Prism against the result:
#
#   hack/upstream-allocator.sh            # prints the go.mod to pass to -modfile
#   hack/upstream-allocator.sh test       # also runs the patched module's own cel and structured tests
#   hack/upstream-allocator.sh scheduler  # also builds prism-scheduler: the test bed's kube-scheduler
#                                         # (hack/tools/kube, v1.37.1) with only this patch; prints its path last
#   go test -modfile=_output/upstream/go.mod -run '^$' -bench BenchmarkAllocator ./pkg/rewrite/
#
# Nothing is vendored: the patched tree is rebuilt under _output/ on every run.
# See docs/upstream-allocator.md.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
cd "$root"
mod=k8s.io/dynamic-resource-allocation
version=$(go list -m -f '{{.Version}}' "$mod")
patch="$root/hack/upstream/dynamic-resource-allocation-$version.patch"
[ -f "$patch" ] || { echo "no patch for $mod $version: $patch" >&2; exit 1; }
pristine=$(go mod download -json "$mod@$version" | sed -n 's/^[[:space:]]*"Dir": "\(.*\)",$/\1/p')
out="$root/_output/upstream"
tree="$out/$mod@$version"
rm -rf "$tree"
mkdir -p "$tree"
cp -R "$pristine/." "$tree/"
chmod -R u+w "$tree"
(cd "$tree" && patch -p1 --quiet --forward <"$patch") >&2
cp go.sum "$out/go.sum"
{ cat go.mod; printf '\nreplace %s => %s\n' "$mod" "$tree"; } >"$out/go.mod"
case "${1:-}" in
test)
	(cd "$tree" && go test ./cel/... ./structured/...) >&2
	;;
scheduler)
	# The same module, pins and flags as hack/testbed-bins.sh's kube-scheduler,
	# except that the library is the patched tree.
	kube="$root/hack/tools/kube"
	grep -q "^[[:space:]]*$mod => $mod $version\$" "$kube/go.mod" || { echo "hack/tools/kube/go.mod does not pin $mod $version" >&2; exit 1; }
	sed "s|^\([[:space:]]*\)$mod => $mod $version\$|\1$mod => $tree|" "$kube/go.mod" >"$out/kube.go.mod"
	cp "$kube/go.sum" "$out/kube.go.sum"
	ldflags="-s -w"
	for pkg in k8s.io/component-base/version k8s.io/client-go/pkg/version; do
		ldflags+=" -X $pkg.gitVersion=v1.37.1-prism -X $pkg.gitMajor=1 -X $pkg.gitMinor=37"
		ldflags+=" -X $pkg.gitTreeState=clean -X $pkg.buildDate=1970-01-01T00:00:00Z"
	done
	mkdir -p "$out/bin"
	(cd "$kube" && CGO_ENABLED=0 go build -modfile="$out/kube.go.mod" -trimpath -ldflags "$ldflags" -o "$out/bin/prism-scheduler" k8s.io/kubernetes/cmd/kube-scheduler) >&2
	echo "$out/go.mod"
	echo "$out/bin/prism-scheduler"
	exit 0
	;;
esac
echo "$out/go.mod"
