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

import (
	"cmp"
	"fmt"
	"maps"
	"slices"
	"strings"

	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	"k8s.io/apimachinery/pkg/util/validation/field"

	gpuv1alpha1 "github.com/prismgpu/prism/api/gpu/v1alpha1"
	prismv1alpha1 "github.com/prismgpu/prism/api/prism/v1alpha1"
)

// MIGDeviceClassName is the DeviceClass of MIG partitions, which the chart
// installs with the MIGPartitions gate. gpu.prism.dev and
// rewrite.gpu.prism.dev leave partitions out.
const MIGDeviceClassName = "mig." + gpuv1alpha1.DriverName

// PartitionTierPrefix starts the name of a subrequest that asks for a MIG
// partition: "mig-1g10gb" for 1g.10gb.
const PartitionTierPrefix = "mig-"

// PartitionVerdict is what the partition step decided for a claim: a MIG
// partition first, or why the claim keeps whole GPUs. Its String is the
// plan's partition.verdict.
type PartitionVerdict int

const (
	// PartitionSized: the claim's first choice is the smallest partition
	// the fleet publishes that holds the share its usage gives.
	PartitionSized PartitionVerdict = iota
	// PartitionNoUsage: the profile has no usage figures (see ShareNoUsage).
	PartitionNoUsage
	// PartitionNoPeakMemory: the duty cycle is known, the peak memory is
	// not; a partition's memory is fixed, so it is not guessed.
	PartitionNoPeakMemory
	// PartitionHeavy: the partition would have to hold 80 % of a GPU or
	// more (SizePartition).
	PartitionHeavy
	// PartitionOptedOut: the profile's spec.sharing is Exclusive (whole GPUs
	// only), or every request that could take one says so in its GpuConfig.
	PartitionOptedOut
	// PartitionNoneFits: no published partition smaller than the whole GPU
	// holds the share.
	PartitionNoneFits
	// PartitionNoEligibleRequest: no request asks for exactly one whole GPU
	// of gpu.prism.dev without selectors, capacity amounts or a GpuConfig.
	PartitionNoEligibleRequest
)

var partitionVerdicts = [...]string{"sized", "no-usage", "no-peak-memory", "heavy", "opted-out", "none-fits", "no-eligible-request"}

func (v PartitionVerdict) String() string {
	return verdictName(v, partitionVerdicts[:], "PartitionVerdict")
}

// PartitionVerdicts lists every verdict: the metric's label values.
func PartitionVerdicts() []PartitionVerdict {
	return allVerdicts[PartitionVerdict](len(partitionVerdicts))
}

// PartitionPlan is the partition step's part of a plan.
type PartitionPlan struct {
	// Verdict is a PartitionVerdict's String.
	Verdict string `json:"verdict"`
	// Profiles are the MIG profiles asked for, first choice first, for
	// "sized"; one per GPU model where the models' smallest fitting
	// profiles differ.
	Profiles []string `json:"profiles,omitempty"`
	// ComputePercent and MemoryBytes are what a partition had to hold
	// (SizePartition on the usage, memory at least the profile's
	// minMemory).
	ComputePercent int64 `json:"computePercent,omitempty"`
	MemoryBytes    int64 `json:"memoryBytes,omitempty"`
	// Usage is the measured use the decision came from (UsageSummary).
	Usage string `json:"usage,omitempty"`
	// Reason is how the figures chose the profiles, or why there is none.
	Reason string `json:"reason"`
	// Requests are those whose first choice is a partition.
	Requests []string `json:"requests,omitempty"`
	// Whole are the requests that keep whole GPUs although the profile
	// got a partition, and why.
	Whole []Untouched `json:"whole,omitempty"`
}

// PartitionsFromUsage lets Rewrite offer a request for one whole GPU a MIG
// partition first, where the fleet (WithFleet) publishes partitions: the
// smallest published profile whose memory and SMs hold what SizePartition
// gives the profile's usage. The whole-GPU ladder follows and ends in fits, so the pod
// is never less schedulable. A heavy job, or one without usage, gets no
// partition; where the fleet publishes no partition, the plan says
// nothing of them. See docs/mig.md, "How sizing works".
func PartitionsFromUsage() Option {
	return optionFunc(func(c *Cluster) { c.Partitions = true })
}

