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

package plugin

import (
	"context"
	"errors"
	"fmt"
	"slices"

	"k8s.io/klog/v2"

	"github.com/prismgpu/prism/internal/plugin/cdi"
	"github.com/prismgpu/prism/internal/plugin/checkpoint"
	"github.com/prismgpu/prism/internal/plugin/mig"
	"github.com/prismgpu/prism/pkg/gpu"
)

// Crash points of a prepare that creates MIG instances, between each
// creation and the checkpoint write that records it. They are not in
// CrashPoints, which a claim for a whole GPU reaches every one of.
const (
	CrashAfterMIGGPUInstanceCreated     = "prepare-mig-gpu-instance-created"
	CrashAfterMIGComputeInstanceCreated = "prepare-mig-compute-instance-created"
	CrashAfterMIGRecorded               = "prepare-mig-recorded"
)

// MIGCrashPoints lists the MIG crash points in the order a prepare reaches
// them.
var MIGCrashPoints = []string{CrashAfterMIGGPUInstanceCreated, CrashAfterMIGComputeInstanceCreated, CrashAfterMIGRecorded}

// errMIGLeft marks a failed prepare whose instances could not be destroyed
// again: its record must stay, so that a retry or a restart destroys them.
var errMIGLeft = errors.New("the MIG instances it created could not be destroyed and stay recorded; the next prepare of the claim, its unprepare or a plugin restart destroys them")

// migPartitions creates and destroys the MIG instances of the partitions
// that claims are prepared on, and records each in the checkpoint before
// the CDI spec that names it is written.
type migPartitions struct {
	// lib creates and destroys instances; nil refuses claims for
	// partitions.
	lib        mig.Interface
	gpus       *nodeGPUs
	checkpoint *checkpoint.Store
	// crashHook, when set, stands in for crashPoint at the MIG crash
	// points, so that unit tests can stop a prepare there.
	crashHook func(string)
}

func (m *migPartitions) crash(point string) {
	if m.crashHook != nil {
		m.crashHook(point)
		return
	}
	crashPoint(point)
}

// intent finds a MIG partition of the node's GPUs by device name, as
// gpu.Partition.Name spells it, with the figures its hard needs are
// checked against and the placement prepare creates it at.
func (m *migPartitions) intent(name string) (gpu.Device, *checkpoint.MIGInstance, bool, error) {
	found, ok := m.gpus.partition(name)
	if !ok {
		return gpu.Device{}, nil, false, nil
	}
	if m.lib == nil {
		return gpu.Device{}, nil, true, fmt.Errorf("device %s is a MIG partition, but this plugin cannot create MIG instances (no NVML MIG access was configured)", name)
	}
	return found.Figures(), &checkpoint.MIGInstance{
		ParentUUID:   found.Parent.UUID,
		ProfileIndex: found.Profile.Index,
		ProfileID:    found.Profile.ID,
		Start:        found.Placement.Start,
		Size:         found.Placement.Size,
	}, true, nil
}

func placementOf(m *checkpoint.MIGInstance) mig.Placement {
	return mig.Placement{ParentUUID: m.ParentUUID, ProfileIndex: m.ProfileIndex, ProfileID: m.ProfileID, Start: m.Start, Size: m.Size}
}

// recordedAt says whether an existing GPU instance is the one a record
// names: the same profile at the same start of the same GPU and, once the
// record has it, the same ID.
func recordedAt(m *checkpoint.MIGInstance, gi mig.GPUInstance) bool {
	return gi.ParentUUID == m.ParentUUID && gi.ProfileID == m.ProfileID && gi.Start == m.Start &&
		(!m.Created || gi.ID == m.GPUInstanceID)
}

