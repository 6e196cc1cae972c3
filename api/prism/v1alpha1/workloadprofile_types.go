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
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
)

// The API carries no floating point numbers: they do not round-trip
// reliably through JSON and YAML, and Kubernetes API conventions forbid
// them. Percentages are integers in milli-percent (87.5 % is 87500), for
// programs, each with a string beside it for people ("87.5%"), which is
// what kubectl's columns show; magnitudes without a natural bound are
// resource.Quantity, each held to QuantityPattern (see quantity.go).

// BoundType names the hardware unit that limits a workload, following the
// bottleneck rule of the Nsight Compute Speed Of Light section. The rule
// classifies each kernel; a workload takes the class of the kernels that
// hold the most of its GPU time (see WorkloadProfileStatus.BoundTimeShares).
// +kubebuilder:validation:Enum=ComputeBound;MemoryBound;LatencyBound;Balanced;Unknown
type BoundType string

const (
	// BoundTypeComputeBound means the SMs are the busier unit.
	BoundTypeComputeBound BoundType = "ComputeBound"
	// BoundTypeMemoryBound means the memory system is the busier unit.
	BoundTypeMemoryBound BoundType = "MemoryBound"
	// BoundTypeLatencyBound means neither unit reaches 60 % of its peak:
	// the work is too small or too serialised to fill the device, so a
	// smaller or shared GPU costs it little.
	BoundTypeLatencyBound BoundType = "LatencyBound"
	// BoundTypeBalanced means both units are used within 10 points of
	// each other and neither reaches 80 %; for a workload, also that
	// ComputeBound and MemoryBound kernels hold the same, largest share
	// of its GPU time.
	BoundTypeBalanced BoundType = "Balanced"
	// BoundTypeUnknown means no kernel was measured.
	BoundTypeUnknown BoundType = "Unknown"
)

// Policy tells the allocator what to optimise for when it picks a device.
// +kubebuilder:validation:Enum=performance;economy;load-aware
type Policy string

const (
	// PolicyPerformance prefers the device that runs the workload fastest.
	PolicyPerformance Policy = "performance"
	// PolicyEconomy prefers the cheapest device that is not the bottleneck.
	PolicyEconomy Policy = "economy"
	// PolicyLoadAware is performance, except that at admission the job
	// leaves the fastest class to pending claims that gain more from it or
	// need several of its devices. See docs/rewrite.md, "Choosing the
	// policy".
	PolicyLoadAware Policy = "load-aware"
)

// Sharing says whether the workload may run on a share of a GPU.
// +kubebuilder:validation:Enum=Exclusive;Fractional
type Sharing string

const (
	// SharingExclusive asks for whole GPUs only.
	SharingExclusive Sharing = "Exclusive"
	// SharingFractional asks, in every alternative, for the memory need
	// as a share of a GPU published shareable.
	SharingFractional Sharing = "Fractional"
)

// ProfileSourceType says where the numbers in a status came from.
// +kubebuilder:validation:Enum=ResourceClaim;Import
type ProfileSourceType string

const (
	// ProfileSourceResourceClaim means the kubelet plugin profiled a
	// container that ran with the named claim.
	ProfileSourceResourceClaim ProfileSourceType = "ResourceClaim"
	// ProfileSourceImport means a user imported an ncu report.
	ProfileSourceImport ProfileSourceType = "Import"
)

