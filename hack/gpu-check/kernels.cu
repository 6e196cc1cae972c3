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

// prism-gpu-kernels runs one of a few workloads of known shape on GPU 0,
// for hack/gpu-check.sh:
//
//   prism-gpu-kernels JOB [--seconds S] [--launches N] [--duty F] [--sync DIR]
//
// Without --seconds it launches the job's kernels exactly --launches times
// (default 1) with no warm-up, so that Nsight Compute sees only them. With
// --seconds it warms up, optionally waits at a barrier (DIR/ready.<pid>,
// then DIR/go holding the start time in ns since the epoch), and runs for
// S seconds, busy for F of every 100 ms. It prints one JSON line at exit.

#include <cublas_v2.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <errno.h>
#include <fcntl.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include <string>
#include <vector>

#include "fmaloop.cuh"

#define CHECK(call)                                                                  \
  do {                                                                               \
    cudaError_t err_ = (call);                                                       \
    if (err_ != cudaSuccess) {                                                       \
      fprintf(stderr, "%s:%d: %s: %s\n", __FILE__, __LINE__, #call,                  \
              cudaGetErrorString(err_));                                             \
      exit(2);                                                                       \
    }                                                                                \
  } while (0)

#define CHECK_BLAS(call)                                                             \
  do {                                                                               \
    cublasStatus_t st_ = (call);                                                     \
    if (st_ != CUBLAS_STATUS_SUCCESS) {                                              \
      fprintf(stderr, "%s:%d: %s: cuBLAS status %d\n", __FILE__, __LINE__, #call,    \
              (int)st_);                                                             \
      exit(2);                                                                       \
    }                                                                                \
  } while (0)

// Every launch is checked: a launch error is only reported by the next call.
#define CHECK_LAUNCH() CHECK(cudaGetLastError())

static double now_s() {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return ts.tv_sec + ts.tv_nsec * 1e-9;
}

static int64_t realtime_ns() {
  struct timespec ts;
  clock_gettime(CLOCK_REALTIME, &ts);
  return (int64_t)ts.tv_sec * 1000000000LL + ts.tv_nsec;
}

static void sleep_s(double s) {
  if (s <= 0) return;
  struct timespec ts;
  ts.tv_sec = (time_t)s;
  ts.tv_nsec = (long)((s - ts.tv_sec) * 1e9);
  while (nanosleep(&ts, &ts) == -1 && errno == EINTR) {
  }
}

// ---- kernels ---------------------------------------------------------------

__global__ void vectorAdd(const float *a, const float *b, float *c, int n) {
  int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) c[i] = a[i] + b[i];
}


// tinyKernel is too small to fill the GPU: 32 blocks on a GPU of 100+ SMs,
// one dependent chain per thread.
constexpr int kTinyBlocks = 32, kTinyThreads = 64, kTinyIters = 64;
__global__ void tinyKernel(const float *in, float *out) {
  int i = blockIdx.x * blockDim.x + threadIdx.x;
  float x = in[i];
  for (int k = 0; k < kTinyIters; k++) x = fmaf(x, 1.0001f, 0.5f);
  out[i] = x;
}

// ---- jobs ------------------------------------------------------------------

static uint64_t rng_state = 0x9E3779B97F4A7C15ULL;
static uint32_t next_rand() {
  rng_state ^= rng_state << 13;
  rng_state ^= rng_state >> 7;
  rng_state ^= rng_state << 17;
  return (uint32_t)(rng_state >> 32);
}

static size_t allocated = 0;

static float *random_floats(size_t n) {
  std::vector<float> host(n);
  for (size_t i = 0; i < n; i++) host[i] = (next_rand() >> 8) * (1.0f / 16777216.0f);
  float *d;
  CHECK(cudaMalloc(&d, n * sizeof(float)));
  allocated += n * sizeof(float);
  CHECK(cudaMemcpy(d, host.data(), n * sizeof(float), cudaMemcpyHostToDevice));
  return d;
}

static __half *random_halves(size_t n) {
  std::vector<__half> host(n);
  for (size_t i = 0; i < n; i++) host[i] = __float2half((next_rand() >> 8) * (1.0f / 16777216.0f) - 0.5f);
  __half *d;
  CHECK(cudaMalloc(&d, n * sizeof(__half)));
  allocated += n * sizeof(__half);
  CHECK(cudaMemcpy(d, host.data(), n * sizeof(__half), cudaMemcpyHostToDevice));
  return d;
}

static void *device_bytes(size_t n, int pattern) {
  void *d;
  CHECK(cudaMalloc(&d, n));
  allocated += n;
  CHECK(cudaMemset(d, pattern, n));
  return d;
}

struct Job {
  std::string name;
  double bytes = 0, flops = 0;  // minimum per launch
  cudaStream_t stream = nullptr;
  // vectoradd, fmaloop, tinygrid
  float *a = nullptr, *b = nullptr, *c = nullptr;
  int n = 0, fma_blocks = 0;
  float *small_in = nullptr, *small_out = nullptr;
  // gemm
  cublasHandle_t blas = nullptr;
  __half *ga = nullptr, *gb = nullptr, *gc = nullptr;
  int gemm_n = 0;
  // copy
  void *src = nullptr, *dst = nullptr;
  size_t copy_bytes = 0;