// checkPlacements refuses partitions whose memory slices are taken,
// before anything is recorded: by another claim's partition (the scheduler
// should never allocate both) or by an instance on the GPU. An instance
// that Prism did not create is never destroyed to make room, so the claim
// fails and says which instance is in the way.
func (m *migPartitions) checkPlacements(ctx context.Context, uid string, devices []checkpoint.Device, pending []checkpoint.Claim) error {
	for i, dev := range devices {
		if dev.MIG == nil {
			continue
		}
		want := placementOf(dev.MIG)
		var conflict error
		check := func(other *checkpoint.Claim) bool {
			for j, od := range other.Devices {
				if od.MIG == nil || (other.UID == uid && j >= i) {
					continue
				}
				if want.Overlaps(placementOf(od.MIG)) {
					conflict = fmt.Errorf("partition %s (%s of GPU %s) overlaps partition %s prepared for claim %s/%s (uid %s); the scheduler should not have allocated both",
						dev.Name, want.Slices(), want.ParentUUID, od.Name, other.Namespace, other.Name, other.UID)
					return false
				}
			}
			return true
		}
		m.checkpoint.Range(func(c *checkpoint.Claim) bool { return c.UID == uid || check(c) })
		for _, c := range slices.Concat(pending, []checkpoint.Claim{{UID: uid, Devices: devices}}) {
			if conflict == nil {
				check(&c)
			}
		}
		if conflict != nil {
			return conflict
		}
		existing, err := m.lib.GPUInstances(ctx, want.ParentUUID)
		if err != nil {
			return fmt.Errorf("partition %s: %w", dev.Name, err)
		}
		for _, gi := range existing {
			if !want.Overlaps(gi.Placement) {
				continue
			}
			return fmt.Errorf("partition %s needs %s of GPU %s, but GPU instance %d (profile %d at %s) is there, which no prepared claim of Prism's created; "+
				"Prism never destroys instances it did not create: remove it (nvidia-smi mig -dci, -dgi) or leave the GPU to Prism",
				dev.Name, want.Slices(), want.ParentUUID, gi.ID, gi.ProfileID, gi.Slices())
		}
	}
	return nil
}

// create creates the GPU and compute instance of each partition of a
// claim whose intent is recorded, then records their IDs, fsynced, before
// the CDI spec that names them is written. On failure it destroys what it
// created; if that fails too, the error wraps errMIGLeft.
func (m *migPartitions) create(ctx context.Context, rec *checkpoint.Claim) error {
	logger := klog.FromContext(ctx)
	// made names only the instances this call created, by the IDs NVML
	// returned: a rollback must not destroy an instance that another party
	// put at a placement this call has not reached, which the intent alone
	// (profile and start, no ID) would match.
	made := checkpoint.Claim{UID: rec.UID, Namespace: rec.Namespace, Name: rec.Name}
	for i := range rec.Devices {
		dev := &rec.Devices[i]
		if dev.MIG == nil || dev.MIG.Created {
			continue
		}
		p := placementOf(dev.MIG)
		gi, err := m.lib.CreateGPUInstance(ctx, p)
		if err != nil {
			return m.undo(ctx, made, fmt.Errorf("partition %s: %w", dev.Name, err))
		}
		created := *dev.MIG
		created.Created, created.GPUInstanceID = true, gi
		made.Devices = append(made.Devices, checkpoint.Device{Name: dev.Name, MIG: &created})
		m.crash(CrashAfterMIGGPUInstanceCreated)
		ci, uuid, err := m.lib.CreateComputeInstance(ctx, p.ParentUUID, gi)
		if err != nil {
			return m.undo(ctx, made, fmt.Errorf("partition %s: %w", dev.Name, err))
		}
		m.crash(CrashAfterMIGComputeInstanceCreated)
		dev.MIG.Created, dev.MIG.GPUInstanceID, dev.MIG.ComputeInstanceID, dev.MIG.UUID = true, gi, ci, uuid
		logger.Info("Created MIG instance", "device", dev.Name, "parentUUID", p.ParentUUID, "profileID", p.ProfileID,
			"placement", p.Slices(), "gpuInstance", gi, "computeInstance", ci, "uuid", uuid)
	}
	if len(made.Devices) == 0 {
		return nil
	}
	if err := m.checkpoint.PutClaims(ctx, true, *rec); err != nil {
		return m.undo(ctx, made, fmt.Errorf("record MIG instances: %w", err))
	}
	m.crash(CrashAfterMIGRecorded)
	return nil
}

// undo destroys the instances rec names, which a failed prepare
// created, and says in the error whether the record must stay. rec must
// name them by the IDs their creation returned, never by placement alone.
func (m *migPartitions) undo(ctx context.Context, rec checkpoint.Claim, cause error) error {
	if err := m.destroy(ctx, rec); err != nil {
		return fmt.Errorf("%w; %w: %w", cause, errMIGLeft, err)
	}
	return cause
}