// Condition types and reasons set on WorkloadProfile.
const (
	// ConditionProfiled is True once the status holds measured numbers.
	ConditionProfiled = "Profiled"
	// ConditionRooflineConsistent compares the speed-of-light class with
	// the FP32 roofline model. False means they disagree; the bound type
	// keeps the speed-of-light answer, and the message says why they
	// differ. It is set only when the roofline can judge the class: a
	// memory- or compute-bound workload with FP32 work, DRAM traffic and a
	// device of known peaks. Otherwise it is absent, because "cannot tell"
	// on every profile of integer or tensor-core work is noise.
	ConditionRooflineConsistent = "RooflineConsistent"

	// ReasonReportParsed is the reason of Profiled=True.
	ReasonReportParsed = "ReportParsed"
	// ReasonNoKernels is the reason of Profiled=False when the report
	// held no kernel launches.
	ReasonNoKernels = "NoKernels"
	// ReasonRooflineAgrees is the reason of RooflineConsistent=True.
	ReasonRooflineAgrees = "RooflineAgrees"
	// ReasonRooflineDisagrees is the reason of RooflineConsistent=False.
	ReasonRooflineDisagrees = "RooflineDisagrees"
)

// WorkloadProfileSpec holds what the user pins; everything measured lives
// in the status.
type WorkloadProfileSpec struct {
	// minMemory is the least GPU memory a device must have, whatever the
	// profile says.
	// +optional
	// +kubebuilder:validation:XIntOrString
	// +kubebuilder:validation:Pattern=`^(\+|-)?(([0-9]{1,32}(\.[0-9]{0,32})?)|(\.[0-9]{1,32}))(([KMGTPE]i)|[numkMGTPE]|([eE](\+|-)?[0-9]{1,2}))?$`
	MinMemory *resource.Quantity `json:"minMemory,omitempty"`

	// minComputeCapability is the lowest CUDA compute capability the
	// workload runs on, as "major.minor" (for example "8.0"), because
	// binaries built for a newer architecture do not load on older ones.
	// +optional
	// +kubebuilder:validation:Pattern=`^[0-9]{1,2}\.[0-9]{1,2}$`
	MinComputeCapability string `json:"minComputeCapability,omitempty"`

	// policy overrides the cluster's default allocation policy for this
	// workload.
	// +optional
	Policy Policy `json:"policy,omitempty"`

	// sharing allows or forbids a share of a GPU. Exclusive: the
	// workload's claims keep whole GPUs. Fractional: every alternative
	// asks for the memory need as a share of a GPU published shareable.
	// Unset: where status.usage shows the workload fits a share, a claim
	// for one whole GPU gets that share as its first choice and the whole
	// GPU after it.
	// +optional
	Sharing Sharing `json:"sharing,omitempty"`

	// disableAutoProfiling stops the kubelet plugin from profiling
	// containers of this workload. Profiling replays kernels and slows
	// them; set this for latency-sensitive serving or when the profile
	// is imported by hand.
	// +optional
	DisableAutoProfiling bool `json:"disableAutoProfiling,omitempty"`
}

// ClaimReference names the ResourceClaim a profile was collected under.
type ClaimReference struct {
	// namespace of the claim.
	// +kubebuilder:validation:MaxLength=63
	Namespace string `json:"namespace"`
	// name of the claim.
	// +kubebuilder:validation:MaxLength=253
	Name string `json:"name"`
	// uid of the claim, so that a recreated claim of the same name is
	// told apart.
	// +optional
	UID types.UID `json:"uid,omitempty"`
}

// ProfileSource says where the status numbers came from.
type ProfileSource struct {
	// type of the source.
	Type ProfileSourceType `json:"type"`
	// resourceClaim is set when type is ResourceClaim.
	// +optional
	ResourceClaim *ClaimReference `json:"resourceClaim,omitempty"`
}

// ProfiledDevice describes the GPU the profile was measured on; the
// percentages are relative to that device's peaks.
type ProfiledDevice struct {
	// productName as the driver reports it, for example
	// "NVIDIA H100 80GB HBM3".
	// +optional
	// +kubebuilder:validation:MaxLength=256
	ProductName string `json:"productName,omitempty"`
	// computeCapability as "major.minor".
	// +optional
	// +kubebuilder:validation:Pattern=`^[0-9]{1,2}\.[0-9]{1,2}$`
	ComputeCapability string `json:"computeCapability,omitempty"`
}