// migProfileNames are the MIG profiles the catalogue can select: NVIDIA's
// profiles below the whole GPU of the A30, A100, H100, H200 and B200, as
// Prism names them (pkg/gpu/nvml). Variants with or without media engines
// ("+me", "-me") are left out: a "+me" takes the GPU's one optical-flow
// accelerator, and a job sized from its usage has no need of it. A profile
// the fleet publishes but this list lacks is never asked for.
var migProfileNames = [...]string{
	// A30
	"1g.6gb", "2g.12gb", "4g.24gb",
	// A100 40GB
	"1g.5gb", "2g.10gb", "3g.20gb", "4g.20gb",
	// A100 80GB, H100 80GB (and 1g.10gb of the A100 40GB)
	"1g.10gb", "1g.20gb", "2g.20gb", "3g.40gb", "4g.40gb",
	// H100 NVL 94GB, GH200 96GB
	"1g.12gb", "1g.24gb", "2g.24gb", "3g.47gb", "4g.47gb", "3g.48gb", "4g.48gb",
	// H200 141GB, GH200 144GB
	"1g.18gb", "1g.35gb", "2g.35gb", "3g.71gb", "4g.71gb", "1g.36gb", "2g.36gb", "3g.72gb", "4g.72gb",
	// B200
	"1g.23gb", "1g.45gb", "2g.45gb", "3g.90gb", "4g.90gb",
}

func migProfileIs(name string) string {
	return fmt.Sprintf(`%[1]q in %[2]s && %[2]s.%[1]s == %[3]q`, gpuv1alpha1.MIGProfileAttribute, attrs, name)
}

func migProfileExpressions() []string {
	out := make([]string, len(migProfileNames))
	for i, n := range migProfileNames {
		out[i] = migProfileIs(n)
	}
	return out
}

// migProfileSelector is the catalogue entry for a profile name.
func migProfileSelector(name string) (selectorID, bool) {
	i := slices.Index(migProfileNames[:], name)
	if i < 0 {
		return -1, false
	}
	return selMIGFirst + selectorID(i), true
}

// PartitionNeed is what a MIG partition must hold for a profile's usage
// (SizePartition).
type PartitionNeed struct {
	// Verdict is PartitionSized, PartitionNoUsage, PartitionNoPeakMemory or
	// PartitionHeavy.
	Verdict PartitionVerdict
	// ComputePercent and MemoryBytes are what the partition must hold: a
	// share of the parent GPU's SMs and bytes of memory.
	ComputePercent, MemoryBytes int64
	// Reason says which figures gave them, or why there is no partition.
	Reason string
}

// KernelShape is how much of a GPU a workload's kernels fill while they
// run, as Nsight Compute measured them (WorkloadProfile status): the waves
// of thread blocks per SM on the GPU profiled, below 1 where the grid
// leaves SMs idle, and the DRAM throughput in thousandths of a per cent
// of peak. Both are means weighted by kernel duration; nil where ncu did
// not measure them.
type KernelShape struct {
	WavesPerSM                 *resource.Quantity
	DRAMThroughputMilliPercent *int32
}

// kernelFill is what a KernelShape says of a GPU's share the kernels
// fill while they run.
type kernelFill struct {
	waves float64
	// sm is the share of the SMs the grid fills (waves per SM, at most 1),
	// dram the DRAM throughput (0 where not measured), both in thousandths
	// of a per cent.
	sm, dram int64
}

// fill reads k; ok is false without the grid, or with a figure no ncu
// reports. The CRD's quantity pattern bounds the waves' digits and
// exponent, so reading it as a float is cheap.
func (k KernelShape) fill() (f kernelFill, ok bool) {
	if k.WavesPerSM == nil {
		return f, false
	}
	f.waves = k.WavesPerSM.AsApproximateFloat64()
	if !(f.waves >= 0) {
		return f, false
	}
	f.sm = int64(min(f.waves, 1)*100000 + 0.5)
	if k.DRAMThroughputMilliPercent != nil {
		f.dram = clampMilliPercent(*k.DRAMThroughputMilliPercent)
	}
	return f, true
}

