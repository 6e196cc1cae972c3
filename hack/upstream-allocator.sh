#!/usr/bin/env bash
# Applies hack/upstream/dynamic-resource-allocation-<version>.patch to the
# pristine k8s.io/dynamic-resource-allocation module that go.mod requires
# (from the module cache, as the Go module proxy serves it) and writes a
# go.mod that builds Prism against the result:
#
#   hack/upstream-allocator.sh            # prints the go.mod to pass to -modfile
#   hack/upstream-allocator.sh test       # also runs the patched module's own cel and structured tests
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
if [ "${1:-}" = test ]; then
	(cd "$tree" && go test ./cel/... ./structured/...) >&2
fi
echo "$out/go.mod"