// destroy destroys the instances a claim's record names: the GPU
// instance at exactly the recorded profile and placement (with the
// recorded ID once there is one), compute instances first. It runs before
// the record is forgotten, so a failure leaves the record for a retry. An
// instance anywhere else is not Prism's and is left alone.
func (m *migPartitions) destroy(ctx context.Context, rec checkpoint.Claim) error {
	logger := klog.FromContext(ctx)
	var errs []error
	for _, dev := range rec.Devices {
		rm := dev.MIG
		if rm == nil {
			continue
		}
		if m.lib == nil {
			errs = append(errs, fmt.Errorf("partition %s: its MIG instances cannot be destroyed, this plugin has no NVML MIG access", dev.Name))
			continue
		}
		existing, err := m.lib.GPUInstances(ctx, rm.ParentUUID)
		if err != nil {
			errs = append(errs, fmt.Errorf("partition %s: %w", dev.Name, err))
			continue
		}
		for _, gi := range existing {
			if !recordedAt(rm, gi) {
				continue
			}
			if err := m.lib.DestroyGPUInstance(ctx, rm.ParentUUID, gi.ID); err != nil {
				errs = append(errs, fmt.Errorf("partition %s: %w", dev.Name, err))
				continue
			}
			logger.Info("Destroyed MIG instance", "claim", rec.Namespace+"/"+rec.Name, "device", dev.Name,
				"parentUUID", rm.ParentUUID, "gpuInstance", gi.ID, "placement", gi.Slices(), "recordedCreated", rm.Created)
		}
	}
	return errors.Join(errs...)
}

// reportForeign logs, once at start-up, the GPU instances that no
// record explains: made by an administrator or another tool, they are
// never touched, and the partitions they overlap fail to prepare.
func (m *migPartitions) reportForeign(ctx context.Context) {
	if m.lib == nil {
		return
	}
	logger := klog.FromContext(ctx)
	var records []*checkpoint.MIGInstance
	for _, c := range m.checkpoint.List() {
		for _, dev := range c.Devices {
			if dev.MIG != nil {
				records = append(records, dev.MIG)
			}
		}
	}
	for _, parent := range m.gpus.inMIGMode() {
		existing, err := m.lib.GPUInstances(ctx, parent.UUID)
		if err != nil {
			logger.Error(err, "Listing MIG instances", "device", parent.Name())
			continue
		}
		for _, gi := range existing {
			ours := false
			for _, r := range records {
				ours = ours || recordedAt(r, gi)
			}
			if !ours {
				logger.Info("Leaving alone a MIG instance that Prism did not create; partitions it overlaps cannot be prepared",
					"device", parent.Name(), "uuid", parent.UUID, "gpuInstance", gi.ID, "profileID", gi.ProfileID, "placement", gi.Slices())
			}
		}
	}
}

// ofInstance is the MIG partition whose GPU instance, as created
// by a prepared claim and recorded in the checkpoint, has this ID on the
// GPU with this UUID. Instance IDs are unique on a GPU only while the
// instance exists, so only records of instances created count.
func (m *migPartitions) ofInstance(parentUUID string, gpuInstance uint32) (string, bool) {
	var name string
	m.checkpoint.Range(func(c *checkpoint.Claim) bool {
		for _, dev := range c.Devices {
			if rm := dev.MIG; rm != nil && rm.Created && rm.ParentUUID == parentUUID && rm.GPUInstanceID == int(gpuInstance) {
				name = dev.Name
				return false
			}
		}
		return true
	})
	return name, name != ""
}

// cdiDevice is the CDI device of a created partition: the MIG device's
// UUID, the parent's device node and the instances' access nodes.
func (m *migPartitions) cdiDevice(dev checkpoint.Device) (cdi.Device, error) {
	rm := dev.MIG
	if !rm.Created {
		return cdi.Device{}, fmt.Errorf("partition %s has no MIG instance yet", dev.Name)
	}
	parent, ok := m.gpus.withUUID(rm.ParentUUID)
	if !ok {
		return cdi.Device{}, fmt.Errorf("GPU %s, parent of partition %s, is no longer present on this node", rm.ParentUUID, dev.Name)
	}
	return cdi.Device{Name: dev.Name, UUID: rm.UUID, Minor: parent.Minor,
		MIG: &cdi.MIGDevice{GPUInstance: rm.GPUInstanceID, ComputeInstance: rm.ComputeInstanceID}}, nil
}
