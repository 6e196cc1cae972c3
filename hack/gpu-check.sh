#!/usr/bin/env bash
# Copyright The Prism Authors.
#
# Licensed under the Apache License, Version 2.0 (the "License");
# you may not use this file except in compliance with the License.
# You may obtain a copy of the License at
#
#     http://www.apache.org/licenses/LICENSE-2.0
#
# Unless required by applicable law or agreed to in writing, software
# distributed under the License is distributed on an "AS IS" BASIS,
# WITHOUT WARRANTIES OR CONDITIONS OF ANY KIND, either express or implied.
# See the License for the specific language governing permissions and
# limitations under the License.

# Runs Prism's real-hardware checks on this machine's GPU 0 and writes every
# result into OUT:
#
#   hack/gpu-check.sh OUT [STEP...]
#
# With STEPs (discovery, cdi, ncu, usage, pairs, mps-shares, containers,
# pairs-limited) it runs only those, to repeat a failed check without the
# rest.
#
# 1. discovery: the published device, datasheet figures, MIG profiles (read-only)
# 2. cdi: nvcdi's edits on the real driver root
# 3. ncu: the CUDA kernels profiled under the preload shim by the real ncu
# 4. usage: the plugin's NVML/GPM sampler against kernels of known shape
# 5. pairs: each job alone, then every pair time-sliced and under MPS
# 6. mps-shares: two shares of GPU 0, each with the plugin's MPS control
#    daemon of its own, played by a CUDA client as their containers
#    (mps-shares/results.json)
# 7. containers: claims prepared by the plugin on the real driver (a whole
#    GPU, two MPS shares, a time-sliced pair, a profiled claim), their
#    containers run by runc from the CDI specs the prepare wrote, with
#    nothing of NVIDIA's in their root file systems but what the specs
#    bring (containers/results.json)
# 8. pairs-limited: every pair again, each job of a pair in a share of its
#    own as Prism makes them: a control daemon per share, at 50 % compute
#    each (pairs/limited.jsonl)
#
# It needs nvcc, ncu and the NVIDIA driver. The Go tests behind the gpu
# build tag are built here when go is installed; on a machine without Go,
# build them elsewhere with `hack/gpu-check.sh --build-tests DIR` and name
# DIR (or a .tar.xz of it) in PRISM_GPU_TESTBINS. DIR also gets runc and
# nvidia-cdi-hook for the containers step, which uses them from there,
# else runc on PATH and the hook where the plugin's image installs it.
#
# It changes no setting of the GPU (MIG mode, clocks, compute and
# persistence mode): ncu runs with --clock-control none, and the MPS control
# daemons are ordinary processes under private pipe directories. The
# settings are recorded before and after, and a difference fails the run.

set -uo pipefail

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
PACKAGES=(pkg/gpu/nvml internal/plugin/cdi internal/plugin/profiling internal/plugin internal/plugin/usage/sampler internal/plugin/mps)
JOBS=(vectoradd fmaloop tinygrid gemm-2048 gemm-8192 copy-16m copy-2g)
PAIR_SECONDS=${PRISM_GPU_PAIR_SECONDS:-1}

build_tests() {
  local dir
  dir=$(realpath -m "$1")
  mkdir -p "$dir"
  for p in "${PACKAGES[@]}"; do
    echo "building $p"
    (cd "$ROOT" && go test -c -tags gpu -trimpath -ldflags='-s -w' -o "$dir/$(basename "$p").test" "./$p") || return 1
  done
  # The containers step runs containers with runc, and their CDI specs'
  # hooks with nvidia-cdi-hook, which a bare GPU machine lacks. Debian's and
  # Ubuntu's runc need libseccomp.so.2, which Ubuntu 24.04 has.
  local runc
  runc=$(command -v runc) || { echo "no runc on PATH to carry for the containers step" >&2; return 1; }
  cp "$runc" "$dir/runc" || return 1
  # As images/Dockerfile builds the hook: static, so that it runs on any host.
  echo "building nvidia-cdi-hook"
  (
    cd "$ROOT/hack/tools/imagebuild/nvidia-cdi-hook" &&
      version=$(go list -m -f '{{.Version}}' github.com/NVIDIA/nvidia-container-toolkit) &&
      CGO_ENABLED=1 go build -trimpath -buildvcs=false -tags netgo,osusergo \
        -ldflags "-s -w -X github.com/NVIDIA/nvidia-container-toolkit/internal/info.version=$version -linkmode=external -extldflags=-static" \
        -o "$dir/nvidia-cdi-hook" github.com/NVIDIA/nvidia-container-toolkit/cmd/nvidia-cdi-hook
  ) || return 1
}