// KernelSummary describes one kernel (all launches of the same name).
type KernelSummary struct {
	// name of the kernel as ncu printed it, truncated to 512 bytes.
	// +kubebuilder:validation:MaxLength=512
	Name string `json:"name"`
	// launches of this kernel in the report.
	// +kubebuilder:validation:Minimum=1
	Launches int32 `json:"launches"`
	// timeShareMilliPercent is this kernel's share of the total GPU time.
	// +kubebuilder:validation:Minimum=0
	// +kubebuilder:validation:Maximum=100000
	TimeShareMilliPercent int32 `json:"timeShareMilliPercent"`
	// smThroughputMilliPercent is the kernel's duration-weighted SM
	// throughput.
	// +kubebuilder:validation:Minimum=0
	// +kubebuilder:validation:Maximum=100000
	SMThroughputMilliPercent int32 `json:"smThroughputMilliPercent"`
	// memoryThroughputMilliPercent is the kernel's duration-weighted
	// memory throughput.
	// +kubebuilder:validation:Minimum=0
	// +kubebuilder:validation:Maximum=100000
	MemoryThroughputMilliPercent int32 `json:"memoryThroughputMilliPercent"`
}

// BoundTimeShares is the share of a profile's GPU time spent in kernels of
// each speed-of-light class, in milli-percent. Each is rounded on its own,
// so the four may add up to a few milli-percent more or less than 100000.
// When a report's launches all have a zero duration, the shares are of
// launches instead.
type BoundTimeShares struct {
	// computeBoundMilliPercent is the share of ComputeBound kernels.
	// +kubebuilder:validation:Minimum=0
	// +kubebuilder:validation:Maximum=100000
	ComputeBoundMilliPercent int32 `json:"computeBoundMilliPercent"`
	// memoryBoundMilliPercent is the share of MemoryBound kernels.
	// +kubebuilder:validation:Minimum=0
	// +kubebuilder:validation:Maximum=100000
	MemoryBoundMilliPercent int32 `json:"memoryBoundMilliPercent"`
	// latencyBoundMilliPercent is the share of LatencyBound kernels.
	// +kubebuilder:validation:Minimum=0
	// +kubebuilder:validation:Maximum=100000
	LatencyBoundMilliPercent int32 `json:"latencyBoundMilliPercent"`
	// balancedMilliPercent is the share of Balanced kernels.
	// +kubebuilder:validation:Minimum=0
	// +kubebuilder:validation:Maximum=100000
	BalancedMilliPercent int32 `json:"balancedMilliPercent"`
}

// ReportDigest identifies the raw ncu report a status was computed from.
// The workload wrote that report, so it proves nothing about the
// workload; it lets a person match a profile with the report kept on the
// node, and tell two profiles from the same report apart from two runs.
type ReportDigest struct {
	// file is the report's name in the node's profile archive
	// (report.csv, or ncu.log when ncu printed its results there).
	// +optional
	// +kubebuilder:validation:MaxLength=64
	File string `json:"file,omitempty"`
	// sha256 of the report, in lower-case hex.
	// +kubebuilder:validation:Pattern=`^[0-9a-f]{64}$`
	SHA256 string `json:"sha256"`
	// sizeBytes of the report.
	// +kubebuilder:validation:Minimum=0
	SizeBytes int64 `json:"sizeBytes"`
}

