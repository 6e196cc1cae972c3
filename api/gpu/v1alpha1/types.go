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

package v1alpha1

import (
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime/schema"
)

const (
	// GroupName is the API group of the opaque configuration, named after
	// the driver (DriverName) that the configuration is addressed to.
	GroupName = DriverName
	// Version is the only version of the configuration accepted so far.
	Version = "v1alpha1"
	// GpuConfigKind is the kind of GpuConfig.
	GpuConfigKind = "GpuConfig"
)

// SchemeGroupVersion is the group version of the types in this package.
var SchemeGroupVersion = schema.GroupVersion{Group: GroupName, Version: Version}

// SharingStrategy says whether a GPU may be shared by several containers.
type SharingStrategy string

const (
	// ExclusiveSharing gives the claim's containers the whole GPU.
	ExclusiveSharing SharingStrategy = "Exclusive"
	// TimeSlicingSharing lets the containers of the claim time-slice the GPU.
	TimeSlicingSharing SharingStrategy = "TimeSlicing"
)

// TimeSliceInterval is a coarse time slice length. The concrete durations are
// a property of the driver and GPU generation, which is why users pick a
// class instead of a number.
type TimeSliceInterval string

const (
	DefaultTimeSlice TimeSliceInterval = "Default"
	ShortTimeSlice   TimeSliceInterval = "Short"
	MediumTimeSlice  TimeSliceInterval = "Medium"
	LongTimeSlice    TimeSliceInterval = "Long"
)

// ProfilingSet is a predefined group of metrics to collect.
type ProfilingSet string

const (
	BasicProfilingSet    ProfilingSet = "basic"
	DetailedProfilingSet ProfilingSet = "detailed"
	FullProfilingSet     ProfilingSet = "full"
	RooflineProfilingSet ProfilingSet = "roofline"
)

// GpuConfig is the opaque configuration of GPUs allocated by gpu.prism.dev.
//
// +kubebuilder:object:root=true
type GpuConfig struct {
	metav1.TypeMeta `json:",inline"`

	// Sharing controls whether the GPU is used exclusively or shared.
	// Defaults to Exclusive.
	// +optional
	Sharing *GpuSharing `json:"sharing,omitempty"`

	// Profiling enables collection of a kernel profile for the containers
	// using the GPU.
	// +optional
	Profiling *GpuProfiling `json:"profiling,omitempty"`
}

// GpuSharing selects a sharing strategy.
type GpuSharing struct {
	// Strategy is Exclusive or TimeSlicing. Defaults to Exclusive.
	// +optional
	Strategy SharingStrategy `json:"strategy,omitempty"`

	// TimeSlicing configures time slicing. Only valid with the TimeSlicing
	// strategy.
	// +optional
	TimeSlicing *TimeSlicingConfig `json:"timeSlicing,omitempty"`

	// ComputeLimitPercent caps a share's clients to this many of the GPU's
	// SMs (MPS's active thread percentage), 1 to 100. Without it a share's
	// clients may use every SM while they run: the GPU time-slices
	// between the shares of one GPU, so a cap does not keep one share from
	// slowing another, and only slows the share that holds it, even on a
	// GPU that is otherwise idle. Set it where a tenant must never use more
	// of the GPU than it asked for. The kubelet plugin grants at least the
	// compute the scheduler counted for the share (its request) and at
	// most twice it, within the GPU. It has no effect on a whole GPU. See
	// docs/sharing.md.
	// +optional
	ComputeLimitPercent *int32 `json:"computeLimitPercent,omitempty"`
}

// TimeSlicingConfig configures time slicing.
type TimeSlicingConfig struct {
	// Interval is one of Default, Short, Medium or Long. Defaults to Default.
	// +optional
	Interval TimeSliceInterval `json:"interval,omitempty"`
}

// GpuProfiling configures the kernel profiler.
type GpuProfiling struct {
	// Enabled turns profiling on.
	Enabled bool `json:"enabled"`

	// Set is a predefined metric set: basic, detailed, full or roofline.
	// Mutually exclusive with Metrics. Defaults to basic when profiling is
	// enabled and Metrics is empty.
	// +optional
	Set ProfilingSet `json:"set,omitempty"`

	// Metrics lists individual metric names, for example
	// sm__throughput.avg.pct_of_peak_sustained_elapsed.
	// Mutually exclusive with Set.
	// +optional
	Metrics []string `json:"metrics,omitempty"`

	// LaunchCount is how many kernel launches are profiled.
	// Defaults to 1 when profiling is enabled.
	// +optional
	LaunchCount *int32 `json:"launchCount,omitempty"`

	// KernelFilter limits profiling to kernels with this name, or, with a
	// "regex:" prefix, to kernels matching a (restricted) expression.
	// +optional
	KernelFilter string `json:"kernelFilter,omitempty"`
}