if [[ ${1:-} == --build-tests ]]; then
  [[ $# -eq 2 ]] || { echo "usage: $0 --build-tests DIR" >&2; exit 64; }
  build_tests "$2"
  exit
fi
[[ $# -ge 1 ]] || { echo "usage: $0 OUT [STEP...] | --build-tests DIR" >&2; exit 64; }

OUT=$(realpath -m "$1")
shift
STEPS=("$@")
((${#STEPS[@]})) || STEPS=(discovery cdi ncu usage pairs mps-shares containers pairs-limited)
wanted() { [[ " ${STEPS[*]} " == *" $1 "* ]]; }
mkdir -p "$OUT"/{logs,bin}
SUMMARY=$OUT/summary.txt
: >"$SUMMARY"
failed=0

say() { echo "[$(date -u +%T)] $*" | tee -a "$SUMMARY"; }

# step NAME LIMIT_S CMD...: runs one check with a time limit; its output
# goes to logs/NAME.log, and the step's result to the summary.
step() {
  local name=$1 limit=$2
  shift 2
  say "start $name (limit ${limit}s)"
  local t0=$SECONDS
  timeout -k 10 "$limit" "$@" >"$OUT/logs/$name.log" 2>&1
  local rc=$?
  local result=ok
  if ((rc != 0)); then
    result="FAILED rc=$rc"
    ((rc == 124)) && result="TIMED OUT after ${limit}s"
    failed=1
  elif grep -q -- '^--- SKIP' "$OUT/logs/$name.log"; then
    result="FAILED: a test skipped"
    failed=1
  fi
  say "end   $name: $result in $((SECONDS - t0))s"
  grep -E -- '^(--- |=== RUN|ok|FAIL|PASS)' "$OUT/logs/$name.log" | grep -v '=== RUN' | sed 's/^/    /' | tee -a "$SUMMARY" >/dev/null
}

settings() {
  nvidia-smi --query-gpu=index,name,mig.mode.current,mig.mode.pending,compute_mode,persistence_mode,clocks.applications.graphics,clocks.applications.memory,power.limit,ecc.mode.current --format=csv ||
    nvidia-smi --query-gpu=index,name,mig.mode.current,compute_mode,persistence_mode --format=csv
}

# ---- the machine ---------------------------------------------------------
say "gpu-check on $(hostname), results in $OUT"
settings >"$OUT/settings-before.csv" 2>&1 || { say "nvidia-smi failed: no usable GPU"; exit 1; }
{
  nvidia-smi
  echo
  nvidia-smi -q
} >"$OUT/nvidia-smi.txt" 2>&1
{
  echo "kernel: $(uname -r)"
  grep PRETTY_NAME /etc/os-release
  nvcc --version | tail -2
} >"$OUT/versions.txt" 2>&1

NVML_LIBRARY=$(ldconfig -p | awk '$1 == "libnvidia-ml.so.1" { print $NF; exit }')
DRIVER_ROOT=/
for suffix in /usr/lib64 /usr/lib/x86_64-linux-gnu /lib64 /lib/x86_64-linux-gnu /usr/lib; do
  dir=$(dirname "$NVML_LIBRARY")
  if [[ $dir == *"$suffix" ]]; then
    DRIVER_ROOT=${dir%"$suffix"}
    break
  fi
done
NCU_DIR=${NCU_DIR:-$(ls -d /opt/nvidia/nsight-compute/*/ 2>/dev/null | sort -V | tail -1)}
NCU_DIR=${NCU_DIR%/}
if [[ -z $NCU_DIR && -n $(command -v ncu) ]]; then
  NCU_DIR=$(dirname "$(readlink -f "$(command -v ncu)")")
fi
"$NCU_DIR/ncu" --version >>"$OUT/versions.txt" 2>&1
export PRISM_DRIVER_ROOT=${DRIVER_ROOT:-/} PRISM_NVML_LIBRARY=$NVML_LIBRARY NCU_DIR
say "NVML $NVML_LIBRARY, driver root $PRISM_DRIVER_ROOT, ncu in $NCU_DIR"
cat "$OUT/versions.txt" "$OUT/settings-before.csv" | sed 's/^/    /' | tee -a "$SUMMARY"

# ---- build ---------------------------------------------------------------
KERNELS=$OUT/bin/prism-gpu-kernels
# The rpath lets the program find cuBLAS under the shim and ncu, whose
# environment is the claim's alone.
CUDA_LIB=$(dirname "$(readlink -f "$(command -v nvcc)")")/../lib64
step build-kernels 180 nvcc -O3 -std=c++17 -arch=native -o "$KERNELS" "$ROOT/hack/gpu-check/kernels.cu" \
  -lcublas -Xlinker -rpath -Xlinker "$(realpath -m "$CUDA_LIB")"
export PRISM_GPU_KERNELS=$KERNELS PRISM_GPU_OUT=$OUT
# The share's workload for mps-shares, and the containers' for containers:
# CUDA alone, no cuBLAS.
if wanted mps-shares || wanted containers; then
  export PRISM_GPU_MPS_CLIENT=$OUT/bin/prism-mps-client
  step build-mps-client 180 nvcc -O3 -std=c++17 -arch=native -o "$PRISM_GPU_MPS_CLIENT" "$ROOT/hack/gpu-check/mps-client.cu"
fi

TESTBINS=$OUT/bin/tests
if [[ -n ${PRISM_GPU_TESTBINS:-} ]]; then
  mkdir -p "$TESTBINS"
  if [[ -d $PRISM_GPU_TESTBINS ]]; then
    cp "$PRISM_GPU_TESTBINS"/*.test "$TESTBINS"/
    for f in runc nvidia-cdi-hook; do
      [[ -e $PRISM_GPU_TESTBINS/$f ]] && cp "$PRISM_GPU_TESTBINS/$f" "$TESTBINS"/
    done
  else
    tar -xJf "$PRISM_GPU_TESTBINS" -C "$TESTBINS" --strip-components=1 ||
      python3 -c 'import sys, tarfile; t = tarfile.open(sys.argv[1]); [setattr(m, "name", m.name.split("/", 1)[-1]) for m in t.getmembers()]; t.extractall(sys.argv[2])' "$PRISM_GPU_TESTBINS" "$TESTBINS"
  fi
elif command -v go >/dev/null; then
  step build-tests 600 build_tests "$TESTBINS"
else
  say "FAILED: no go and no PRISM_GPU_TESTBINS: the gpu-tagged tests cannot run"
  failed=1
fi
# runc and nvidia-cdi-hook for the containers step: carried beside the test
# binaries, else runc on PATH and the hook where the plugin's image puts it.
PRISM_RUNC=$TESTBINS/runc
[[ -x $PRISM_RUNC ]] || PRISM_RUNC=$(command -v runc)
PRISM_GPU_CDI_HOOK=$TESTBINS/nvidia-cdi-hook
[[ -x $PRISM_GPU_CDI_HOOK ]] || PRISM_GPU_CDI_HOOK=/var/lib/prism/bin/nvidia-cdi-hook
export PRISM_RUNC PRISM_GPU_CDI_HOOK
wanted containers && say "runc ${PRISM_RUNC:-missing}, nvidia-cdi-hook $PRISM_GPU_CDI_HOOK"

# gotest NAME PACKAGE RUN LIMIT: runs a package's gpu-tagged tests in the
# package's directory, where they find their testdata.
gotest() {
  local name=$1 pkg=$2 run=$3 limit=$4
  local bin=$TESTBINS/$(basename "$pkg").test
  if [[ ! -x $bin ]]; then
    say "FAILED $name: $bin is missing"
    failed=1
    return
  fi
  step "$name" "$limit" bash -c 'cd "$1" && "$2" -test.run "$3" -test.v -test.count=1 -test.timeout "$4s"' _ \
    "$ROOT/$pkg" "$bin" "$run" "$((limit - 5))"
}

# ---- 1-4: the gpu-tagged tests -------------------------------------------
wanted discovery && gotest discovery pkg/gpu/nvml '^TestRealNVML$' 60
wanted cdi && gotest cdi internal/plugin/cdi '^TestNVMLSourceOnRealDriver$' 60
wanted ncu && gotest ncu internal/plugin/profiling '^TestGPUBoundTypes$' 240
wanted usage && gotest usage internal/plugin/usage/sampler '^TestUsageSamplerOnRealGPU$' 180

# ---- 5: measured pairs ---------------------------------------------------
# run_together MODE JOB...: starts the jobs at one instant (a barrier in a
# private directory) for PAIR_SECONDS and prints one JSON line with each
# job's own report. PAIR_PIPES, where set, names each job's MPS pipe
# directory in turn, for jobs in shares of their own.
run_together() {
  local mode=$1
  shift
  local sync
  sync=$(mktemp -d)
  local pids=() i=0 jobs=("$@") pipes run
  read -ra pipes <<<"${PAIR_PIPES:-}"
  for job in "${jobs[@]}"; do
    run=("$KERNELS")
    [[ -n ${pipes[i]:-} ]] && run=(env "CUDA_MPS_PIPE_DIRECTORY=${pipes[i]}" "$KERNELS")
    # A client that cannot reach the GPU (or MPS) must not hold the step.
    timeout -k 5 60 "${run[@]}" "$job" --seconds "$PAIR_SECONDS" --sync "$sync" >"$sync/out.$i" 2>"$sync/err.$i" &
    pids+=($!)
    i=$((i + 1))
  done
  local deadline=$((SECONDS + 60))
  while (($(ls "$sync" | grep -c '^ready\.') < $#)); do
    local alive=0
    for p in "${pids[@]}"; do kill -0 "$p" 2>/dev/null && alive=$((alive + 1)); done
    if ((alive < $#)) || ((SECONDS > deadline)); then break; fi
    sleep 0.01
  done
  echo $(($(date +%s%N) + 50000000)) >"$sync/go.tmp" && mv "$sync/go.tmp" "$sync/go"
  local rcs=()
  for p in "${pids[@]}"; do
    wait "$p"
    rcs+=($?)
  done
  local reports=()
  for ((i = 0; i < $#; i++)); do
    if ((rcs[i] == 0)); then
      reports+=("$(cat "$sync/out.$i")")
    else
      reports+=("{\"job\":\"${jobs[i]}\",\"error\":$(tr -d '"\\' <"$sync/err.$i" | tr '\n' ' ' | sed 's/.*/"&"/')}")
    fi
  done
  local IFS=,
  echo "{\"mode\":\"$mode\",\"jobs\":[${reports[*]}]}"
  rm -rf "$sync"
}

pairs() {
  local mode=$1 jobs
  read -ra jobs <<<"$PAIR_JOBS"
  for a in "${jobs[@]}"; do run_together "$mode" "$a"; done
  local i j
  for ((i = 0; i < ${#jobs[@]}; i++)); do
    for ((j = i; j < ${#jobs[@]}; j++)); do
      run_together "$mode" "${jobs[i]}" "${jobs[j]}"
    done
  done
}

# The MPS control daemon runs as an ordinary process under a private pipe
# directory: only this run's clients find it, and no device setting changes.
MPS_DIR=$OUT/mps
mps_pairs() {
  mkdir -p "$MPS_DIR/pipe" "$MPS_DIR/log"
  nvidia-cuda-mps-control -d || return 1
  if ! timeout -k 5 30 "$KERNELS" tinygrid --seconds 0.2; then
    echo "a client cannot run under MPS here; no MPS pairs" >&2
    return 1
  fi
  pairs mps
  echo "MPS servers: $(echo get_server_list | nvidia-cuda-mps-control)" >&2
}

mps_quit() {
  echo quit | nvidia-cuda-mps-control >/dev/null 2>&1
  for _ in $(seq 100); do pgrep -f nvidia-cuda-mps-server >/dev/null || break; sleep 0.1; done
  cp "$MPS_DIR"/log/*.log "$OUT/logs/" 2>/dev/null
}

if wanted pairs; then
  export KERNELS PAIR_SECONDS MPS_DIR PAIR_JOBS="${JOBS[*]}"
  export -f run_together pairs mps_pairs
  mkdir -p "$OUT/pairs"
  step pairs-timesliced 240 bash -c 'pairs timesliced'
  grep '^{"mode"' "$OUT/logs/pairs-timesliced.log" >"$OUT/pairs/timesliced.jsonl"
  (
    export CUDA_MPS_PIPE_DIRECTORY=$MPS_DIR/pipe CUDA_MPS_LOG_DIRECTORY=$MPS_DIR/log
    step pairs-mps 240 bash -c 'mps_pairs'
    mps_quit
    echo "$failed" >"$OUT/.mps-failed"
  )
  [[ $(cat "$OUT/.mps-failed") == 0 ]] || failed=1
  grep '^{"mode"' "$OUT/logs/pairs-mps.log" >"$OUT/pairs/mps.jsonl"
  errors=$(cat "$OUT/pairs/"*.jsonl | grep -c '"error"')
  if ((errors > 0)); then
    say "FAILED: $errors runs of the pairs had a job fail (pairs/*.jsonl)"
    failed=1
  fi
fi

# ---- 6: a daemon per share ----------------------------------------------
# After pairs, whose daemon has quit. The test starts and stops its own
# daemons, through the plugin's Manager, and records what MPS did in
# mps-shares/results.json; within 2 minutes even where a client hangs.
wanted mps-shares && gotest mps-shares internal/plugin/mps '^TestRealMPSPerShareDaemons$' 120

# ---- 7: containers of claims ---------------------------------------------
# A Driver on the real driver prepares claims of GPU 0, and runc runs their
# containers from the CDI specs it wrote, with prism-mps-client and its
# libraries alone in their root file systems: libcuda comes from the
# specs' mounts and hooks. It unprepares them, and nothing may be left.
wanted containers && gotest containers internal/plugin '^TestRealContainersFromPrismsCDISpec$' 180

# ---- 8: pairs in shares of their own -------------------------------------
# Each job of a pair is a client of its own control daemon, both daemons at
# 50 % active threads by default, as two shares of half a GPU each are; the
# pairs' speeds against pairs/mps.jsonl (one daemon, no limits) and
# pairs/timesliced.jsonl say what a daemon per share costs.
limited_pairs() {
  local share jobs i j
  for share in a b; do
    mkdir -p "$LIMITED_DIR/$share/pipe" "$LIMITED_DIR/$share/log"
    CUDA_MPS_PIPE_DIRECTORY=$LIMITED_DIR/$share/pipe CUDA_MPS_LOG_DIRECTORY=$LIMITED_DIR/$share/log nvidia-cuda-mps-control -d || return 1
    echo "set_default_active_thread_percentage 50" | CUDA_MPS_PIPE_DIRECTORY=$LIMITED_DIR/$share/pipe nvidia-cuda-mps-control || return 1
  done
  read -ra jobs <<<"$PAIR_JOBS"
  for ((i = 0; i < ${#jobs[@]}; i++)); do
    for ((j = i; j < ${#jobs[@]}; j++)); do
      PAIR_PIPES="$LIMITED_DIR/a/pipe $LIMITED_DIR/b/pipe" run_together limited "${jobs[i]}" "${jobs[j]}"
    done
  done
}

limited_quit() {
  local share
  for share in a b; do
    echo quit | CUDA_MPS_PIPE_DIRECTORY=$LIMITED_DIR/$share/pipe nvidia-cuda-mps-control >/dev/null 2>&1
  done
  for _ in $(seq 100); do pgrep -f nvidia-cuda-mps-server >/dev/null || break; sleep 0.1; done
  for share in a b; do
    for f in "$LIMITED_DIR/$share"/log/*.log; do
      [[ -e $f ]] && cp "$f" "$OUT/logs/limited-$share-$(basename "$f")"
    done
  done
}

if wanted pairs-limited; then
  export KERNELS PAIR_SECONDS PAIR_JOBS="${JOBS[*]}" LIMITED_DIR=$OUT/mps-limited
  export -f run_together limited_pairs
  mkdir -p "$OUT/pairs"
  step pairs-limited 240 bash -c 'limited_pairs'
  limited_quit
  grep '^{"mode"' "$OUT/logs/pairs-limited.log" >"$OUT/pairs/limited.jsonl"
  if grep -q '"error"' "$OUT/pairs/limited.jsonl"; then
    say "FAILED: $(grep -c '"error"' "$OUT/pairs/limited.jsonl") limited pairs had a job fail (pairs/limited.jsonl)"
    failed=1
  fi
fi

# ---- the settings are as found -------------------------------------------
settings >"$OUT/settings-after.csv" 2>&1
if ! diff -u "$OUT/settings-before.csv" "$OUT/settings-after.csv" >>"$SUMMARY"; then
  say "FAILED: the GPU's settings changed during the run (diff above)"
  failed=1
else
  say "settings unchanged"
fi
say "done: $([[ $failed == 0 ]] && echo ok || echo FAILED)"
exit $failed
