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

package checkpoint

import (
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"slices"
	"time"

	gpuv1alpha1 "github.com/prismgpu/prism/api/gpu/v1alpha1"
)

// PrepareState is the phase a claim's preparation has reached.
type PrepareState string

const (
	// PrepareStarted is recorded before any side effect of a prepare
	// happens. A claim in this state may have some, all or none of its side
	// effects in place; undoing it must be idempotent.
	PrepareStarted PrepareState = "PrepareStarted"
	// PrepareCompleted is recorded after every side effect is in place, in
	// the current boot.
	PrepareCompleted PrepareState = "PrepareCompleted"
)

// Data is the mutable content of a checkpoint.
type Data struct {
	// Claims is keyed by claim UID.
	Claims map[string]Claim `json:"claims,omitempty"`
	// Taints are the health taints of the node's GPUs, keyed by device
	// name, so that a restart or an OOM kill does not offer a faulty GPU
	// again. Added within v2: older v2 files have none, and an older plugin
	// reading a newer file ignores them.
	Taints map[string]Taint `json:"taints,omitempty"`
	// MPSDaemons are the MPS control daemons the plugin runs, keyed by the
	// share they serve (Sharing.MPSDaemon), or by GPU UUID for a daemon
	// that the shares of a whole GPU used before each share had one of its
	// own, so that a restarted plugin adopts or stops them rather than
	// leaving them behind. Added within v2, like Taints.
	MPSDaemons map[string]MPSDaemon `json:"mpsDaemons,omitempty"`
}

// MPSDaemon is one MPS control daemon, recorded before it is started (PID
// zero) and again once it listens.
type MPSDaemon struct {
	// UUID is the GPU the daemon serves.
	UUID string `json:"uuid"`
	// PipeDir and LogDir are the daemon's CUDA_MPS_PIPE_DIRECTORY and
	// CUDA_MPS_LOG_DIRECTORY on the host.
	PipeDir string `json:"pipeDir"`
	LogDir  string `json:"logDir"`
	// ShmDir is the host directory the daemon has as /dev/shm, and its
	// share's containers too; empty for a daemon of a whole GPU's shares.
	ShmDir string `json:"shmDir,omitempty"`
	// Limits are what the daemon gives every MPS server it starts; no
	// amounts for a daemon of a whole GPU's shares.
	Limits gpuv1alpha1.Share `json:"limits,omitzero"`
	// PID is the daemon's process, zero while it is being started.
	PID int `json:"pid,omitempty"`
	// StartTicks is the process's start time in clock ticks after boot, as
	// /proc/<pid>/stat gives it, so that a PID reused by another process
	// after the daemon died, or after a reboot, is not taken for it.
	StartTicks uint64 `json:"startTicks,omitempty"`
	// Started is when the daemon was started, for people.
	Started time.Time `json:"started,omitzero"`
	// Pod is the daemon's pod in the plugin's namespace, for a plugin that
	// runs its daemons in pods of their own; recorded once created.
	Pod string `json:"pod,omitempty"`
	// Container is the ID of the pod's container, which the daemon's
	// cgroup path names, whatever the kubelet's cgroup driver.
	Container string `json:"container,omitempty"`
}

// Taint is a GPU's health taint as published in the ResourceSlice.
type Taint struct {
	// UUID is the GPU that was tainted; a different GPU under the same
	// device name after a hardware swap is not.
	UUID      string    `json:"uuid"`
	Key       string    `json:"key"`
	Value     string    `json:"value,omitempty"`
	Effect    string    `json:"effect"`
	TimeAdded time.Time `json:"timeAdded"`
}

// Claim is what the plugin must remember about one claim to answer a
// repeated NodePrepareResources and to undo its work.
type Claim struct {
	UID       string       `json:"uid"`
	Namespace string       `json:"namespace"`
	Name      string       `json:"name"`
	State     PrepareState `json:"state"`
	Devices   []Device     `json:"devices,omitempty"`
	// CDISpecFile is the transient CDI spec written for the claim. Empty for
	// claims migrated from v1, whose spec name was derived from the UID.
	CDISpecFile string     `json:"cdiSpecFile,omitempty"`
	Profiling   *Profiling `json:"profiling,omitempty"`
}