// WorkloadProfileStatus is the measured profile. Every aggregate is
// weighted by kernel duration, so that a kernel that runs for most of the
// GPU time dominates the class. Fields are absent when ncu did not
// measure them.
type WorkloadProfileStatus struct {
	// boundType is the speed-of-light class of the workload: the class of
	// the kernels that hold the most GPU time (see boundTimeShares).
	// +optional
	BoundType BoundType `json:"boundType,omitempty"`
	// boundTimeShares is the share of the GPU time spent in kernels of
	// each speed-of-light class, each kernel (all launches of one name)
	// classified by its own duration-weighted SM and memory throughput.
	// boundType is the class with the largest share, so it can be
	// recomputed from these four figures alone (profile.ClassifyShares).
	// It is absent from a profile written by a plugin or prismctl that
	// predates it, whose boundType is the class of the averaged
	// smThroughputMilliPercent and memoryThroughputMilliPercent, and from
	// one stored under a CRD without it; either way the stored boundType
	// is used as it is until the workload is profiled again.
	// +optional
	BoundTimeShares *BoundTimeShares `json:"boundTimeShares,omitempty"`

	// smThroughputMilliPercent is the SM (compute) throughput in
	// milli-percent of the device's peak.
	// +optional
	// +kubebuilder:validation:Minimum=0
	// +kubebuilder:validation:Maximum=100000
	SMThroughputMilliPercent *int32 `json:"smThroughputMilliPercent,omitempty"`
	// smThroughput is smThroughputMilliPercent for people, to one
	// decimal: "20.9%".
	// +optional
	// +kubebuilder:validation:MaxLength=8
	SMThroughput string `json:"smThroughput,omitempty"`
	// memoryThroughputMilliPercent is the memory throughput (the busiest
	// of DRAM, L2 and L1) in milli-percent of peak.
	// +optional
	// +kubebuilder:validation:Minimum=0
	// +kubebuilder:validation:Maximum=100000
	MemoryThroughputMilliPercent *int32 `json:"memoryThroughputMilliPercent,omitempty"`
	// memoryThroughput is memoryThroughputMilliPercent for people, to one
	// decimal: "87.5%".
	// +optional
	// +kubebuilder:validation:MaxLength=8
	MemoryThroughput string `json:"memoryThroughput,omitempty"`
	// dramThroughputMilliPercent is the DRAM throughput in milli-percent
	// of peak.
	// +optional
	// +kubebuilder:validation:Minimum=0
	// +kubebuilder:validation:Maximum=100000
	DRAMThroughputMilliPercent *int32 `json:"dramThroughputMilliPercent,omitempty"`
	// l2ThroughputMilliPercent is the L2 cache throughput in
	// milli-percent of peak.
	// +optional
	// +kubebuilder:validation:Minimum=0
	// +kubebuilder:validation:Maximum=100000
	L2ThroughputMilliPercent *int32 `json:"l2ThroughputMilliPercent,omitempty"`
	// achievedOccupancyMilliPercent is the achieved occupancy (active
	// warps over the SM's maximum) in milli-percent.
	// +optional
	// +kubebuilder:validation:Minimum=0
	// +kubebuilder:validation:Maximum=100000
	AchievedOccupancyMilliPercent *int32 `json:"achievedOccupancyMilliPercent,omitempty"`
	// achievedOccupancy is achievedOccupancyMilliPercent for people, to
	// one decimal: "48.0%".
	// +optional
	// +kubebuilder:validation:MaxLength=8
	AchievedOccupancy string `json:"achievedOccupancy,omitempty"`
	// wavesPerSM is the number of waves of thread blocks per SM. Below 1
	// the grid does not fill the device.
	// +optional
	// +kubebuilder:validation:XIntOrString
	// +kubebuilder:validation:Pattern=`^(\+|-)?(([0-9]{1,32}(\.[0-9]{0,32})?)|(\.[0-9]{1,32}))(([KMGTPE]i)|[numkMGTPE]|([eE](\+|-)?[0-9]{1,2}))?$`
	WavesPerSM *resource.Quantity `json:"wavesPerSM,omitempty"`
	// dramBytes is the total DRAM traffic, summed over all launches.
	// +optional
	// +kubebuilder:validation:XIntOrString
	// +kubebuilder:validation:Pattern=`^(\+|-)?(([0-9]{1,32}(\.[0-9]{0,32})?)|(\.[0-9]{1,32}))(([KMGTPE]i)|[numkMGTPE]|([eE](\+|-)?[0-9]{1,2}))?$`
	DRAMBytes *resource.Quantity `json:"dramBytes,omitempty"`
	// flops is the total single-precision floating point operations
	// (an FMA counts two), summed over all launches.
	// +optional
	// +kubebuilder:validation:XIntOrString
	// +kubebuilder:validation:Pattern=`^(\+|-)?(([0-9]{1,32}(\.[0-9]{0,32})?)|(\.[0-9]{1,32}))(([KMGTPE]i)|[numkMGTPE]|([eE](\+|-)?[0-9]{1,2}))?$`
	FLOPs *resource.Quantity `json:"flops,omitempty"`
	// arithmeticIntensity is flops divided by dramBytes, in FLOP per
	// byte; it places the workload on the roofline.
	// +optional
	// +kubebuilder:validation:XIntOrString
	// +kubebuilder:validation:Pattern=`^(\+|-)?(([0-9]{1,32}(\.[0-9]{0,32})?)|(\.[0-9]{1,32}))(([KMGTPE]i)|[numkMGTPE]|([eE](\+|-)?[0-9]{1,2}))?$`
	ArithmeticIntensity *resource.Quantity `json:"arithmeticIntensity,omitempty"`
	// peakMemory is the most device memory the workload held, when known
	// (from NVML; ncu does not measure it).
	// +optional
	// +kubebuilder:validation:XIntOrString
	// +kubebuilder:validation:Pattern=`^(\+|-)?(([0-9]{1,32}(\.[0-9]{0,32})?)|(\.[0-9]{1,32}))(([KMGTPE]i)|[numkMGTPE]|([eE](\+|-)?[0-9]{1,2}))?$`
	PeakMemory *resource.Quantity `json:"peakMemory,omitempty"`

	// kernelLaunches is the number of kernel launches profiled.
	// +optional
	// +kubebuilder:validation:Minimum=0
	KernelLaunches int32 `json:"kernelLaunches,omitempty"`
	// totalGPUTimeNanoseconds is the summed duration of all profiled
	// launches.
	// +optional
	// +kubebuilder:validation:Minimum=0
	TotalGPUTimeNanoseconds int64 `json:"totalGPUTimeNanoseconds,omitempty"`
	// topKernels lists the kernels that took the most GPU time, largest
	// first.
	// +optional
	// +listType=atomic
	// +kubebuilder:validation:MaxItems=10
	TopKernels []KernelSummary `json:"topKernels,omitempty"`

	// device is the GPU the profile was measured on.
	// +optional
	Device *ProfiledDevice `json:"device,omitempty"`
	// ncuVersion is the Nsight Compute version that produced the report;
	// metric definitions change between versions.
	// +optional
	// +kubebuilder:validation:MaxLength=64
	NCUVersion string `json:"ncuVersion,omitempty"`
	// observedAt is when the report was taken in (collected or imported).
	// +optional
	ObservedAt *metav1.Time `json:"observedAt,omitempty"`
	// source says where the report came from.
	// +optional
	Source *ProfileSource `json:"source,omitempty"`
	// report identifies the raw report, when the writer had it.
	// +optional
	Report *ReportDigest `json:"report,omitempty"`

	// usage is what NVML saw the workload use while its claims were
	// prepared: always measured, no ncu needed. The rewrite sizes GPU
	// shares from it.
	// +optional
	Usage *UsageProfile `json:"usage,omitempty"`

	// conditions: Profiled and RooflineConsistent.
	// +optional
	// +listType=map
	// +listMapKey=type
	// +patchStrategy=merge
	// +patchMergeKey=type
	Conditions []metav1.Condition `json:"conditions,omitempty" patchStrategy:"merge" patchMergeKey:"type"`
}

