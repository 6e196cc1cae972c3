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
	"encoding/json"
	"fmt"
	"strings"

	resourceapi "k8s.io/api/resource/v1"

	gpuv1alpha1 "github.com/prismgpu/prism/api/gpu/v1alpha1"
)

// MemoryFloorAsCapacity writes the memory floor as a capacity request on
// gpu.prism.dev/memory instead of a CEL selector: the allocator checks it
// without building a CEL activation, and a tier left with no selector needs
// no class selector either (see TierDeviceClassName). Use it only where
//   - DRAConsumableCapacity is on in the API server and the scheduler: with
//     the gate off the API server drops the request, floor included, and a
//     scheduler without it refuses the claim;
//   - no GPU is published shareable (the plugin's memory sharing is off): on
//     a shareable GPU the request would take the floor instead of the whole
//     GPU and let other claims share it.
//
// The caller vouches for the first condition. The second is checked where a
// fleet is given (WithFleet): a fleet with a shareable GPU keeps the CEL
// floor, and the plan says why.
//
// A memory share (Profile.ShareMemory) and a memory request the user wrote
// keep the CEL floor: their capacity request is not the floor.
func MemoryFloorAsCapacity() Option {
	return optionFunc(func(c *Cluster) { c.Capacity.MemoryFloor = true })
}

// Form is how a need is written into a claim.
type Form string

const (
	// FormCapacity is a capacity request, which the allocator checks
	// without CEL.
	FormCapacity Form = "capacity"
	// FormCEL is a CEL selector, which holds whatever the feature gates.
	FormCEL Form = "cel"
)

// ParseForm reads a form as flags and people spell it.
func ParseForm(s string) (Form, error) {
	return parseEither("form", s, FormCEL, FormCapacity)
}

// String, Set and Type make a Form a flag value, so that a flag's form
// reaches the rewrite typed.
func (f Form) String() string { return string(f) }

func (f *Form) Set(s string) error {
	v, err := ParseForm(s)
	if err != nil {
		return err
	}
	*f = v
	return nil
}

func (*Form) Type() string { return "form" }

// FormChoice is the form a need took where the caller asked for the
// capacity form, and why CEL was kept where it was declined. The zero value
// means the capacity form was not asked for. The plan's capacity is one
// too: the form the cluster asks for, and why either way.
type FormChoice struct {
	Form Form
	// Why is set where the capacity form was declined, and in the plan's
	// capacity.
	Why string
}

func capacityForm() FormChoice { return FormChoice{Form: FormCapacity} }

func celBecause(format string, args ...any) FormChoice {
	return FormChoice{Form: FormCEL, Why: fmt.Sprintf(format, args...)}
}

// IsZero lets the plan leave out a choice that was not asked for.
func (c FormChoice) IsZero() bool { return c == FormChoice{} }

// String is the choice as the plan's JSON and explain show it: "capacity",
// or "cel: why".
func (c FormChoice) String() string {
	if c.Why == "" {
		return string(c.Form)
	}
	return string(c.Form) + ": " + c.Why
}

func (c FormChoice) MarshalJSON() ([]byte, error) { return json.Marshal(c.String()) }

func (c *FormChoice) UnmarshalJSON(data []byte) error {
	var s string
	if err := json.Unmarshal(data, &s); err != nil {
		return err
	}
	form, why, _ := strings.Cut(s, ": ")
	f, err := ParseForm(form)
	if err != nil {
		return err
	}
	*c = FormChoice{Form: f, Why: why}
	return nil
}

// memoryFloorForm decides between the capacity request and the CEL floor
// where the caller asked for the capacity request, and says why when it is
// declined.
func (c Cluster) memoryFloorForm() (capacity bool, choice FormChoice) {
	if !c.Capacity.MemoryFloor {
		return false, FormChoice{}
	}
	if c.Fleet != nil {
		if shared := c.Fleet.sharedDevices(); shared > 0 {
			return false, celBecause("%d GPUs are published shareable, where a capacity request is a share, not a floor", shared)
		}
	}
	return true, capacityForm()
}

// TierBoundsAsCapacity writes a fleet tier whose test is a lower bound on a
// figure ("memoryBandwidthGBps >= 3150"), and the compute capability floor,
// as capacity requests on those figures instead of CEL selectors. The
// allocator checks a capacity request without building a CEL activation,
// so a tier that fails on a node costs a comparison per device instead of
// an evaluation. It pays only where the tier has no CEL left: with the
// memory floor as a capacity request (MemoryFloorAsCapacity), and a tier
// test that is a lower bound.
//
// It needs what MemoryFloorAsCapacity needs, and three more things:
//   - the devices publish their figures as capacities (the plugin's
//     --figures-as-capacity). Where the fleet shows a device that does not,
//     the bounds stay CEL, and the plan says why;
//   - the request asks for one GPU: a subrequest left without a selector
//     goes to TierDeviceClassName, which matches every driver's devices, and
//     what keeps foreign devices out where kube-scheduler ignores capacity
//     requests is a matchAttribute constraint on gpu.prism.dev/uuid. Every
//     Prism GPU has one, and for one device it constrains nothing else; for
//     several it would demand one device;
//   - the claim has room for that constraint.
func TierBoundsAsCapacity() Option {
	return optionFunc(func(c *Cluster) { c.Capacity.TierBounds = true })
}

// GuardAttribute is what the constraint that keeps other drivers' devices
// out of a request without selectors matches on (see TierBoundsAsCapacity).
const GuardAttribute = resourceapi.FullyQualifiedName(gpuv1alpha1.DriverName + "/" + gpuv1alpha1.UUIDAttribute)

// tierBoundsForm decides, for the whole claim, between capacity requests and
// CEL for the tier bounds where the caller asked for capacity requests, and
// says why when they are declined.
func (c Cluster) tierBoundsForm() (capacity bool, choice FormChoice) {
	if !c.Capacity.TierBounds {
		return false, FormChoice{}
	}
	if c.Fleet != nil {
		shared, without := c.Fleet.sharedDevices(), 0
		for _, m := range c.Fleet.Models {
			if m.BandwidthGBps > 0 || m.FP32GFLOPS > 0 {
				without += m.Devices - m.FigureCapacityDevices
			}
		}
		switch {
		case shared > 0:
			return false, celBecause("%d GPUs are published shareable, where a capacity request is a share, not a bound", shared)
		case without > 0:
			return false, celBecause("%d GPUs publish no figures as capacities (the plugin's --figures-as-capacity)", without)
		}
	}
	return true, capacityForm()
}

// boundsFit says why one request cannot carry tier bounds as capacity
// requests, or "".
func boundsFit(e *resourceapi.ExactDeviceRequest, constraints int) string {
	switch {
	case e.AllocationMode != "" && e.AllocationMode != resourceapi.DeviceAllocationModeExactCount || e.Count > 1:
		return "asks for more than one GPU, which the uuid guard would refuse"
	case constraints >= resourceapi.DeviceConstraintsMaxSize:
		return fmt.Sprintf("the claim has %d constraints, no room for the uuid guard", constraints)
	}
	return ""
}

// guard is the constraint that keeps request to devices with a Prism uuid.
func guard(request string) resourceapi.DeviceConstraint {
	attr := GuardAttribute
	return resourceapi.DeviceConstraint{Requests: []string{request}, MatchAttribute: &attr}
}

// sharedDevices counts the GPUs published shareable, on which a capacity
// request is a share rather than a floor or a bound.
func (f *Fleet) sharedDevices() int {
	n := 0
	for _, m := range f.Models {
		n += m.SharedDevices
	}
	return n
}
