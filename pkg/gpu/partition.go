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

package gpu

import (
	"context"
	"fmt"
	"strings"

	"github.com/go-logr/logr"
	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	"k8s.io/apimachinery/pkg/util/validation"
	"k8s.io/dynamic-resource-allocation/deviceattribute"
	"k8s.io/klog/v2"

	gpuv1alpha1 "github.com/prismgpu/prism/api/gpu/v1alpha1"
)

// MIG is what NVML says a GPU in MIG mode can be cut into: its GPU-instance
// profiles, each with the placements an instance of it may take. Prism
// publishes every placement as a device that could be created; it does not
// read which instances exist.
type MIG struct {
	Profiles []MIGProfile
}

// MIGProfile is one GPU-instance profile as nvmlDeviceGetGpuInstanceProfileInfo
// reports it.
type MIGProfile struct {
	// Index is the NVML_GPU_INSTANCE_PROFILE_* value the profile was read
	// with, which creating an instance of it needs.
	Index int
	// ID is NVML's id of the profile, the "ID" column of nvidia-smi mig -lgip.
	ID int
	// Name is NVIDIA's spelling, e.g. "1g.10gb" or "1g.10gb+me".
	Name string
	// SliceCount is the number of compute slices ("1g" is one).
	SliceCount          int
	InstanceCount       int
	MultiprocessorCount int
	MemoryMiB           uint64
	CopyEngines         int
	Decoders            int
	Encoders            int
	JPEGDecoders        int
	OFAs                int
	Placements          []MIGPlacement
}

// MIGPlacement is where an instance may sit, in memory slices: it occupies
// slices Start to Start+Size-1. NVML refuses to create an instance whose
// slices overlap an existing one, which is what the published counters
// mirror.
type MIGPlacement struct {
	Start, Size int
}

// Partition is one placement of one profile on one GPU: a device the
// scheduler may allocate and prepare would create.
type Partition struct {
	Parent    Device
	Profile   MIGProfile
	Placement MIGPlacement
}

// Name is the device name within the ResourceSlice, e.g.
// "gpu-0-mig-1g10gb-3" for a 1g.10gb instance at memory slice 3. It only
// depends on the parent's index, the profile and the placement, so a claim
// allocated before a restart still names the same partition after it.
func (p Partition) Name() string {
	return fmt.Sprintf("%s-mig-%s-%d", p.Parent.Name(), profileToken(p.Profile.Name), p.Placement.Start)
}

// profileToken spells a profile name as a DNS label fragment: "1g.10gb+me"
// is "1g10gb-me", and NVIDIA's "-me" (no media engines) is "-nome" so that
// it cannot collide with "+me".
func profileToken(name string) string {
	name = strings.ToLower(name)
	name = strings.ReplaceAll(name, "-me", "-nome")
	name = strings.ReplaceAll(name, ".", "")
	return strings.ReplaceAll(name, "+", "-")
}

// MIGNote says why a MIG-capable GPU is published whole, or is empty. The
// mode is the operator's to set (it needs a GPU reset, and on some boards a
// reboot), so Prism reports it and never changes it; the plugin turns the
// note into a log line and an Event.
func (d Device) MIGNote() string {
	if !d.MIGCapable || d.MIG != nil {
		return ""
	}
	return fmt.Sprintf("%s (%s, %s) supports MIG but MIG mode is not enabled, so it is published as a whole GPU without partitions; "+
		"to publish its partitions, enable MIG mode (nvidia-smi -i %d -mig 1) while no process uses the GPU. Prism never changes the MIG mode.",
		d.Name(), d.ProductName, d.UUID, d.Index)
}

// MemorySlices is how many memory slices the GPU's placements are counted
// in (8 on A100 and H100): the end of the furthest placement NVML reports.
func (d Device) MemorySlices() int {
	n := 0
	if d.MIG == nil {
		return 0
	}
	for _, p := range d.MIG.Profiles {
		for _, pl := range p.Placements {
			n = max(n, pl.Start+pl.Size)
		}
	}
	return n
}

// Partitions lists one Partition per profile and placement, in the order
// NVML listed the profiles and placements.
func (d Device) Partitions() []Partition {
	if d.MIG == nil {
		return nil
	}
	var out []Partition
	for _, p := range d.MIG.Profiles {
		for _, pl := range p.Placements {
			out = append(out, Partition{Parent: d, Profile: p, Placement: pl})
		}
	}
	return out
}

