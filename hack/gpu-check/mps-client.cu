/*
Copyright The Prism Authors.

Licensed under the Apache License, Version 2.0 (the "License");
you may not use this file except in compliance with the License.
You may obtain a copy of the License at

    http://www.apache.org/licenses/LICENSE-2.0

Unless required by applicable law or agreed to in writing, software
distributed under the License is distributed on an "AS IS" BASIS,
WITHOUT WARRANTIES OR CONDITIONS OF ANY KIND, either express or implied.
See the License for the specific language governing permissions and
limitations under the License.
*/

// prism-mps-client plays a share's workload for hack/gpu-check.sh's
// mps-shares step (internal/plugin/mps/realgpu_test.go):
//
//   prism-mps-client [--launches N] [--alloc BYTES[,BYTES...]] [--hold S]
//
// It initialises CUDA on device 0, times N launches of a compute-bound
// kernel of a fixed size, tries each allocation in turn (freeing it again)
// and prints one JSON line. With --hold it then keeps its context until S
// seconds have passed or its standard input is closed, runs the kernel once
// more and prints a second line saying how that went: a client whose MPS
// server was stopped under it fails there.
//
// A failed initialisation is printed as init_error, with exit status 3; a
// failed CUDA call after it as error, with exit status 2. Failed
// allocations are results, not errors.

#include <cuda_runtime.h>

#include <errno.h>
#include <poll.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include <string>
#include <vector>

#include "fmaloop.cuh"

// The kernel's size is fixed, not taken from the device's SM count, which
// MPS may report as the share's: the work per launch must be the same
// with and without a limit for their rates to compare. 16384 blocks are
// about 15 full waves on an H200 and more on anything smaller, so the last
// wave's tail costs little.
constexpr int kBlocks = 16384, kThreads = 256;
constexpr double kFlopsPerLaunch = 2.0 * kFMAIters * kFMAChains * kBlocks * kThreads;

static double now_s() {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return ts.tv_sec + ts.tv_nsec * 1e-9;
}

// fail prints what the test reads from a client that could not go on.
static void fail(const char *field, cudaError_t err, int code) {
  printf("{\"pid\":%d,\"uid\":%d,\"%s\":\"%s: %s\"}\n", (int)getpid(), (int)getuid(), field,
         cudaGetErrorName(err), cudaGetErrorString(err));
  fflush(stdout);
  exit(code);
}

#define CHECK(call)                                  \
  do {                                               \
    cudaError_t err_ = (call);                       \
    if (err_ != cudaSuccess) fail("error", err_, 2); \
  } while (0)

// hold returns after seconds, or once standard input is closed.
static void hold(double seconds) {
  for (double until = now_s() + seconds;;) {
    double left = until - now_s();
    if (left <= 0) return;
    struct pollfd p = {0, POLLIN, 0};
    int n = poll(&p, 1, (int)(left * 1000) + 1);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) return;
    if (n > 0) {
      char buf[64];
      if (read(0, buf, sizeof buf) <= 0) return;
    }
  }
}

static void usage() {
  fprintf(stderr, "usage: prism-mps-client [--launches N] [--alloc BYTES[,BYTES...]] [--hold S]\n");
  exit(64);
}

int main(int argc, char **argv) {
  int launches = 100;
  double hold_s = 0;
  std::vector<long long> allocs;
  for (int i = 1; i < argc; i++) {
    std::string a = argv[i];
    if (i + 1 >= argc) usage();
    if (a == "--launches") {
      launches = atoi(argv[++i]);
    } else if (a == "--hold") {
      hold_s = atof(argv[++i]);
    } else if (a == "--alloc") {
      for (char *s = argv[++i]; *s;) {
        char *end;
        allocs.push_back(strtoll(s, &end, 10));
        if (end == s || (*end != ',' && *end != 0)) usage();
        s = *end ? end + 1 : end;
      }
    } else {
      usage();
    }
  }
  if (launches < 1 || hold_s < 0) usage();

  // A client of another UID than its MPS server's waits here until that
  // server is gone, so the time is part of the result.
  double t0 = now_s();
  cudaError_t err = cudaSetDevice(0);
  if (err == cudaSuccess) err = cudaFree(0);
  if (err != cudaSuccess) fail("init_error", err, 3);
  double init_s = now_s() - t0;

  int sms = 0;
  CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0));
  size_t mem_free = 0, mem_total = 0;
  CHECK(cudaMemGetInfo(&mem_free, &mem_total));

  float *in, *out;
  CHECK(cudaMalloc(&in, sizeof(float) * kBlocks * kThreads));
  CHECK(cudaMalloc(&out, sizeof(float) * kBlocks * kThreads));
  CHECK(cudaMemset(in, 0, sizeof(float) * kBlocks * kThreads));
  cudaEvent_t start, stop;
  CHECK(cudaEventCreate(&start));
  CHECK(cudaEventCreate(&stop));
  // Warm up: module load and clocks.
  for (int i = 0; i < 2; i++) fmaLoop<<<kBlocks, kThreads>>>(in, out);
  CHECK(cudaGetLastError());
  CHECK(cudaDeviceSynchronize());
  CHECK(cudaEventRecord(start));
  for (int i = 0; i < launches; i++) fmaLoop<<<kBlocks, kThreads>>>(in, out);
  CHECK(cudaGetLastError());
  CHECK(cudaEventRecord(stop));
  CHECK(cudaEventSynchronize(stop));
  float ms = 0;
  CHECK(cudaEventElapsedTime(&ms, start, stop));
  double kernel_s = ms * 1e-3;

  std::string tried;
  for (long long bytes : allocs) {
    void *p = nullptr;
    cudaError_t e = cudaMalloc(&p, (size_t)bytes);
    char one[512];
    if (e == cudaSuccess) {
      CHECK(cudaFree(p));
      snprintf(one, sizeof one, "{\"bytes\":%lld}", bytes);
    } else {
      // Not sticky: the next call clears it.
      cudaGetLastError();
      snprintf(one, sizeof one, "{\"bytes\":%lld,\"error\":\"%s\",\"message\":\"%s\"}", bytes,
               cudaGetErrorName(e), cudaGetErrorString(e));
    }
    tried += (tried.empty() ? "" : ",") + std::string(one);
  }

  printf("{\"pid\":%d,\"uid\":%d,\"init_seconds\":%.6f,\"sm_count\":%d,\"mem_free_bytes\":%zu,"
         "\"mem_total_bytes\":%zu,\"launches\":%d,\"kernel_seconds\":%.6f,"
         "\"flops_per_second\":%.6g,\"allocs\":[%s]}\n",
         (int)getpid(), (int)getuid(), init_s, sms, mem_free, mem_total, launches, kernel_s,
         launches * kFlopsPerLaunch / kernel_s, tried.c_str());
  fflush(stdout);
  if (hold_s == 0) return 0;

  hold(hold_s);
  fmaLoop<<<kBlocks, kThreads>>>(in, out);
  err = cudaGetLastError();
  if (err == cudaSuccess) err = cudaDeviceSynchronize();
  printf("{\"pid\":%d,\"after_hold\":\"%s\"}\n", (int)getpid(), cudaGetErrorName(err));
  return err == cudaSuccess ? 0 : 2;
}