// SizePartition is what a MIG partition must hold for a WorkloadProfile's
// status.usage and the kernel shape ncu measured. It is the one place the
// rule lives: the admission webhook and prismctl simulate's MIG evaluation
// both call it.
//
// A partition's SMs and memory bandwidth are its own, and it cannot burst,
// so its compute is what the job keeps busy, where that was measured: the
// larger of its SM activity and its DRAM bandwidth use (GPM, on Hopper and
// later; the profile keeps their means), each plus the share's limit
// headroom for what the mean leaves out. Busy
// small-batch inference, whose kernels run most of the time on a few SMs,
// reads a high duty cycle and a low SM activity, and gets a small slice.
// Where GPM measured nothing but ncu measured the kernels' grid (an A100,
// the other MIG GPU, has no GPM), the same activity is estimated: the
// share of the GPU the kernels fill while they run (the larger of the SMs
// their grid fills and their DRAM throughput) times the p95 duty cycle,
// plus the headroom. Where neither was measured, the compute is the
// share's limit, from the p95 duty cycle, which says how often a kernel
// runs, not how many SMs it fills; such jobs mostly keep whole GPUs.
// Memory is the share's, from the peak. A compute of HeavyComputePercent
// or more keeps a whole GPU.
func SizePartition(u *prismv1alpha1.UsageProfile, k KernelShape) PartitionNeed {
	return sizePartition(u, SizeShare(u), k)
}

// sizePartition is SizePartition for the share SizeShare gave u.
func sizePartition(u *prismv1alpha1.UsageProfile, size ShareSize, k KernelShape) PartitionNeed {
	kernels, shaped := k.fill()
	switch {
	case size.Verdict == ShareNoUsage:
		return PartitionNeed{Verdict: PartitionNoUsage, Reason: size.Reason}
	case size.Verdict == ShareNoPeakMemory:
		return PartitionNeed{Verdict: PartitionNoPeakMemory, Reason: size.Reason}
	case size.Share.MemoryBytes == 0 && u.SMActivityMilliPercent == nil && !shaped:
		return PartitionNeed{Verdict: PartitionHeavy, Reason: size.Reason}
	case size.Share.MemoryBytes == 0:
		// Heavy by its duty cycle, a job may not be by its SMs, but a
		// partition's memory is fixed.
		return PartitionNeed{Verdict: PartitionNoPeakMemory, Reason: "no peak memory measured: a partition's memory is fixed, so it is not guessed"}
	}
	need := PartitionNeed{Verdict: PartitionSized, MemoryBytes: size.Share.MemoryBytes}
	memoryWhy := fmt.Sprintf("memory %s from a peak of %s", bytesText(size.Share.MemoryBytes), peakText(u))
	headroom := DefaultShareRule.PeakHeadroom
	switch {
	case u.SMActivityMilliPercent != nil:
		sm := clampMilliPercent(*u.SMActivityMilliPercent)
		need.ComputePercent = headroom.add(sm)
		why := fmt.Sprintf("compute %d%% from an SM activity of %s", need.ComputePercent, milliPercent(sm))
		if u.DRAMActivityMilliPercent != nil {
			dram := clampMilliPercent(*u.DRAMActivityMilliPercent)
			if c := headroom.add(dram); c > need.ComputePercent {
				need.ComputePercent = c
				why = fmt.Sprintf("compute %d%% from a DRAM bandwidth use of %s (SM activity %s)", c, milliPercent(dram), milliPercent(sm))
			} else {
				why += fmt.Sprintf(" (DRAM bandwidth use %s)", milliPercent(dram))
			}
		}
		need.Reason = why + "; " + memoryWhy
	case shaped:
		width := max(kernels.sm, kernels.dram)
		p95 := clampMilliPercent(*u.DutyCycleP95MilliPercent)
		need.ComputePercent = headroom.add(width * p95 / 100000)
		fills := fmt.Sprintf("a grid of %.2f waves per SM", kernels.waves)
		if k.DRAMThroughputMilliPercent != nil {
			fills += fmt.Sprintf(" and a DRAM throughput of %s", milliPercent(kernels.dram))
		}
		need.Reason = fmt.Sprintf("compute %d%% from kernels that fill %s of the GPU while they run (ncu: %s) for a p95 duty cycle of %s (no SM activity measured, which Hopper and later GPUs report); %s",
			need.ComputePercent, milliPercent(width), fills, milliPercent(p95), memoryWhy)
	default:
		need.ComputePercent = int64(size.Peak().ComputePercent)
		need.Reason = fmt.Sprintf("compute %d%% from a p95 duty cycle of %s (no SM activity measured, which Hopper and later GPUs report); %s",
			need.ComputePercent, milliPercent(clampMilliPercent(*u.DutyCycleP95MilliPercent)), memoryWhy)
	}
	if slices.Contains(size.Raised, prismv1alpha1.ShareResourceMemory) {
		need.Reason += "; memory at least twice what the last run outgrew"
	}
	if need.ComputePercent >= HeavyComputePercent {
		need.Verdict = PartitionHeavy
		need.Reason += fmt.Sprintf("; %d%% or more of a GPU keeps a whole one", HeavyComputePercent)
	}
	return need
}

