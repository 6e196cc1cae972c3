#!/usr/bin/env bash
# Runs Prism under KAI-Scheduler on the test bed.
#
#   hack/kai-check.sh KAI_SOURCE_DIR [OUTPUT_DIR]
#
# KAI_SOURCE_DIR is a checkout of https://github.com/kai-scheduler/KAI-Scheduler
# (formerly github.com/NVIDIA/KAI-Scheduler).
# The Go module proxy refuses KAI-Scheduler's module, so it is not a
# dependency of this repository and no code of it is copied here: this script
# builds KAI's scheduler, binder, queue controller and pod-group controller
# from that folder with KAI's own go.mod, into OUTPUT_DIR/bin (default
# _output/kai), installs KAI's CRDs from the folder, and runs the e2e tests
# under the `kai` build tag (test/e2e/kai_real_test.go) against them:
#
#   TestKAISchedulerQueuesPrismGPUs   queues, borrowing, reclaim, priority
#                                     preemption, a gang, a profiled job
#   TestKAIWithPrismClaimForms        what KAI does with a ladder and a share
#   TestKAISharesWithConsumableCapacity  shares with KAI's gate on
#   TestKAIWithAffinityForm           the node-affinity form
#
# The log goes to OUTPUT_DIR/kai-check.log; the KAI commit and the Prism
# commit are its first lines. CI does not run this. Needs root, as the test
# bed does. KAI_COMMIT names the commit where KAI_SOURCE_DIR is not a git
# checkout.
set -euo pipefail

if [ $# -lt 1 ]; then
	echo "usage: $0 KAI_SOURCE_DIR [OUTPUT_DIR]" >&2
	exit 2
fi
root=$(cd "$(dirname "$0")/.." && pwd)
src=$(cd "$1" && pwd)
out=$(mkdir -p "${2:-$root/_output/kai}" && cd "${2:-$root/_output/kai}" && pwd)
bin="$out/bin"
log="$out/kai-check.log"

# The module moved from github.com/NVIDIA to github.com/kai-scheduler in 2026.
if [ ! -f "$src/go.mod" ] || ! grep -Eq '^module github.com/(NVIDIA|kai-scheduler)/KAI-scheduler$' "$src/go.mod"; then
	echo "$src is not a KAI-Scheduler checkout (no go.mod of github.com/kai-scheduler/KAI-scheduler)" >&2
	exit 2
fi
# Only a checkout of its own: a source folder inside another repository
# (this one's _output, say) must not report that repository's commit.
if [ -e "$src/.git" ]; then
	kai_commit=$(git -C "$src" rev-parse HEAD)
else
	kai_commit=${KAI_COMMIT:-unknown}
fi
prism_commit=$(git -C "$root" rev-parse HEAD)

echo "==> building KAI-Scheduler $kai_commit into $bin" >&2
mkdir -p "$bin"
start=$(date +%s)
(cd "$src" && go build -o "$bin/" ./cmd/scheduler ./cmd/binder ./cmd/queuecontroller ./cmd/podgroupcontroller)
echo "==> built in $(($(date +%s) - start)) s" >&2

echo "==> test-bed binaries" >&2
testbed=$("$root/hack/testbed-bins.sh" | tail -1)

{
	echo "KAI-Scheduler commit: $kai_commit"
	echo "Prism commit: $prism_commit"
	echo "Kubernetes: $("$testbed/kube-apiserver" --version)"
	echo "date: $(date -u +%Y-%m-%dT%H:%M:%SZ)"
} >"$log"
echo "==> running the kai e2e tests; log in $log" >&2
cd "$root"
set +e
PRISM_KAI_SOURCE="$src" PRISM_KAI_BIN="$bin" PRISM_TESTBED_BIN="$testbed" KUBEBUILDER_ASSETS="$testbed" \
	go test -tags kai -count=1 -p 1 -timeout 30m -v -run "${KAI_TESTS:-^TestKAI}" ./test/e2e/ 2>&1 | tee -a "$log"
rc=${PIPESTATUS[0]}
set -e
grep -E '^ *(--- |ok|FAIL|PASS)' "$log" >&2 || true
exit "$rc"