// The counters of a GPU's counter set. Each memory slice is a counter of
// its own with the value 1, so that two partitions whose placements
// overlap can never both be allocated: that alone is NVML's placement rule.
// The engines a profile takes are counted too, because placements do not
// capture them: a GPU has one optical-flow accelerator, so only one "+me"
// instance fits however its placements fall. Multiprocessors are counted
// because the whole-GPU device must consume everything and because a
// reader of the slice sees at a glance what a partition takes; they never
// bind before the memory slices do on the GPUs NVIDIA ships.
const (
	memorySliceCounterPrefix = gpuv1alpha1.MemorySliceCounterPrefix
	multiprocessorsCounter   = "multiprocessors"
	copyEnginesCounter       = "copy-engines"
	decodersCounter          = "decoders"
	encodersCounter          = "encoders"
	jpegDecodersCounter      = "jpeg-decoders"
	ofaCounter               = "optical-flow-accelerators"
)

// CounterSetName is the name of the GPU's counter set: the device name,
// unique in the pool as the API requires.
func (d Device) CounterSetName() string {
	return d.Name()
}

// counters is what a profile takes, or, for the whole GPU, what there is.
type counters map[string]int64

func profileCounters(p MIGProfile, pl MIGPlacement) counters {
	c := counters{
		multiprocessorsCounter: int64(p.MultiprocessorCount),
		copyEnginesCounter:     int64(p.CopyEngines),
		decodersCounter:        int64(p.Decoders),
		encodersCounter:        int64(p.Encoders),
		jpegDecodersCounter:    int64(p.JPEGDecoders),
		ofaCounter:             int64(p.OFAs),
	}
	for s := pl.Start; s < pl.Start+pl.Size; s++ {
		c[fmt.Sprintf("%s%d", memorySliceCounterPrefix, s)] = 1
	}
	return c
}

// totalCounters is what the GPU has: every memory slice, and of each engine
// the most any one profile takes, which is the full-GPU profile's share
// (7g.40gb has all five decoders of an A100). Counters the GPU has none of
// are left out.
func (d Device) totalCounters() counters {
	total := counters{}
	for s := range d.MemorySlices() {
		total[fmt.Sprintf("%s%d", memorySliceCounterPrefix, s)] = 1
	}
	for _, p := range d.MIG.Profiles {
		for name, v := range profileCounters(p, MIGPlacement{}) {
			total[name] = max(total[name], v)
		}
	}
	for name, v := range total {
		if v == 0 {
			delete(total, name)
		}
	}
	return total
}

func (c counters) api(keep counters) map[string]resourceapi.Counter {
	out := make(map[string]resourceapi.Counter, len(c))
	for name, v := range c {
		if _, ok := keep[name]; ok && v > 0 {
			out[name] = resourceapi.Counter{Value: *resource.NewQuantity(v, resource.DecimalSI)}
		}
	}
	return out
}

// CounterSet is the GPU's shared counters; ok is false for a GPU not in
// MIG mode.
func (d Device) CounterSet() (set resourceapi.CounterSet, ok bool) {
	if d.MIG == nil || len(d.MIG.Profiles) == 0 {
		return resourceapi.CounterSet{}, false
	}
	total := d.totalCounters()
	return resourceapi.CounterSet{Name: d.CounterSetName(), Counters: total.api(total)}, true
}

// MIGDevices builds the devices of a GPU in MIG mode: whole is the GPU as
// ResourceDevice publishes it but consuming all of its counters, so that a
// claim for the whole GPU and a claim for a partition of it can never both
// be allocated; partitions are its placements of the profiles opts
// publishes (PublishOptions.MIGProfiles). The whole GPU is never shareable
// here: MPS shares do not mix with partitions.
func (d Device) MIGDevices(ctx context.Context, opts PublishOptions) (whole resourceapi.Device, partitions []resourceapi.Device, err error) {
	set, ok := d.CounterSet()
	if !ok {
		return resourceapi.Device{}, nil, fmt.Errorf("building partitions of %s: the GPU is not in MIG mode or NVML listed no profiles", d.Name())
	}
	total := d.totalCounters()
	opts.ShareMemory = false
	whole, err = d.ResourceDevice(ctx, opts)
	if err != nil {
		return resourceapi.Device{}, nil, err
	}
	whole.ConsumesCounters = []resourceapi.DeviceCounterConsumption{{CounterSet: set.Name, Counters: set.Counters}}
	seen := map[string]bool{whole.Name: true}
	for _, p := range d.Partitions() {
		if !opts.publishesProfile(p.Profile.Name) {
			continue
		}
		rd, err := p.resourceDevice(ctx, opts, total)
		if err != nil {
			return resourceapi.Device{}, nil, err
		}
		if seen[rd.Name] {
			return resourceapi.Device{}, nil, fmt.Errorf("building partitions of %s: two partitions are both named %s", d.Name(), rd.Name)
		}
		seen[rd.Name] = true
		partitions = append(partitions, rd)
	}
	return whole, partitions, nil
}

