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
	"errors"
	"fmt"
	"regexp"
	"strconv"

	"k8s.io/apimachinery/pkg/api/resource"
	"k8s.io/apimachinery/pkg/util/validation/field"

	prismv1alpha1 "github.com/prismgpu/prism/api/prism/v1alpha1"
)

// Profile is what Rewrite needs to know about a workload. Memory figures are
// per device, and out of range beyond prismv1alpha1.MaxDeviceMemory.
type Profile struct {
	Name      string
	BoundType prismv1alpha1.BoundType
	// MinMemory is a hard floor, used as is.
	MinMemory *resource.Quantity
	// PeakMemory is a measured footprint; headroom is added before bucketing.
	PeakMemory *resource.Quantity
	// MinComputeCapability is "major.minor", for example "8.0".
	MinComputeCapability string
	// Policy defaults to performance (prismv1alpha1.PolicyPerformance) when
	// empty.
	Policy prismv1alpha1.Policy
	// ShareMemory asks for the memory need as a share of a GPU rather than a
	// whole one, on GPUs published as shareable (consumable capacity).
	ShareMemory bool
	// Usage is what NVML saw the workload use (status.usage). With
	// ShareFromUsage, a request for one whole GPU gets a share sized from
	// it as its first choice (see SizeShare).
	Usage *prismv1alpha1.UsageProfile
	// Exclusive is the profile's spec.sharing: Exclusive: never a share.
	Exclusive bool
	// Kernels is what ncu measured of how much of a GPU the workload's
	// kernels fill; it sizes a MIG partition where GPM measured no SM
	// activity (SizePartition).
	Kernels KernelShape
}

// ErrInvalidProfile is wrapped by every error caused by profile contents.
var ErrInvalidProfile = errors.New("invalid profile")

const (
	// headroomFixed covers what a process holds regardless of its model size
	// (CUDA context, cuBLAS/cuDNN workspaces); headroomPercent covers
	// allocator fragmentation and run-to-run variance of the peak. With 10 %
	// alone a 20 GB footprint would land on an L4, which reports 22.5 GiB.
	headroomFixed   = 2 << 30
	headroomPercent = 10
	maxNameInPlan   = 253
)

var ccPattern = regexp.MustCompile(`^([0-9]{1,3})\.([0-9]{1,3})$`)

// needs are the profile's hard requirements after bucketing.
type needs struct {
	memory selectorID // -1: none
	cc     selectorID // -1: none
	// sm is the cc floor as an sm_XY number, for a capacity request on
	// gpuv1alpha1.SMVersionCapacity in its place.
	sm   int64
	text string
	// floor is the memory floor of the memory selector as a quantity, for
	// a capacity request in its place; nil: no memory need.
	floor *resource.Quantity
	// share is the memory to request from a shareable GPU; nil: the whole GPU.
	share *resource.Quantity
}

func (p Profile) needs() (needs, error) {
	n := needs{memory: -1, cc: -1}
	var bytes int64
	for _, f := range []struct {
		name string
		q    *resource.Quantity
	}{{"minMemory", p.MinMemory}, {"peakMemory", p.PeakMemory}} {
		if f.q == nil {
			continue
		}
		// Never Cmp or Value on a tenant's quantity: see BoundedValue. The
		// bound also keeps the headroom arithmetic below inside int64.
		v, err := prismv1alpha1.BoundedValue(field.NewPath(f.name), *f.q, prismv1alpha1.MaxDeviceMemory)
		if err != nil {
			return n, fmt.Errorf("%w: %v", ErrInvalidProfile, err)
		}
		if f.name == "peakMemory" && v > 0 {
			v += (v*headroomPercent+99)/100 + headroomFixed
		}
		bytes = max(bytes, v)
	}
	if bytes > 0 {
		for i, gi := range memoryFloorsGi {
			if bytes <= gi<<30 {
				n.memory = selMemoryFirst + selectorID(i)
				n.floor = resource.NewQuantity(gi<<30, resource.BinarySI)
				n.text = fmt.Sprintf("memory>=%dGi", gi)
				break
			}
		}
		if n.memory < 0 {
			return n, fmt.Errorf("%w: needs %d bytes per device, more than the largest bucket (%dGi)", ErrInvalidProfile, bytes, memoryFloorsGi[len(memoryFloorsGi)-1])
		}
		if p.ShareMemory {
			// Whole GiB, the step the plugin publishes, so that the share is
			// exactly what the scheduler will count.
			gi := (bytes + 1<<30 - 1) >> 30
			n.share = resource.NewQuantity(gi<<30, resource.BinarySI)
			n.text += fmt.Sprintf(" share=%dGi", gi)
		}
	}
	if p.MinComputeCapability != "" {
		m := ccPattern.FindStringSubmatch(p.MinComputeCapability)
		if m == nil {
			return n, fmt.Errorf("%w: minComputeCapability %q is not major.minor", ErrInvalidProfile, p.MinComputeCapability)
		}
		major, _ := strconv.Atoi(m[1])
		minor, _ := strconv.Atoi(m[2])
		for i, f := range ccFloors {
			if major < f.major || major == f.major && minor <= f.minor {
				n.cc = selCCFirst + selectorID(i)
				n.sm = int64(f.major*10 + f.minor)
				if n.text != "" {
					n.text += " "
				}
				n.text += fmt.Sprintf("cc>=%d.%d", f.major, f.minor)
				break
			}
		}
		if n.cc < 0 {
			return n, fmt.Errorf("%w: minComputeCapability %s is above the largest bucket", ErrInvalidProfile, p.MinComputeCapability)
		}
	}
	return n, nil
}
