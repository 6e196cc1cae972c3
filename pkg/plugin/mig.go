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
	"strings"

	"k8s.io/klog/v2"

	"github.com/prismgpu/prism/pkg/cdi"
	"github.com/prismgpu/prism/pkg/checkpoint"
	"github.com/prismgpu/prism/pkg/gpu"
	"github.com/prismgpu/prism/pkg/mig"
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

func (d *Driver) crash(point string) {
	if d.crashHook != nil {
		d.crashHook(point)
		return
	}
	crashPoint(point)
}

// partitionDevice finds a MIG partition of the node's GPUs by device name,
// as gpu.Partition.Name spells it, with the figures its hard needs are
// checked against and the placement prepare creates it at.
func (d *Driver) partitionDevice(name string) (gpu.Device, *checkpoint.MIGInstance, bool, error) {
	d.devicesMu.RLock()
	var found *gpu.Partition
	for _, dev := range d.devices {
		if dev.MIG == nil || !strings.HasPrefix(name, dev.Name()+"-mig-") {
			continue
		}
		for _, p := range dev.Partitions() {
			if p.Name() == name {
				found = &p
				break
			}
		}
	}
	d.devicesMu.RUnlock()
	if found == nil {
		return gpu.Device{}, nil, false, nil
	}
	if d.cfg.MIG == nil {
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

// checkMIGPlacements refuses partitions whose memory slices are taken,
// before anything is recorded: by another claim's partition (the scheduler
// should never allocate both) or by an instance on the GPU. An instance
// that Prism did not create is never destroyed to make room, so the claim
// fails and says which instance is in the way.
func (d *Driver) checkMIGPlacements(ctx context.Context, uid string, devices []checkpoint.Device, pending []checkpoint.Claim) error {
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
		d.checkpoint.Range(func(c *checkpoint.Claim) bool { return c.UID == uid || check(c) })
		for _, c := range slices.Concat(pending, []checkpoint.Claim{{UID: uid, Devices: devices}}) {
			if conflict == nil {
				check(&c)
			}
		}
		if conflict != nil {
			return conflict
		}
		existing, err := d.cfg.MIG.GPUInstances(ctx, want.ParentUUID)
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

// createMIG creates the GPU and compute instance of each partition of a
// claim whose intent is recorded, then records their IDs, fsynced, before
// the CDI spec that names them is written. On failure it destroys what it
// created; if that fails too, the error wraps errMIGLeft.
func (d *Driver) createMIG(ctx context.Context, rec *checkpoint.Claim) error {
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
		gi, err := d.cfg.MIG.CreateGPUInstance(ctx, p)
		if err != nil {
			return d.undoMIG(ctx, made, fmt.Errorf("partition %s: %w", dev.Name, err))
		}
		m := *dev.MIG
		m.Created, m.GPUInstanceID = true, gi
		made.Devices = append(made.Devices, checkpoint.Device{Name: dev.Name, MIG: &m})
		d.crash(CrashAfterMIGGPUInstanceCreated)
		ci, uuid, err := d.cfg.MIG.CreateComputeInstance(ctx, p.ParentUUID, gi)
		if err != nil {
			return d.undoMIG(ctx, made, fmt.Errorf("partition %s: %w", dev.Name, err))
		}
		d.crash(CrashAfterMIGComputeInstanceCreated)
		dev.MIG.Created, dev.MIG.GPUInstanceID, dev.MIG.ComputeInstanceID, dev.MIG.UUID = true, gi, ci, uuid
		logger.Info("Created MIG instance", "device", dev.Name, "parentUUID", p.ParentUUID, "profileID", p.ProfileID,
			"placement", p.Slices(), "gpuInstance", gi, "computeInstance", ci, "uuid", uuid)
	}
	if len(made.Devices) == 0 {
		return nil
	}
	if err := d.checkpoint.PutClaims(ctx, true, *rec); err != nil {
		return d.undoMIG(ctx, made, fmt.Errorf("record MIG instances: %w", err))
	}
	d.crash(CrashAfterMIGRecorded)
	return nil
}

// undoMIG destroys the instances rec names, which a failed prepare
// created, and says in the error whether the record must stay. rec must
// name them by the IDs their creation returned, never by placement alone.
func (d *Driver) undoMIG(ctx context.Context, rec checkpoint.Claim, cause error) error {
	if err := d.destroyMIG(ctx, rec); err != nil {
		return fmt.Errorf("%w; %w: %w", cause, errMIGLeft, err)
	}
	return cause
}

// destroyMIG destroys the instances a claim's record names: the GPU
// instance at exactly the recorded profile and placement (with the
// recorded ID once there is one), compute instances first. It runs before
// the record is forgotten, so a failure leaves the record for a retry. An
// instance anywhere else is not Prism's and is left alone.
func (d *Driver) destroyMIG(ctx context.Context, rec checkpoint.Claim) error {
	logger := klog.FromContext(ctx)
	var errs []error
	for _, dev := range rec.Devices {
		m := dev.MIG
		if m == nil {
			continue
		}
		if d.cfg.MIG == nil {
			errs = append(errs, fmt.Errorf("partition %s: its MIG instances cannot be destroyed, this plugin has no NVML MIG access", dev.Name))
			continue
		}
		existing, err := d.cfg.MIG.GPUInstances(ctx, m.ParentUUID)
		if err != nil {
			errs = append(errs, fmt.Errorf("partition %s: %w", dev.Name, err))
			continue
		}
		for _, gi := range existing {
			if !recordedAt(m, gi) {
				continue
			}
			if err := d.cfg.MIG.DestroyGPUInstance(ctx, m.ParentUUID, gi.ID); err != nil {
				errs = append(errs, fmt.Errorf("partition %s: %w", dev.Name, err))
				continue
			}
			logger.Info("Destroyed MIG instance", "claim", rec.Namespace+"/"+rec.Name, "device", dev.Name,
				"parentUUID", m.ParentUUID, "gpuInstance", gi.ID, "placement", gi.Slices(), "recordedCreated", m.Created)
		}
	}
	return errors.Join(errs...)
}

// reportForeignMIG logs, once at start-up, the GPU instances that no
// record explains: made by an administrator or another tool, they are
// never touched, and the partitions they overlap fail to prepare.
func (d *Driver) reportForeignMIG(ctx context.Context) {
	if d.cfg.MIG == nil {
		return
	}
	logger := klog.FromContext(ctx)
	var records []*checkpoint.MIGInstance
	for _, c := range d.checkpoint.List() {
		for _, dev := range c.Devices {
			if dev.MIG != nil {
				records = append(records, dev.MIG)
			}
		}
	}
	d.devicesMu.RLock()
	var parents []gpu.Device
	for _, dev := range d.devices {
		if dev.MIG != nil {
			parents = append(parents, dev)
		}
	}
	d.devicesMu.RUnlock()
	gpu.SortByIndex(parents)
	for _, parent := range parents {
		existing, err := d.cfg.MIG.GPUInstances(ctx, parent.UUID)
		if err != nil {
			logger.Error(err, "Listing MIG instances", "device", parent.Name())
			continue
		}
		for _, gi := range existing {
			ours := false
			for _, m := range records {
				ours = ours || recordedAt(m, gi)
			}
			if !ours {
				logger.Info("Leaving alone a MIG instance that Prism did not create; partitions it overlaps cannot be prepared",
					"device", parent.Name(), "uuid", parent.UUID, "gpuInstance", gi.ID, "profileID", gi.ProfileID, "placement", gi.Slices())
			}
		}
	}
}

// migCDIDevice is the CDI device of a created partition: the MIG device's
// UUID, the parent's device node and the instances' access nodes.
func (d *Driver) migCDIDevice(dev checkpoint.Device) (cdi.Device, error) {
	m := dev.MIG
	if !m.Created {
		return cdi.Device{}, fmt.Errorf("partition %s has no MIG instance yet", dev.Name)
	}
	d.devicesMu.RLock()
	defer d.devicesMu.RUnlock()
	for _, g := range d.devices {
		if g.UUID == m.ParentUUID {
			return cdi.Device{Name: dev.Name, UUID: m.UUID, Minor: g.Minor,
				MIG: &cdi.MIGDevice{GPUInstance: m.GPUInstanceID, ComputeInstance: m.ComputeInstanceID}}, nil
		}
	}
	return cdi.Device{}, fmt.Errorf("GPU %s, parent of partition %s, is no longer present on this node", m.ParentUUID, dev.Name)
}