// Figures returns the partition as a Device whose figures are its share of
// the parent's, which is how its attributes are derived:
//   - multiprocessorCount is the profile's SM count, and fp32GFLOPS follows
//     from it at the parent's clock, i.e. the parent's FLOPS scaled by SM
//     count (a 1g.10gb of an A100 has 14 of 108 SMs, so 13% of its FLOPS);
//   - memoryBandwidthGBps scales the memory bus width by the memory slices
//     the placement occupies: each slice owns its share of the memory
//     controllers and L2, so a 1g.10gb (one slice of eight) gets an eighth
//     of the bandwidth and a 1g.20gb two eighths. It is the bandwidth the
//     partition can reach, not what it gets under load.
func (p Partition) Figures() Device {
	f := p.Parent
	f.MultiprocessorCount = p.Profile.MultiprocessorCount
	if slices := p.Parent.MemorySlices(); slices > 0 {
		f.MemoryBusWidthBits = p.Parent.MemoryBusWidthBits * p.Placement.Size / slices
	}
	f.MemoryBytes = p.Profile.MemoryMiB << 20
	return f
}

// fp16TensorTFLOPS scales the datasheet figure of the parent by SM count,
// as fp32GFLOPS is.
func (p Partition) fp16TensorTFLOPS() (int, bool) {
	whole, ok := p.Parent.FP16TensorTFLOPS()
	if !ok || p.Parent.MultiprocessorCount == 0 {
		return 0, false
	}
	return whole * p.Profile.MultiprocessorCount / p.Parent.MultiprocessorCount, true
}

func (p Partition) resourceDevice(ctx context.Context, opts PublishOptions, total counters) (resourceapi.Device, error) {
	name := p.Name()
	logger := klog.FromContext(ctx).WithValues("device", name)
	if errs := validation.IsDNS1123Label(name); len(errs) > 0 {
		return resourceapi.Device{}, fmt.Errorf("building partition %s: profile %q does not make a valid device name: %s", name, p.Profile.Name, strings.Join(errs, "; "))
	}
	if p.Parent.UUID == "" {
		return resourceapi.Device{}, fmt.Errorf("building partition %s: parent UUID is empty", name)
	}
	f := p.Figures()

	// Order is priority, as in ResourceDevice. A partition has no uuid or
	// minor of its own until prepare creates it, so it carries its
	// parent's uuid under another name and its parent's index, and the
	// figures a selector compares are its own share.
	// The parent's own device reports a version that does not parse.
	attrs := attributeList{logger: logr.Discard()}
	attrs.str(gpuv1alpha1.MIGProfileAttribute, p.Profile.Name)
	attrs.str(gpuv1alpha1.ParentUUIDAttribute, p.Parent.UUID)
	attrs.str(gpuv1alpha1.ProductNameAttribute, p.Parent.ProductName)
	attrs.integer(gpuv1alpha1.IndexAttribute, p.Parent.Index)
	fp16, ok := p.fp16TensorTFLOPS()
	attrs.figures(f, fp16, ok)
	attrs.str(gpuv1alpha1.BrandAttribute, p.Parent.Brand)
	// pcieRoot lets a claim align a partition with a NIC as it can a whole
	// GPU; pciBusID is left out, since it names the parent, not this device.
	if p.Parent.PCIBusID != "" && opts.SysFS != nil {
		a, err := deviceattribute.GetPCIeRootAttributeByPCIBusID(p.Parent.PCIBusID, deviceattribute.WithFS(opts.SysFS))
		if err != nil {
			logger.V(4).Info("Dropping device attribute", "attribute", deviceattribute.StandardDeviceAttributePCIeRoot, "reason", err.Error())
		} else {
			attrs.add(a.Name, a.Value)
		}
	}

	capacity := map[resourceapi.QualifiedName]resourceapi.DeviceCapacity{}
	if f.MemoryBytes > 0 {
		capacity[gpuv1alpha1.MemoryCapacity.Qualified()] = resourceapi.DeviceCapacity{Value: *resource.NewQuantity(int64(f.MemoryBytes), resource.BinarySI)}
	}
	return resourceapi.Device{
		Name:       name,
		Attributes: enforceLimits(logger, attrs.attrs, len(capacity)),
		Capacity:   capacity,
		ConsumesCounters: []resourceapi.DeviceCounterConsumption{{
			CounterSet: p.Parent.CounterSetName(),
			Counters:   profileCounters(p.Profile, p.Placement).api(total),
		}},
	}, nil
}