// peakText is the measured peak memory for a reason; SizePartition calls
// it only where SizeShare found one.
func peakText(u *prismv1alpha1.UsageProfile) string {
	peak, _ := quantityBytes(u.PeakMemory, "peakMemory")
	return bytesText(peak)
}

// partitionStep decides the partitions the profile gets, if the caller
// offers them: the tiers (one per distinct profile, smallest first), or
// none and why not in the plan (SizePartition). size is the profile's
// usage sized by SizeShare.
func (c Cluster) partitionStep(p Profile, size ShareSize) ([]tier, *PartitionPlan) {
	if !c.Partitions {
		return nil, nil
	}
	if !c.FleetKnown || c.Fleet == nil || len(c.Fleet.Partitions) == 0 {
		return nil, nil // nothing to say where no GPU publishes partitions
	}
	plan := &PartitionPlan{Usage: UsageSummary(p.Usage)}
	if p.Exclusive {
		plan.Verdict, plan.Reason = PartitionOptedOut.String(), "the profile's spec.sharing is "+string(prismv1alpha1.SharingExclusive)+": whole GPUs only"
		return nil, plan
	}
	need := sizePartition(p.Usage, size, p.Kernels)
	if need.Verdict != PartitionSized {
		plan.Verdict, plan.Reason = need.Verdict.String(), need.Reason
		return nil, plan
	}
	memory := need.MemoryBytes
	why := need.Reason
	if p.MinMemory != nil {
		// needs() has bounded it already, where a bound type asked for it;
		// a profile without one is bounded here.
		if v, err := prismv1alpha1.BoundedValue(field.NewPath("minMemory"), *p.MinMemory, prismv1alpha1.MaxDeviceMemory); err == nil && v > memory {
			memory = v
			why += "; memory at least the profile's minMemory " + bytesText(v)
		}
	}
	plan.ComputePercent, plan.MemoryBytes = need.ComputePercent, memory
	names, fits := c.Fleet.SmallestPartitions(need.ComputePercent, memory)
	if len(names) == 0 {
		plan.Verdict, plan.Reason = PartitionNoneFits.String(), why+"; but "+fits
		return nil, plan
	}
	plan.Verdict, plan.Profiles, plan.Reason = PartitionSized.String(), names, why+"; "+fits
	tiers := make([]tier, len(names))
	for i, n := range names {
		id, _ := migProfileSelector(n)
		tiers[i] = tier{name: PartitionTierPrefix + profileToken(n), selectors: []selectorID{id}, partition: n,
			reason: fmt.Sprintf("MIG partition %s, the smallest published that holds %d%% compute and %s memory", n, need.ComputePercent, bytesText(memory))}
	}
	return tiers, plan
}

// profileToken spells a profile name as a subrequest name: "1g.10gb" is
// "1g10gb" (pkg/gpu names partition devices the same way).
func profileToken(name string) string {
	return strings.ReplaceAll(name, ".", "")
}