// Device is one prepared device of a claim.
type Device struct {
	// Requests are the claim requests the device was allocated for.
	Requests     []string `json:"requests,omitempty"`
	Pool         string   `json:"pool,omitempty"`
	Name         string   `json:"name"`
	CDIDeviceIDs []string `json:"cdiDeviceIDs,omitempty"`
	// ShareID identifies this claim's share of a device that several claims
	// use at once; empty for a device held exclusively.
	ShareID string   `json:"shareID,omitempty"`
	Sharing *Sharing `json:"sharing,omitempty"`
	// MIG is set for a MIG partition, which prepare creates. Added within
	// v2, like Taints.
	MIG *MIGInstance `json:"mig,omitempty"`
}

// MIGInstance is the GPU instance and compute instance prepare creates for
// a partition. It is recorded with the placement alone before anything is
// created, so that a restart after a crash knows where an instance of its
// own may sit, and again with the IDs once both exist.
type MIGInstance struct {
	ParentUUID string `json:"parentUUID"`
	// ProfileIndex is the NVML_GPU_INSTANCE_PROFILE_* value, ProfileID
	// NVML's id of the profile.
	ProfileIndex int `json:"profileIndex"`
	ProfileID    int `json:"profileID"`
	Start        int `json:"start"`
	Size         int `json:"size"`
	// Created is set once both instances exist and their IDs are recorded.
	Created           bool `json:"created,omitempty"`
	GPUInstanceID     int  `json:"gpuInstanceID,omitempty"`
	ComputeInstanceID int  `json:"computeInstanceID,omitempty"`
	// UUID is the MIG device's, "MIG-...".
	UUID string `json:"uuid,omitempty"`
}

// Sharing is the sharing setup applied to a device.
type Sharing struct {
	Strategy string
	// TimeSlice is the interval asked for with the TimeSlicing strategy.
	TimeSlice string
	// Share is the part of the GPU the scheduler counted for the claim,
	// with no amounts where the allocation named none.
	Share gpuv1alpha1.Share
	// ComputeLimitPercent is the cap on the share's SMs that its GpuConfig
	// asked for (sharing.computeLimitPercent), as granted at prepare; 0
	// where none was asked, and the share's clients may use every SM.
	ComputeLimitPercent int32
	// MPS is set when the share is enforced by an MPS control daemon. It
	// is decided once, at prepare, so that a CDI spec written again after a
	// crash is the one the containers were started with.
	MPS bool
	// MPSDaemon names the share's own daemon in Data.MPSDaemons. Empty
	// for a share prepared when the shares of a GPU had one daemon, keyed
	// by the GPU's UUID.
	MPSDaemon string
}

// sharingJSON is Sharing as the file holds it. The share's fields keep the
// names the file gave them before the share was a gpuv1alpha1.Share
// (memoryShareBytes, not the share's memoryBytes), so that the plugins on
// either side of a rolling update or a rollback read each other's files.
type sharingJSON struct {
	Strategy         string `json:"strategy,omitempty"`
	TimeSlice        string `json:"timeSlice,omitempty"`
	MemoryShareBytes int64  `json:"memoryShareBytes,omitempty"`
	ComputePercent   int32  `json:"computePercent,omitempty"`
	// ComputeLimitPercent is new with compute limits; a plugin from before
	// them drops it and holds the share to its computePercent.
	ComputeLimitPercent int32  `json:"computeLimitPercent,omitempty"`
	MPS                 bool   `json:"mps,omitempty"`
	MPSDaemon           string `json:"mpsDaemon,omitempty"`
}

func (s Sharing) MarshalJSON() ([]byte, error) {
	return json.Marshal(sharingJSON{
		Strategy: s.Strategy, TimeSlice: s.TimeSlice,
		MemoryShareBytes: s.Share.MemoryBytes, ComputePercent: s.Share.ComputePercent,
		ComputeLimitPercent: s.ComputeLimitPercent,
		MPS:                 s.MPS, MPSDaemon: s.MPSDaemon,
	})
}

