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

package rewrite

// Fleet is what the cluster publishes: one entry per GPU model, with the
// figures the kubelet plugin puts in its ResourceSlices. Rewrite derives its
// ladders from it, so that every fleet gets a preference that means
// something there (see docs/rewrite.md, "Fleet-relative ladders").
type Fleet struct {
	Models []Model `json:"models"`
	// Partitions are the MIG partitions the fleet publishes (devices with a
	// migProfile attribute), one entry per GPU model and profile. They are
	// not devices of Models: a claim for a whole GPU never gets one unless
	// the rewrite asks for it (PartitionsFromUsage).
	Partitions []PartitionModel `json:"partitions,omitempty"`
}

// PartitionModel is one MIG profile of one GPU model, as published.
type PartitionModel struct {
	// Model is the parent's gpu.prism.dev/productName.
	Model string `json:"model"`
	// Profile is gpu.prism.dev/migProfile, such as "1g.10gb".
	Profile string `json:"profile"`
	// Devices is how many placements of the profile are published.
	Devices int `json:"devices"`
	// MemoryBytes is the smallest gpu.prism.dev/memory capacity published
	// for the profile on the model.
	MemoryBytes int64 `json:"memoryBytes,omitempty"`
	// Multiprocessors is the smallest gpu.prism.dev/multiprocessorCount
	// published for the profile on the model.
	Multiprocessors int64 `json:"multiprocessors,omitempty"`
}

// Model is one GPU model of the fleet. Figures are the plugin's attributes
// gpu.prism.dev/memoryBandwidthGBps and gpu.prism.dev/fp32GFLOPS; zero
// means the model does not publish it, and such a model is never preferred
// by a tier on that figure.
type Model struct {
	// Name is gpu.prism.dev/productName.
	Name string `json:"name"`
	// Devices is how many devices of the model are published.
	Devices       int   `json:"devices"`
	BandwidthGBps int64 `json:"bandwidthGBps,omitempty"`
	FP32GFLOPS    int64 `json:"fp32GFLOPS,omitempty"`
	// MemoryBytes is the largest gpu.prism.dev/memory capacity published
	// for the model.
	MemoryBytes int64 `json:"memoryBytes,omitempty"`
	// Multiprocessors is the smallest gpu.prism.dev/multiprocessorCount
	// published for the model: what a MIG partition's SMs are a share of.
	Multiprocessors int64 `json:"multiprocessors,omitempty"`
	// MixedDevices is how many of the devices sit on nodes that publish
	// more than one model. A preferred node does not choose the device on
	// such a node, so the node-affinity preference is not used for them.
	MixedDevices int `json:"mixedDevices,omitempty"`
	// SharedDevices is how many of the devices are published shareable
	// (allowMultipleAllocations). On such a device a capacity request is
	// what a claim consumes, not a floor (see MemoryFloorAsCapacity).
	SharedDevices int `json:"sharedDevices,omitempty"`
	// ComputeLimitDevices is how many of the shared devices say that their
	// kubelet plugin grants a share's compute limit
	// (gpuv1alpha1.ComputeLimitsAttribute).
	ComputeLimitDevices int `json:"computeLimitDevices,omitempty"`
	// FigureCapacityDevices is how many of the devices also publish their
	// figures as capacities (the plugin's --figures-as-capacity), which a
	// tier bound written as a capacity request needs (see
	// TierBoundsAsCapacity).
	FigureCapacityDevices int `json:"figureCapacityDevices,omitempty"`
}