// SmallestPartitions returns, for each GPU model that publishes partitions,
// the smallest profile below the whole GPU that the catalogue can select,
// whose memory is at least memory bytes and whose SMs are at least
// computePercent of the parent's; the distinct names, smallest first. A
// name qualifies only if it does so on every model that publishes it, so
// that a selector on the name alone is honest in a mixed fleet. The string
// says which profiles were chosen, or why none was.
//
// It is the partition step's choice, exported so that prismctl simulate's
// MIG sizing asks the same question of a fleet of one model instead of
// keeping a rule of its own.
func (f *Fleet) SmallestPartitions(computePercent, memory int64) ([]string, string) {
	byName := map[string][]PartitionModel{}
	byModel := map[string][]PartitionModel{}
	for _, p := range f.Partitions {
		byName[p.Profile] = append(byName[p.Profile], p)
		byModel[p.Model] = append(byModel[p.Model], p)
	}
	parentSMs := func(model string) int64 {
		for _, m := range f.Models {
			if m.Name == model && m.Multiprocessors > 0 {
				return m.Multiprocessors
			}
		}
		var most int64
		for _, p := range byModel[model] {
			most = max(most, p.Multiprocessors)
		}
		return most
	}
	// whole says whether p is its model's largest profile, the whole GPU
	// as a partition: it offers no more than the whole GPU tier after it.
	whole := func(p PartitionModel) bool {
		for _, q := range byModel[p.Model] {
			if q.Multiprocessors > p.Multiprocessors || q.Multiprocessors == p.Multiprocessors && q.MemoryBytes > p.MemoryBytes {
				return false
			}
		}
		return true
	}
	holds := func(p PartitionModel) bool {
		parent := parentSMs(p.Model)
		return !whole(p) && p.MemoryBytes >= memory && parent > 0 && p.Multiprocessors*100 >= computePercent*parent
	}
	qualifies := func(name string) bool {
		if _, ok := migProfileSelector(name); !ok {
			return false
		}
		return !slices.ContainsFunc(byName[name], func(p PartitionModel) bool { return !holds(p) })
	}
	order := func(a, b PartitionModel) int {
		return cmp.Or(cmp.Compare(a.MemoryBytes, b.MemoryBytes), cmp.Compare(a.Multiprocessors, b.Multiprocessors), strings.Compare(a.Profile, b.Profile))
	}
	var chosen []PartitionModel
	var models []string
	for _, model := range slices.Sorted(maps.Keys(byModel)) {
		ps := slices.Clone(byModel[model])
		slices.SortFunc(ps, order)
		for _, p := range ps {
			if qualifies(p.Profile) {
				if !slices.ContainsFunc(chosen, func(c PartitionModel) bool { return c.Profile == p.Profile }) {
					chosen = append(chosen, p)
				}
				models = append(models, fmt.Sprintf("%s on %s (%d of %d SMs, %s)", p.Profile, model, p.Multiprocessors, parentSMs(model), bytesText(p.MemoryBytes)))
				break
			}
		}
	}
	if len(chosen) == 0 {
		return nil, fmt.Sprintf("no published MIG profile below the whole GPU has %s of memory and %d%% of its GPU's SMs", bytesText(memory), computePercent)
	}
	slices.SortFunc(chosen, order)
	names := make([]string, len(chosen))
	for i, c := range chosen {
		names[i] = c.Profile
	}
	return names, "smallest fitting: " + strings.Join(models, ", ")
}

// partitionIneligible says why a request keeps whole GPUs although the
// profile got a partition, or "", and whether that is the user's choice.
// Only a request for one GPU, as plain as the tier can copy safely, gets
// one: the user's selectors were written for whole GPUs and may read
// attributes a partition lacks (a CEL error stops the pod's scheduling on
// every node), capacity amounts name whole-GPU capacities, and a GpuConfig
// may set sharing, which the plugin refuses on a partition at prepare.
func (s sharingChoices) partitionIneligible(spec *resourceapi.ResourceClaimSpec, e *resourceapi.ExactDeviceRequest, request string) (why string, optedOut bool) {
	switch {
	case e.AllocationMode != "" && e.AllocationMode != resourceapi.DeviceAllocationModeExactCount || e.Count > 1:
		return "asks for more than one GPU; a partition is a part of one", false
	case len(e.Selectors) > 0:
		return "has its own selectors, written for whole GPUs", false
	case e.Capacity != nil && len(e.Capacity.Requests) > 0:
		return "names its own capacity amounts, which are kept", false
	case s.exclusive[request]:
		return "its GpuConfig sets sharing.strategy " + string(gpuv1alpha1.ExclusiveSharing), true
	case configured(spec, request):
		return "a " + gpuv1alpha1.DriverName + " config applies to it, and the plugin refuses sharing settings on a partition", false
	}
	return "", false
}

// configured says whether an opaque config of the driver applies to request.
func configured(spec *resourceapi.ResourceClaimSpec, request string) bool {
	for _, c := range spec.Devices.Config {
		if c.Opaque == nil || c.Opaque.Driver != gpuv1alpha1.DriverName {
			continue
		}
		if len(c.Requests) == 0 || slices.Contains(c.Requests, request) {
			return true
		}
	}
	return false
}