  void launch_vectoradd() {
    vectorAdd<<<(n + 255) / 256, 256, 0, stream>>>(a, b, c, n);
    CHECK_LAUNCH();
  }
  void launch_fma() {
    fmaLoop<<<fma_blocks, 256, 0, stream>>>(a, c);
    CHECK_LAUNCH();
  }
  void launch_tiny() {
    tinyKernel<<<kTinyBlocks, kTinyThreads, 0, stream>>>(small_in, small_out);
    CHECK_LAUNCH();
  }

  void launch() {
    if (name == "vectoradd") {
      launch_vectoradd();
    } else if (name == "fmaloop") {
      launch_fma();
    } else if (name == "tinygrid") {
      launch_tiny();
    } else if (name == "mixed") {
      launch_vectoradd();
      launch_vectoradd();
      launch_fma();
      for (int i = 0; i < 4; i++) launch_tiny();
    } else if (gemm_n) {
      const float alpha = 1.0f, beta = 0.0f;
      CHECK_BLAS(cublasGemmEx(blas, CUBLAS_OP_N, CUBLAS_OP_N, gemm_n, gemm_n, gemm_n, &alpha, ga,
                              CUDA_R_16F, gemm_n, gb, CUDA_R_16F, gemm_n, &beta, gc, CUDA_R_16F,
                              gemm_n, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT));
    } else {
      CHECK(cudaMemcpyAsync(dst, src, copy_bytes, cudaMemcpyDeviceToDevice, stream));
    }
  }
};

static void setup(Job &j) {
  CHECK(cudaStreamCreateWithFlags(&j.stream, cudaStreamNonBlocking));
  cudaDeviceProp prop;
  CHECK(cudaGetDeviceProperties(&prop, 0));
  const std::string &n = j.name;
  bool vec = n == "vectoradd" || n == "mixed", fma = n == "fmaloop" || n == "mixed",
       tiny = n == "tinygrid" || n == "mixed";
  if (vec || fma) {
    j.n = 1 << 26;
    j.a = random_floats(j.n);
    j.b = random_floats(j.n);
    j.c = random_floats(j.n);
  }
  if (fma) {
    int per_sm = 0;
    CHECK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, fmaLoop, 256, 0));
    j.fma_blocks = prop.multiProcessorCount * per_sm;  // one full wave
    if ((size_t)j.fma_blocks * 256 > (size_t)j.n) j.fma_blocks = j.n / 256;
  }
  if (tiny) {
    j.small_in = random_floats(kTinyBlocks * kTinyThreads);
    j.small_out = random_floats(kTinyBlocks * kTinyThreads);
  }
  double fma_flops = 2.0 * kFMAIters * kFMAChains * j.fma_blocks * 256;
  double tiny_flops = 2.0 * kTinyIters * kTinyBlocks * kTinyThreads;
  if (n == "vectoradd") {
    j.bytes = 12.0 * j.n;
    j.flops = j.n;
  } else if (n == "fmaloop") {
    j.bytes = 8.0 * j.fma_blocks * 256;
    j.flops = fma_flops;
  } else if (n == "tinygrid") {
    j.bytes = 8.0 * kTinyBlocks * kTinyThreads;
    j.flops = tiny_flops;
  } else if (n == "mixed") {
    j.bytes = 2 * 12.0 * j.n + 8.0 * j.fma_blocks * 256 + 4 * 8.0 * kTinyBlocks * kTinyThreads;
    j.flops = 2.0 * j.n + fma_flops + 4 * tiny_flops;
  } else if (n == "gemm-2048" || n == "gemm-8192") {
    j.gemm_n = n == "gemm-2048" ? 2048 : 8192;
    size_t e = (size_t)j.gemm_n * j.gemm_n;
    j.ga = random_halves(e);
    j.gb = random_halves(e);
    j.gc = random_halves(e);
    CHECK_BLAS(cublasCreate(&j.blas));
    CHECK_BLAS(cublasSetStream(j.blas, j.stream));
    j.bytes = 3.0 * e * sizeof(__half);
    j.flops = 2.0 * j.gemm_n * (double)j.gemm_n * j.gemm_n;
  } else if (n == "copy-16m" || n == "copy-2g") {
    j.copy_bytes = n == "copy-16m" ? (16ull << 20) : (2ull << 30);
    j.src = device_bytes(j.copy_bytes, 0x5a);
    j.dst = device_bytes(j.copy_bytes, 0xa5);
    j.bytes = 2.0 * j.copy_bytes;  // read plus write
  }
  CHECK(cudaDeviceSynchronize());
}

