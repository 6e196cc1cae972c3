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
	"io/fs"
	"regexp"
	"slices"
	"strconv"
	"strings"

	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	"k8s.io/dynamic-resource-allocation/deviceattribute"
	"k8s.io/klog/v2"
	"k8s.io/utils/ptr"

	gpuv1alpha1 "github.com/prismgpu/prism/api/gpu/v1alpha1"
)

// PublishOptions says where host facts that NVML does not know come from.
type PublishOptions struct {
	// SysFS is the root of a sysfs tree, used to resolve the PCIe root
	// complex of each GPU. os.DirFS("/sys") works on a real host; a
	// simulated node supplies a fake tree. When nil, pcieRoot is not
	// published.
	SysFS fs.ReadLinkFS
	// ShareMemory publishes each GPU as shareable: several claims may each
	// consume a slice of its memory and compute capacities, and the
	// scheduler never hands out more than the GPU has of either.
	ShareMemory bool
	// FiguresAsCapacity also publishes memoryBandwidthGBps, fp32GFLOPS and
	// smVersion (the compute capability as nvcc's sm_XY number) as
	// capacities of GPUs that are not shareable, so that a claim can ask
	// for "at least" a figure with a capacity request, which the allocator
	// checks without a CEL evaluation (the controller's tier bounds). On a
	// shareable GPU a capacity is consumed, not compared, so they are not
	// published there. Each entry adds to what every CEL evaluation of the
	// device builds, so it is off unless the controller uses it.
	FiguresAsCapacity bool
	// MIGProfiles, when not empty, are the only MIG profiles whose
	// placements are published as partitions, by NVIDIA's names such as
	// "1g.10gb"; a GPU in MIG mode is still published whole, with its
	// counter set. The scheduler's allocator reads every device of a node
	// on every claim it tries there, asked for or not, so an operator who
	// uses a few profiles can stop paying for the rest (docs/mig.md,
	// "What partitions cost the scheduler"). A claim can then allocate only
	// the profiles listed. Empty publishes every profile NVML lists.
	MIGProfiles []string
}

// publishesProfile says whether the placements of the MIG profile are
// published as partitions.
func (o PublishOptions) publishesProfile(name string) bool {
	return len(o.MIGProfiles) == 0 || slices.Contains(o.MIGProfiles, name)
}

// MemoryShareStep is the granularity of memory shares; requests are rounded
// up to it, which keeps the scheduler's arithmetic on round numbers.
var MemoryShareStep = resource.MustParse("1Gi")

// ComputeShareStep is the granularity of compute shares, in per cent of
// the GPU's SMs, and the smallest share that reserves any: MPS's active
// thread percentage is coarse below that, and twenty neighbours on one GPU
// is already more than time-slicing between them can serve.
var ComputeShareStep = resource.MustParse("5")

// computeWhole is the compute capacity of a GPU, 100 per cent, and
// computeNone what a claim that names no compute reserves.
var (
	computeWhole = resource.MustParse("100")
	computeNone  = resource.MustParse("0")
)

