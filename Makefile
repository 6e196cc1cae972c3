# Prism: build, test, demo. Every target does its own set-up on a fresh machine.
SHELL := /usr/bin/env bash
.SHELLFLAGS := -euo pipefail -c
.DEFAULT_GOAL := build

GO       ?= go
BIN      := $(CURDIR)/bin
# The test-bed binaries (etcd, control plane, kubelet, kubectl, helm), built once
# from the Go module proxy and cached under ~/.cache/prism.
TESTBED_BIN = $(shell hack/testbed-bins.sh | tail -1)
E2E_TIMEOUT ?= 30m

.PHONY: build
build: ## Build prism-kubelet-plugin, prism-controller and prismctl into bin/ (stripped, as in the images).
	$(GO) build -trimpath -ldflags "-s -w" -o $(BIN)/ ./cmd/...

# The test build: the plugin with simulated GPUs (--fleet, --simulated-faults), which
# the release build in bin/ does not have. The bench and the soak run it on the test bed.
SIM_BIN := $(CURDIR)/_output/bin-simulation

.PHONY: build-simulation
build-simulation: ## Build the three binaries as a test build (-tags simulation: the plugin's --fleet and --simulated-faults) into _output/bin-simulation/, stripped.
	$(GO) build -tags simulation -trimpath -ldflags "-s -w" -o $(SIM_BIN)/ ./cmd/...

.PHONY: images
images: ## Build the container images into OCI archives in _output/images/ (no daemon, no registry; PLATFORMS=linux/amd64,linux/arm64).
	$(GO) run ./hack/tools/imagebuild $(if $(PLATFORMS),--platforms=$(PLATFORMS)) $(IMAGE_FLAGS)

.PHONY: testbed
testbed: ## Build (or reuse) the cached test-bed binaries.
	hack/testbed-bins.sh >/dev/null

.PHONY: generate
generate: ## Regenerate deepcopy code and CRD manifests.
	hack/generate.sh

.PHONY: verify
verify: ## gofmt, go vet (the release, the test build, hack/kai-check.sh's and hack/gpu-check.sh's tests), license headers, and no test code in the shipped binaries.
	@out=$$(gofmt -l $$(git ls-files '*.go')); if [[ -n "$$out" ]]; then echo "gofmt needed:"; echo "$$out"; exit 1; fi
	$(GO) vet ./...
	$(GO) vet -tags simulation,faultinject ./...
	$(GO) vet -tags kai ./test/e2e/
	$(GO) vet -tags gpu ./pkg/gpu/nvml/ ./internal/plugin/...
	hack/verify-boilerplate.sh
	$(GO) test -count=1 ./test/deps

.PHONY: unit
unit: ## Unit tests (no cluster needed).
	$(GO) test -race $$($(GO) list ./... | grep -v /test/)
	$(GO) test -race -tags simulation ./cmd/prism-kubelet-plugin/

.PHONY: e2e
e2e: testbed ## Integration and end-to-end tests on the local test bed (root).
	bin=$(TESTBED_BIN); \
	PRISM_TESTBED_BIN=$$bin KUBEBUILDER_ASSETS=$$bin \
	$(GO) test -count=1 -p 1 -timeout $(E2E_TIMEOUT) ./test/...

.PHONY: test
test: verify unit e2e ## Every test: static checks, unit tests, test-bed integration and e2e.

# The releases the README promises, oldest first, and the core e2e run on each: slice
# publishing, prepare/unprepare, the placement (ladder and node affinity), and a profiled
# claim becoming a WorkloadProfile. Not part of `make test`: every release other than the
# default is a cold build of its control plane and kubelet (v1.34.2: 472 s on 2 cores),
# which CI's budget does not hold.
KUBE_VERSIONS ?= v1.34.2 v1.35.1 v1.36.1 v1.37.1
VERSION_TESTS ?= TestSmokeDRAPodRunsOnRealKubelet|TestPublishedSlice|TestPrepareUnprepareLifecycle|TestProfileAwarePlacement|TestAffinityPlacesAsTheLadder|TestProfiledClaimBecomesWorkloadProfile|TestMIGPartitionsCreatedAtPrepare

.PHONY: test-versions
test-versions: ## The core e2e on each Kubernetes release in KUBE_VERSIONS (root; builds each release once, then cached).
	@mkdir -p _output; failed=""; \
	for v in $(KUBE_VERSIONS); do \
		bin=$$(KUBE_VERSION=$$v hack/testbed-bins.sh | tail -1); \
		echo "=== Kubernetes $$v: $(VERSION_TESTS)"; \
		if PRISM_TESTBED_BIN=$$bin KUBEBUILDER_ASSETS=$$bin $(GO) test -count=1 -p 1 -timeout $(E2E_TIMEOUT) -v \
			-run '^($(VERSION_TESTS))$$' ./test/e2e/ 2>&1 | tee _output/test-versions-$$v.log | grep -E '^ *(--- |ok|FAIL|PASS)'; \
		then echo "=== Kubernetes $$v: pass"; else echo "=== Kubernetes $$v: FAIL (log: _output/test-versions-$$v.log)"; failed+=" $$v"; fi; \
	done; \
	if [[ -n "$$failed" ]]; then echo "failed on:$$failed"; exit 1; fi; echo "all of $(KUBE_VERSIONS) pass"