// batch launches k times and waits; returns the GPU time of the batch.
static double batch(Job &j, int k, cudaEvent_t start, cudaEvent_t stop) {
  CHECK(cudaEventRecord(start, j.stream));
  for (int i = 0; i < k; i++) j.launch();
  CHECK(cudaEventRecord(stop, j.stream));
  CHECK(cudaEventSynchronize(stop));
  float ms = 0;
  CHECK(cudaEventElapsedTime(&ms, start, stop));
  return ms * 1e-3;
}

static void wait_at_barrier(const char *dir) {
  char path[4096];
  snprintf(path, sizeof path, "%s/ready.%d", dir, (int)getpid());
  int fd = open(path, O_CREAT | O_WRONLY | O_TRUNC, 0644);
  if (fd < 0) {
    perror(path);
    exit(2);
  }
  close(fd);
  snprintf(path, sizeof path, "%s/go", dir);
  FILE *f = nullptr;
  double give_up = now_s() + 120;
  while ((f = fopen(path, "r")) == nullptr) {
    if (now_s() > give_up) {
      fprintf(stderr, "no %s after 120 s\n", path);
      exit(2);
    }
    sleep_s(0.0005);
  }
  long long start_ns = 0;
  if (fscanf(f, "%lld", &start_ns) != 1) {
    fprintf(stderr, "%s holds no start time\n", path);
    exit(2);
  }
  fclose(f);
  int64_t wait = start_ns - realtime_ns();
  if (wait > 10) sleep_s((wait - 200000) * 1e-9);  // wake early, then spin
  while (realtime_ns() < start_ns) {
  }
}

static void usage() {
  fprintf(stderr,
          "usage: prism-gpu-kernels vectoradd|fmaloop|tinygrid|mixed|gemm-2048|gemm-8192|"
          "copy-16m|copy-2g [--seconds S] [--launches N] [--duty F] [--sync DIR]\n");
  exit(64);
}

int main(int argc, char **argv) {
  if (argc < 2) usage();
  Job j;
  j.name = argv[1];
  double seconds = 0, duty = 1;
  int launches = 1;
  const char *sync_dir = nullptr;
  for (int i = 2; i < argc; i++) {
    std::string a = argv[i];
    if (i + 1 >= argc) usage();
    if (a == "--seconds") {
      seconds = atof(argv[++i]);
    } else if (a == "--launches") {
      launches = atoi(argv[++i]);
    } else if (a == "--duty") {
      duty = atof(argv[++i]);
    } else if (a == "--sync") {
      sync_dir = argv[++i];
    } else {
      usage();
    }
  }
  static const char *known[] = {"vectoradd", "fmaloop", "tinygrid", "mixed",
                                "gemm-2048", "gemm-8192", "copy-16m", "copy-2g"};
  bool ok = false;
  for (const char *k : known) ok = ok || j.name == k;
  if (!ok || duty <= 0 || duty > 1 || launches < 1 || seconds < 0) usage();
  setup(j);

  cudaEvent_t ev0, ev1;
  CHECK(cudaEventCreate(&ev0));
  CHECK(cudaEventCreate(&ev1));

  long long done = 0;
  double elapsed = 0, busy = 0, gpu = 0;
  if (seconds == 0) {
    double t0 = now_s();
    gpu = batch(j, launches, ev0, ev1);
    elapsed = busy = now_s() - t0;
    done = launches;
  } else {
    // Warm up (module load, cuBLAS heuristics), then size a batch at about
    // 2 ms of work so that the host's wait per batch stays small.
    batch(j, 1, ev0, ev1);
    double t1 = 0;
    int reps = 0;
    for (double until = now_s() + 0.2; now_s() < until; reps++) t1 += batch(j, 1, ev0, ev1);
    double per = t1 / reps;
    int k = (int)(0.002 / (per > 0 ? per : 1e-6));
    if (k < 1) k = 1;
    if (k > 4096) k = 4096;
    if (sync_dir) wait_at_barrier(sync_dir);

    const double period = 0.1;
    double start = now_s(), end = start + seconds, last = start;
    while (last < end) {
      double p0 = now_s();
      double busy_until = p0 + duty * period;
      if (busy_until > end) busy_until = end;
      do {
        gpu += batch(j, k, ev0, ev1);
        done += k;
        last = now_s();
      } while (last < busy_until);
      busy += last - p0;
      if (duty < 1 && last < end) {
        double rest = p0 + period - last;
        if (last + rest > end) rest = end - last;
        sleep_s(rest);
        last = now_s();
      }
    }
    elapsed = last - start;
  }
  CHECK(cudaDeviceSynchronize());
  printf("{\"job\":\"%s\",\"pid\":%d,\"launches\":%lld,\"seconds\":%.6f,\"per_second\":%.6g,"
         "\"bytes_per_launch\":%.0f,\"flops_per_launch\":%.0f,\"busy_fraction\":%.4f,"
         "\"allocated_bytes\":%zu,\"gpu_seconds\":%.6f}\n",
         j.name.c_str(), (int)getpid(), done, elapsed, done / elapsed, j.bytes, j.flops,
         elapsed > 0 ? busy / elapsed : 0, allocated, gpu);
  return 0;
}
