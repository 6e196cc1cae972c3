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

// The compute-bound kernel of prism-gpu-kernels (fmaloop) and
// prism-mps-client.

#pragma once

// fmaLoop keeps eight independent dependency chains per thread so that the
// FMA pipes, not latency, limit it: its rate follows the SMs it gets.
constexpr int kFMAIters = 2048;
constexpr int kFMAChains = 8;
__global__ void fmaLoop(const float *in, float *out) {
  int i = blockIdx.x * blockDim.x + threadIdx.x;
  float x = in[i];
  float acc[kFMAChains];
#pragma unroll
  for (int c = 0; c < kFMAChains; c++) acc[c] = x + c;
  for (int k = 0; k < kFMAIters; k++) {
#pragma unroll
    for (int c = 0; c < kFMAChains; c++) acc[c] = fmaf(acc[c], 0.999f, 0.001f);
  }
  float s = 0;
#pragma unroll
  for (int c = 0; c < kFMAChains; c++) s += acc[c];
  out[i] = s;
}