.PHONY: demo
demo: testbed ## Start the demo cluster (a daemon, root) and run the scenarios of demo/specs.
	bin=$(TESTBED_BIN); \
	PRISM_TESTBED_BIN=$$bin $(GO) run ./demo/cmd/prism-demo up && \
	PRISM_TESTBED_BIN=$$bin $(GO) run ./demo/cmd/prism-demo run

.PHONY: demo-down
demo-down: ## Stop the demo cluster and check that nothing is left behind.
	$(GO) run ./demo/cmd/prism-demo down

.PHONY: bench
bench: testbed build-simulation ## Performance on the test bed (root): a one-screen summary of the headline ratios, the full table in _output/bench/bench.txt, JSON beside it; with SIM_TRACE also the placement sweep (bench-sim).
	bin=$(TESTBED_BIN); \
	$(GO) build -o $(CURDIR)/_output/bench/prism-bench ./test/bench/cmd/prism-bench && \
	$(GO) build -o $(CURDIR)/_output/bench/prism-floor-plugin ./test/bench/cmd/prism-floor-plugin && \
	PRISM_TESTBED_BIN=$$bin $(CURDIR)/_output/bench/prism-bench --repo=$(CURDIR) --bin=$(SIM_BIN) \
		--floor-plugin=$(CURDIR)/_output/bench/prism-floor-plugin \
		--out=$(CURDIR)/_output/bench/bench.json $(BENCH_FLAGS)
	@# The placement sweep needs the public Alibaba trace, which is not kept here and
	@# which the module proxy does not serve: run it when SIM_TRACE names it.
	@if [[ -n "$(SIM_TRACE)" ]]; then $(MAKE) --no-print-directory bench-sim; \
	else echo "placement sweep not run: set SIM_TRACE to the csv/ folder of alibaba/clusterdata cluster-trace-gpu-v2023 (docs/simulator.md)"; fi

# Length of `make soak` in minutes, and the seed of its churn and faults.
SOAK_MINUTES ?= 30
SOAK_SEED ?= 1

.PHONY: soak
soak: testbed build-simulation ## Chaos soak on the test bed (root): pods, whose shares run under a stand-in MPS, churn while the plugin (process or container), a controller replica, kube-apiserver, etcd and a kubelet are killed or restarted and hostile reports are written; prints faults, recovery times and invariant violations (SOAK_MINUTES, SOAK_SEED; JSON in _output/soak/).
	bin=$(TESTBED_BIN); \
	$(GO) build -o $(CURDIR)/_output/soak/prism-soak ./test/soak/cmd/prism-soak && \
	$(GO) build -o $(CURDIR)/_output/soak/ncu/ncu ./test/tools/fake-ncu && \
	$(GO) build -o $(CURDIR)/_output/soak/mps/nvidia-cuda-mps-control ./test/tools/fake-mps-control && \
	PRISM_TESTBED_BIN=$$bin $(CURDIR)/_output/soak/prism-soak --repo=$(CURDIR) --bin=$(SIM_BIN) \
		--ncu-dir=$(CURDIR)/_output/soak/ncu --mps-control=$(CURDIR)/_output/soak/mps/nvidia-cuda-mps-control \
		--minutes=$(SOAK_MINUTES) --seed=$(SOAK_SEED) \
		--out=$(CURDIR)/_output/soak/soak.json $(SOAK_FLAGS)

.PHONY: bench-sim
bench-sim: ## Placement sweep on the Alibaba GPU trace (SIM_TRACE=its csv/ folder): policy x load x label noise with CIs; SVGs and JSON in _output/sim/ (docs/simulator.md).
	@if [[ -z "$(SIM_TRACE)" ]]; then echo "set SIM_TRACE to the csv/ folder of alibaba/clusterdata cluster-trace-gpu-v2023 (not kept in this repository)"; exit 1; fi
	mkdir -p $(CURDIR)/_output/sim
	$(GO) run ./cmd/prismctl simulate --nodes $(SIM_TRACE)/openb_node_list_gpu_node.csv \
		--pods $(SIM_TRACE)/openb_pod_list_gpuspec33.csv \
		--throughputs $(CURDIR)/test/bench/data/jobs.csv --job-types $(CURDIR)/test/bench/data/job-types.csv \
		--svg $(CURDIR)/_output/sim --json $(CURDIR)/_output/sim/sweep.json $(SIM_FLAGS)

.PHONY: clean
clean:
	rm -rf $(BIN)

.PHONY: help
help:
	@grep -E '^[a-zA-Z_-]+:.*## ' $(MAKEFILE_LIST) | awk -F':.*## ' '{printf "  %-10s %s\n", $$1, $$2}'
