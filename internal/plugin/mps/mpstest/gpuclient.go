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

package mpstest

// GPUClientReport is the line prism-mps-client prints
// (hack/gpu-check/mps-client.cu): what a CUDA program saw of its GPU, or
// of its share of one, on a real GPU.
type GPUClientReport struct {
	PID int `json:"pid"`
	UID int `json:"uid"`
	// InitError is CUDA's error where it did not initialise, Error where
	// a call after that failed: "name: message".
	InitError      string     `json:"init_error,omitempty"`
	Error          string     `json:"error,omitempty"`
	InitSeconds    float64    `json:"init_seconds"`
	SMCount        int        `json:"sm_count"`
	MemFreeBytes   int64      `json:"mem_free_bytes"`
	MemTotalBytes  int64      `json:"mem_total_bytes"`
	Launches       int        `json:"launches"`
	KernelSeconds  float64    `json:"kernel_seconds"`
	FlopsPerSecond float64    `json:"flops_per_second"`
	Allocs         []GPUAlloc `json:"allocs"`
}

// GPUAlloc is one allocation the client tried: Error is CUDA's error name
// where it failed, empty where it succeeded.
type GPUAlloc struct {
	Bytes   int64  `json:"bytes"`
	Error   string `json:"error,omitempty"`
	Message string `json:"message,omitempty"`
}

// OK says that the client ran its kernel.
func (c *GPUClientReport) OK() bool {
	return c != nil && c.InitError == "" && c.Error == "" && c.FlopsPerSecond > 0
}

// AllocError is CUDA's error for the allocation of bytes: "" where it
// succeeded, "not tried" where the client did not try it.
func (c *GPUClientReport) AllocError(bytes int64) string {
	for _, a := range c.Allocs {
		if a.Bytes == bytes {
			return a.Error
		}
	}
	return "not tried"
}