// UsageProfile is NVML's view of a workload's runs, merged across runs so
// that the latest run weighs most: each figure is an exponentially weighted
// mean in which the newest run counts one half (see internal/plugin/usage), except
// peakMemory, which is the larger of that mean and the newest run's peak so
// that a run that grew is never sized below what it just used.
type UsageProfile struct {
	// dutyCycleP50MilliPercent and dutyCycleP95MilliPercent are the median
	// and 95th percentile of the GPU's utilisation (the share of time a
	// kernel ran), in thousandths of a per cent; on a shared GPU, the
	// workload's own processes' figure.
	// +optional
	// +kubebuilder:validation:Minimum=0
	// +kubebuilder:validation:Maximum=100000
	DutyCycleP50MilliPercent *int32 `json:"dutyCycleP50MilliPercent,omitempty"`
	// +optional
	// +kubebuilder:validation:Minimum=0
	// +kubebuilder:validation:Maximum=100000
	DutyCycleP95MilliPercent *int32 `json:"dutyCycleP95MilliPercent,omitempty"`
	// smActivityMilliPercent and dramActivityMilliPercent are the mean SM
	// activity and DRAM bandwidth use from GPM, on GPUs that have it
	// (Hopper and later); absent elsewhere.
	// +optional
	// +kubebuilder:validation:Minimum=0
	// +kubebuilder:validation:Maximum=100000
	SMActivityMilliPercent *int32 `json:"smActivityMilliPercent,omitempty"`
	// +optional
	// +kubebuilder:validation:Minimum=0
	// +kubebuilder:validation:Maximum=100000
	DRAMActivityMilliPercent *int32 `json:"dramActivityMilliPercent,omitempty"`
	// peakMemory is the most device memory the workload held.
	// +optional
	// +kubebuilder:validation:XIntOrString
	// +kubebuilder:validation:Pattern=`^(\+|-)?(([0-9]{1,32}(\.[0-9]{0,32})?)|(\.[0-9]{1,32}))(([KMGTPE]i)|[numkMGTPE]|([eE](\+|-)?[0-9]{1,2}))?$`
	PeakMemory *resource.Quantity `json:"peakMemory,omitempty"`
	// samples is how many NVML samples the newest run had.
	// +optional
	// +kubebuilder:validation:Minimum=0
	Samples int32 `json:"samples,omitempty"`
	// runs is how many runs were merged.
	// +optional
	// +kubebuilder:validation:Minimum=0
	Runs int32 `json:"runs,omitempty"`
	// productName is the GPU model of the newest run.
	// +optional
	// +kubebuilder:validation:MaxLength=128
	ProductName string `json:"productName,omitempty"`
	// share is what the newest run was given, when it ran on a share of a
	// GPU rather than a whole one.
	// +optional
	Share *GrantedShare `json:"share,omitempty"`
	// exceeded is set when the newest run used more than its share; the
	// next run gets a larger share or a whole GPU.
	// +optional
	Exceeded *ShareExceeded `json:"exceeded,omitempty"`
	// observedAt is when the newest run ended.
	// +optional
	ObservedAt *metav1.Time `json:"observedAt,omitempty"`
	// models is how long the workload's runs on whole GPUs kept each GPU
	// model busy, so that its runs on different models can be compared:
	// for a workload that does the same work each run, less busy time is
	// a faster model. Runs on a share or a MIG partition are left out.
	// +optional
	// +listType=map
	// +listMapKey=productName
	// +kubebuilder:validation:MaxItems=16
	Models []ModelUsage `json:"models,omitempty"`
}