// ResourceDevice builds the device as it is published in a ResourceSlice.
// Values that would break API validation are truncated or dropped and the
// reason is logged, because one odd GPU must not stop the whole node from
// publishing.
func (d Device) ResourceDevice(ctx context.Context, opts PublishOptions) (resourceapi.Device, error) {
	logger := klog.FromContext(ctx).WithValues("device", d.Name())
	if d.UUID == "" {
		return resourceapi.Device{}, fmt.Errorf("building device %s: UUID is empty", d.Name())
	}

	// Order is priority: if the API limit on attributes is ever reached,
	// the ones at the end are dropped first.
	attrs := attributeList{logger: logger}
	attrs.str(gpuv1alpha1.UUIDAttribute, d.UUID)
	attrs.str(gpuv1alpha1.ProductNameAttribute, d.ProductName)
	attrs.integer(gpuv1alpha1.IndexAttribute, d.Index)
	attrs.integer(gpuv1alpha1.MinorAttribute, d.Minor)
	fp16, ok := d.FP16TensorTFLOPS()
	attrs.figures(d, fp16, ok)
	attrs.add(gpuv1alpha1.MIGCapableAttribute.Qualified(), resourceapi.DeviceAttribute{BoolValue: ptr.To(d.MIGCapable)})
	attrs.str(gpuv1alpha1.BrandAttribute, d.Brand)
	if d.PCIeGeneration > 0 {
		attrs.integer(gpuv1alpha1.PCIeGenerationAttribute, d.PCIeGeneration)
	}
	if d.PCIeLinkWidth > 0 {
		attrs.integer(gpuv1alpha1.PCIeLinkWidthAttribute, d.PCIeLinkWidth)
	}
	if d.PCIBusID != "" {
		a, err := deviceattribute.GetPCIBusIDAttribute(d.PCIBusID)
		if err != nil {
			logger.Info("Dropping device attribute", "attribute", deviceattribute.StandardDeviceAttributePCIBusID, "reason", err.Error())
		} else {
			attrs.add(a.Name, a.Value)
		}
		if opts.SysFS != nil {
			a, err := deviceattribute.GetPCIeRootAttributeByPCIBusID(d.PCIBusID, deviceattribute.WithFS(opts.SysFS))
			if err != nil {
				logger.Info("Dropping device attribute", "attribute", deviceattribute.StandardDeviceAttributePCIeRoot, "reason", err.Error())
			} else {
				attrs.add(a.Name, a.Value)
			}
		}
	}

	// Zero memory means unknown; publishing it would make the GPU match
	// nothing that asks for memory, which is worse than not saying.
	capacity := map[resourceapi.QualifiedName]resourceapi.DeviceCapacity{}
	var shareable *bool
	if d.MemoryBytes > 0 {
		memory := resourceapi.DeviceCapacity{Value: *resource.NewQuantity(int64(d.MemoryBytes), resource.BinarySI)}
		if opts.ShareMemory {
			step := MemoryShareStep.Value()
			// A claim that names no amount takes the whole GPU, rounded down
			// to the step because the default must itself be a valid request.
			whole := resource.NewQuantity(int64(d.MemoryBytes)/step*step, resource.BinarySI)
			memory.RequestPolicy = &resourceapi.CapacityRequestPolicy{
				Default:    whole,
				ValidRange: &resourceapi.CapacityRequestPolicyRange{Min: &MemoryShareStep, Step: &MemoryShareStep},
			}
			shareable = ptr.To(true)
			attrs.add(gpuv1alpha1.ComputeLimitsAttribute.Qualified(), resourceapi.DeviceAttribute{BoolValue: ptr.To(true)})
			// A claim that names no compute reserves none. A claim
			// written for a whole GPU still gets one, because it takes all
			// the memory; and a claim that names only memory shares the
			// GPU's time with its neighbours, as it did before compute was
			// published. A profile-sized share names both.
			capacity[gpuv1alpha1.ComputeCapacity.Qualified()] = resourceapi.DeviceCapacity{
				Value: computeWhole,
				RequestPolicy: &resourceapi.CapacityRequestPolicy{
					Default:    &computeNone,
					ValidRange: &resourceapi.CapacityRequestPolicyRange{Min: &computeNone, Max: &computeWhole, Step: &ComputeShareStep},
				},
			}
		}
		capacity[gpuv1alpha1.MemoryCapacity.Qualified()] = memory
	}
	if opts.FiguresAsCapacity && shareable == nil {
		if bw := d.MemoryBandwidthGBps(); bw > 0 {
			capacity[gpuv1alpha1.MemoryBandwidthGBpsCapacity.Qualified()] = resourceapi.DeviceCapacity{Value: *resource.NewQuantity(int64(bw), resource.DecimalSI)}
		}
		if f := d.FP32GFLOPS(); f > 0 {
			capacity[gpuv1alpha1.FP32GFLOPSCapacity.Qualified()] = resourceapi.DeviceCapacity{Value: *resource.NewQuantity(int64(f), resource.DecimalSI)}
		}
		if sm, ok := d.CUDAComputeCapability.SMVersion(); ok {
			capacity[gpuv1alpha1.SMVersionCapacity.Qualified()] = resourceapi.DeviceCapacity{Value: *resource.NewQuantity(sm, resource.DecimalSI)}
		}
	}
	return resourceapi.Device{
		Name:                     d.Name(),
		Attributes:               enforceLimits(logger, attrs.attrs, len(capacity)),
		Capacity:                 capacity,
		AllowMultipleAllocations: shareable,
	}, nil
}