func (s *Sharing) UnmarshalJSON(data []byte) error {
	var f sharingJSON
	if err := json.Unmarshal(data, &f); err != nil {
		return err
	}
	*s = Sharing{
		Strategy: f.Strategy, TimeSlice: f.TimeSlice,
		Share:               gpuv1alpha1.Share{ComputePercent: f.ComputePercent, MemoryBytes: f.MemoryShareBytes},
		ComputeLimitPercent: f.ComputeLimitPercent,
		MPS:                 f.MPS, MPSDaemon: f.MPSDaemon,
	}
	return nil
}

// Limits is what the share's clients are held to: the share's memory, and
// its compute only where a cap was asked for (ComputeLimitPercent). The
// compute the scheduler counted is no cap: the GPU time-slices between the
// servers of different shares' daemons, so a cap keeps no share from
// slowing another, and on a real GPU it only slowed the share that held it
// (docs/sharing.md). A share prepared by a plugin from before this rule
// keeps the daemon it was given, capped at its compute.
func (s Sharing) Limits() gpuv1alpha1.Share {
	return gpuv1alpha1.Share{ComputePercent: s.ComputeLimitPercent, MemoryBytes: s.Share.MemoryBytes}
}

// Profiling is the profiling setup of a claim.
type Profiling struct {
	ReportDir string `json:"reportDir,omitempty"`
	// Profile names the WorkloadProfile the report goes to; the claim may be
	// gone from the API by the time it is unprepared.
	Profile string `json:"profile,omitempty"`
	// Config is the claim's profiling configuration as JSON, kept so that a
	// CDI spec lost in a crash can be written again identically.
	Config json.RawMessage `json:"config,omitempty"`
}

func (d *Data) clone() *Data {
	out := &Data{Claims: make(map[string]Claim, len(d.Claims)), Taints: maps.Clone(d.Taints), MPSDaemons: maps.Clone(d.MPSDaemons)}
	for uid, c := range d.Claims {
		out.Claims[uid] = c.clone()
	}
	return out
}

func (c Claim) clone() Claim {
	if c.Devices != nil {
		devs := make([]Device, len(c.Devices))
		for i, d := range c.Devices {
			d.Requests = slices.Clone(d.Requests)
			d.CDIDeviceIDs = slices.Clone(d.CDIDeviceIDs)
			if d.Sharing != nil {
				s := *d.Sharing
				d.Sharing = &s
			}
			if d.MIG != nil {
				m := *d.MIG
				d.MIG = &m
			}
			devs[i] = d
		}
		c.Devices = devs
	}
	if c.Profiling != nil {
		p := *c.Profiling
		p.Config = slices.Clone(p.Config)
		c.Profiling = &p
	}
	return c
}

// validate rejects content that the recovery logic could not act on. It
// runs before every write, so that a bug in a caller cannot persist a file
// that the next start would have to move aside.
func (d *Data) validate() error {
	var errs []error
	for _, uid := range slices.Sorted(maps.Keys(d.Claims)) {
		c := d.Claims[uid]
		switch {
		case uid == "":
			errs = append(errs, errors.New("claim with empty UID"))
		case c.UID != uid:
			errs = append(errs, fmt.Errorf("claim %s is stored under UID %q", c.UID, uid))
		}
		if c.State != PrepareStarted && c.State != PrepareCompleted {
			errs = append(errs, fmt.Errorf("claim %s has unknown state %q", uid, c.State))
		}
	}
	for _, name := range slices.Sorted(maps.Keys(d.Taints)) {
		if t := d.Taints[name]; name == "" || t.Key == "" || t.Effect == "" {
			errs = append(errs, fmt.Errorf("taint of device %q lacks a device name, key or effect", name))
		}
	}
	for _, key := range slices.Sorted(maps.Keys(d.MPSDaemons)) {
		if m := d.MPSDaemons[key]; key == "" || m.UUID == "" || m.PipeDir == "" || m.LogDir == "" || m.Limits.Validate() != nil {
			errs = append(errs, fmt.Errorf("MPS daemon %q lacks a key, a GPU UUID, a pipe or a log directory, or has limits out of range", key))
		}
	}
	return errors.Join(errs...)
}