// ModelUsage is the workload's GPU time per run on one GPU model.
type ModelUsage struct {
	// productName is the GPU model, as NVML names it.
	// +kubebuilder:validation:MinLength=1
	// +kubebuilder:validation:MaxLength=128
	ProductName string `json:"productName"`
	// runs is how many runs on whole GPUs of the model were merged.
	// +kubebuilder:validation:Minimum=1
	Runs int32 `json:"runs"`
	// busyMilliseconds is the time a kernel of the workload ran in a run,
	// summed over the run's GPUs: a mean in which the newest run counts one
	// half.
	// +kubebuilder:validation:Minimum=0
	BusyMilliseconds int64 `json:"busyMilliseconds"`
}

// GrantedShare is the share of one GPU a run was allocated: the status
// form of gpu.prism.dev's Share (NewGrantedShare), in the same range.
type GrantedShare struct {
	// computePercent is the cap on the GPU's SMs the run was held to,
	// where its claim asked for one (it may be above what the scheduler
	// counted), 0 to 100; 0, no cap, and 100 are both the whole GPU's
	// compute.
	// +optional
	// +kubebuilder:validation:Minimum=0
	// +kubebuilder:validation:Maximum=100
	ComputePercent int32 `json:"computePercent,omitempty"`
	// memory is the share of the GPU's memory, left out where the share
	// named no amount.
	// +optional
	// +kubebuilder:validation:XIntOrString
	// +kubebuilder:validation:Pattern=`^(\+|-)?(([0-9]{1,32}(\.[0-9]{0,32})?)|(\.[0-9]{1,32}))(([KMGTPE]i)|[numkMGTPE]|([eE](\+|-)?[0-9]{1,2}))?$`
	Memory *resource.Quantity `json:"memory,omitempty"`
}

