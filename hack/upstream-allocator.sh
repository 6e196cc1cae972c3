#!/usr/bin/env bash
# Applies hack/upstream/dynamic-resource-allocation-<version>.patch to the
# pristine k8s.io/dynamic-resource-allocation module that go.mod requires
# (from the module cache, as the Go module proxy serves it) and writes a
# go.mod that builds Prism against the result:
#
#   hack/upstream-allocator.sh            # prints the go.mod to pass to -modfile
#   hack/upstream-allocator.sh test       # also runs the patched module's own cel and structured tests
#   hack/upstream-allocator.sh scheduler  # also builds prism-scheduler: the test bed's kube-scheduler
#                                         # (hack/tools/kube, v1.37.1) with only this patch; prints its path last.
#                                         # Cached under ~/.cache/prism/bin by its inputs; GOOS/GOARCH cross-build
#   go test -modfile=_output/upstream/go.mod -run '^$' -bench BenchmarkAllocator ./pkg/rewrite/
#
# Nothing is vendored: the patched tree is rebuilt under _output/ on every run.
# The image builder runs `scheduler` for the prism-scheduler image.
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
	# except that the library is the patched tree. The binary is cached like the
	# test-bed binaries, keyed by everything that goes into it: the patch,
	# hack/tools/kube's pins, the Go toolchain and the target platform (GOOS,
	# GOARCH; the image builder cross-builds with them).
	kube="$root/hack/tools/kube"
	grep -q "^[[:space:]]*$mod => $mod $version\$" "$kube/go.mod" || { echo "hack/tools/kube/go.mod does not pin $mod $version" >&2; exit 1; }
	ldflags="-s -w"
	for pkg in k8s.io/component-base/version k8s.io/client-go/pkg/version; do
		ldflags+=" -X $pkg.gitVersion=v1.37.1-prism -X $pkg.gitMajor=1 -X $pkg.gitMinor=37"
		ldflags+=" -X $pkg.gitTreeState=clean -X $pkg.buildDate=1970-01-01T00:00:00Z"
	done
	goos=$(go env GOOS) goarch=$(go env GOARCH)
	cache=${PRISM_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/prism}
	key=$({ cat "$patch" "$kube/go.mod" "$kube/go.sum"; go env GOVERSION; echo "$goos/$goarch $ldflags relative-tree"; } | sha256sum | cut -c1-16)
	dir="$cache/bin/prism-scheduler-$key"
	mkdir -p "$dir" "$out/bin"
	if [[ -x "$dir/prism-scheduler" && -f "$dir/.stamp" ]]; then
		echo "prism-scheduler ($goos/$goarch): cached in $dir" >&2
	else
		# The build information names the patched tree as the replace
		# directive does; a path relative to hack/tools/kube is the same in
		# every checkout and cache, so the binary (and the image's digest) is.
		rel=../../../_output/upstream/$mod@$version
		[[ "$(cd "$kube/$rel" && pwd)" == "$tree" ]] || { echo "the patched tree is not at hack/tools/kube/$rel" >&2; exit 1; }
		sed "s|^\([[:space:]]*\)$mod => $mod $version\$|\1$mod => $rel|" "$kube/go.mod" >"$out/kube.go.mod"
		cp "$kube/go.sum" "$out/kube.go.sum"
		echo "prism-scheduler ($goos/$goarch): building (a cold build takes minutes)" >&2
		start=$SECONDS
		(cd "$kube" && CGO_ENABLED=0 go build -modfile="$out/kube.go.mod" -trimpath -buildvcs=false -ldflags "$ldflags" -o "$dir/prism-scheduler.tmp" k8s.io/kubernetes/cmd/kube-scheduler) >&2
		mv "$dir/prism-scheduler.tmp" "$dir/prism-scheduler"
		date -u +%FT%TZ >"$dir/.stamp"
		echo "prism-scheduler ($goos/$goarch): built in $((SECONDS - start))s" >&2
	fi
	bin="$dir/prism-scheduler"
	if [[ $goos/$goarch == "$(go env GOHOSTOS)/$(go env GOHOSTARCH)" ]]; then
		ln -sfn "$bin" "$out/bin/prism-scheduler"
		bin="$out/bin/prism-scheduler"
	fi
	echo "$out/go.mod"
	echo "$bin"
	exit 0
	;;
esac
echo "$out/go.mod"