// ResourceDevices builds all devices in index order. Two devices with the
// same index would get the same name, which the API rejects, so that is an
// error rather than something to paper over.
func ResourceDevices(ctx context.Context, devices []Device, opts PublishOptions) ([]resourceapi.Device, error) {
	sorted := append([]Device(nil), devices...)
	SortByIndex(sorted)
	out := make([]resourceapi.Device, 0, len(sorted))
	for i, d := range sorted {
		if i > 0 && sorted[i-1].Index == d.Index {
			return nil, fmt.Errorf("building devices: %s and %s both have index %d", sorted[i-1].UUID, d.UUID, d.Index)
		}
		rd, err := d.ResourceDevice(ctx, opts)
		if err != nil {
			return nil, err
		}
		out = append(out, rd)
	}
	return out, nil
}

// enforceLimits applies the ResourceSlice validation limits: string values
// longer than the limit are truncated (a prefix of a product name is still
// useful), version values are dropped (a truncated version is not semver),
// and attributes beyond the per-device budget are dropped from the end.
func enforceLimits(logger klog.Logger, attrs []namedAttribute, capacities int) map[resourceapi.QualifiedName]resourceapi.DeviceAttribute {
	budget := resourceapi.ResourceSliceMaxAttributesAndCapacitiesPerDevice - capacities
	out := make(map[resourceapi.QualifiedName]resourceapi.DeviceAttribute, len(attrs))
	for _, a := range attrs {
		v := a.value
		switch {
		case v.StringValue != nil && len(*v.StringValue) > resourceapi.DeviceAttributeMaxValueLength:
			logger.Info("Truncating device attribute", "attribute", a.name, "length", len(*v.StringValue), "reason", "longer than the API allows")
			v.StringValue = ptr.To((*v.StringValue)[:resourceapi.DeviceAttributeMaxValueLength])
		case v.VersionValue != nil && len(*v.VersionValue) > resourceapi.DeviceAttributeMaxValueLength:
			logger.Info("Dropping device attribute", "attribute", a.name, "length", len(*v.VersionValue), "reason", "version longer than the API allows")
			continue
		}
		if len(out) >= budget {
			logger.Info("Dropping device attribute", "attribute", a.name, "reason", fmt.Sprintf("device already has %d attributes and capacities", resourceapi.ResourceSliceMaxAttributesAndCapacitiesPerDevice))
			continue
		}
		out[a.name] = v
	}
	return out
}

var buildMetadata = regexp.MustCompile(`^[0-9A-Za-z-]+(\.[0-9A-Za-z-]+)*$`)

// semverFromDotted turns NVML's dotted versions into semver 2.0. NVML pads
// components ("535.104.05") and may give fewer than three, neither of which
// semver allows; components past the third are kept as build metadata.
func semverFromDotted(v string) (string, error) {
	parts := strings.Split(v, ".")
	nums := make([]string, 0, 3)
	for i, p := range parts {
		if i == 3 {
			build := strings.Join(parts[3:], ".")
			if !buildMetadata.MatchString(build) {
				return "", fmt.Errorf("%q is not a dotted version", v)
			}
			return strings.Join(nums, ".") + "+" + build, nil
		}
		n, err := strconv.ParseUint(p, 10, 32)
		if err != nil {
			return "", fmt.Errorf("%q is not a dotted numeric version", v)
		}
		nums = append(nums, strconv.FormatUint(n, 10))
	}
	for len(nums) < 3 {
		nums = append(nums, "0")
	}
	return strings.Join(nums, "."), nil
}