// ShareResource names what a run exceeded.
// +kubebuilder:validation:Enum=Memory;Compute
type ShareResource string

const (
	// ShareResourceMemory: the run held more memory than its share.
	ShareResourceMemory ShareResource = "Memory"
	// ShareResourceCompute: the run's duty cycle stayed at its compute
	// limit.
	ShareResourceCompute ShareResource = "Compute"
)

// ShareExceeded records that a run outgrew its share.
type ShareExceeded struct {
	// resources lists what was exceeded.
	// +listType=set
	// +kubebuilder:validation:MaxItems=2
	Resources []ShareResource `json:"resources"`
	// message says by how much, for people.
	// +optional
	// +kubebuilder:validation:MaxLength=256
	Message string `json:"message,omitempty"`
}

// WorkloadProfile is the measured GPU behaviour of a workload, and the
// requirements its owner pins. The allocator reads it when it places the
// workload's ResourceClaims.
//
// +kubebuilder:object:root=true
// +kubebuilder:subresource:status
// +kubebuilder:resource:scope=Namespaced,shortName=wlp,categories=prism
// +kubebuilder:printcolumn:name="Bound",type=string,JSONPath=`.status.boundType`
// +kubebuilder:printcolumn:name="SM",type=string,JSONPath=`.status.smThroughput`,description="SM throughput, percent of peak"
// +kubebuilder:printcolumn:name="Memory",type=string,JSONPath=`.status.memoryThroughput`,description="Memory throughput, percent of peak"
// +kubebuilder:printcolumn:name="Occupancy",type=string,JSONPath=`.status.achievedOccupancy`,description="Achieved occupancy, percent"
// +kubebuilder:printcolumn:name="Age",type=date,JSONPath=`.metadata.creationTimestamp`
type WorkloadProfile struct {
	metav1.TypeMeta   `json:",inline"`
	metav1.ObjectMeta `json:"metadata,omitempty"`

	// +optional
	Spec WorkloadProfileSpec `json:"spec,omitempty"`
	// +optional
	Status WorkloadProfileStatus `json:"status,omitempty"`
}

// WorkloadProfileList is a list of WorkloadProfile.
//
// +kubebuilder:object:root=true
type WorkloadProfileList struct {
	metav1.TypeMeta `json:",inline"`
	metav1.ListMeta `json:"metadata,omitempty"`
	Items           []WorkloadProfile `json:"items"`
}

func init() {
	SchemeBuilder.Register(&WorkloadProfile{}, &WorkloadProfileList{})
}
