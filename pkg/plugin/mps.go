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
	"path/filepath"
	"slices"

	corev1 "k8s.io/api/core/v1"
	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/klog/v2"
	cdispec "tags.cncf.io/container-device-interface/specs-go"

	"github.com/prismgpu/prism/pkg/checkpoint"
	"github.com/prismgpu/prism/pkg/gpu"
	"github.com/prismgpu/prism/pkg/mps"
)

// newMPS makes the MPS daemon manager once the checkpoint is open, and says
// once, in the log and as a Node Event, when shares cannot be enforced.
func (d *Driver) newMPS(ctx context.Context) {
	root := d.cfg.MPSDriverRoot
	d.mps = mps.New(mps.Options{
		DriverRoot: root,
		Root:       filepath.Join(d.cfg.StateDir, "mps"),
		Checkpoint: d.checkpoint,
		Registerer: d.metrics.Registry,
	})
	if root == "" {
		return
	}
	logger := klog.FromContext(ctx)
	if err := d.mps.Unavailable(); err != nil {
		logger.Info("MPS is unavailable: GPU shares run time-sliced and their memory limits are not enforced", "reason", err.Error())
		d.recorder.Eventf(d.nodeRef(), corev1.EventTypeWarning, "MPSUnavailable",
			"Shares of GPUs on node %s run time-sliced, their compute and memory limits not enforced: %v", d.cfg.NodeName, err)
		return
	}
	if err := d.mps.Unbounded(); err != nil {
		logger.Error(err, "MPS pipe directories are not size-limited; a container of a GPU share can fill the state directory's file system", "stateDir", d.cfg.StateDir)
		d.recorder.Eventf(d.nodeRef(), corev1.EventTypeWarning, "MPSPipeDirUnbounded",
			"MPS pipe directories on node %s are not size-limited, so a container of a GPU share can fill %s: %v", d.cfg.NodeName, d.cfg.StateDir, err)
		return
	}
	logger.Info("MPS pipe directories are size-limited", "bytes", mps.PipeDirSize)
}

// mpsShare says whether a device is a share that MPS should enforce: a
// share of part of the GPU (see sharedDevice). A share of the whole GPU,
// which a claim that names no amount gets on a shareable GPU, has the GPU
// to itself and is not one. plan refuses a share whose config sets a
// strategy a share cannot take, so that no claim's config takes its share
// out of MPS.
func mpsShare(dev checkpoint.Device, g gpu.Device) bool {
	s := dev.Sharing
	if dev.ShareID == "" || s == nil {
		return false
	}
	partialCompute := s.ComputePercent > 0 && s.ComputePercent < 100
	partialMemory := s.MemoryShareBytes > 0 && int64(g.MemoryBytes)-s.MemoryShareBytes >= gpu.MemoryShareStep.Value()
	return partialCompute || partialMemory
}

// planMPS marks the claim's shares that MPS enforces. A container has one
// CUDA_MPS_PIPE_DIRECTORY, so a claim with shares of several GPUs cannot
// be enforced by their daemons, one per GPU, and runs time-sliced.
func (d *Driver) planMPS(claim *resourceapi.ResourceClaim, devices []checkpoint.Device) {
	var shares []int
	for i, dev := range devices {
		if g, ok := d.gpus.get(dev.Name); ok && mpsShare(dev, g) {
			shares = append(shares, i)
		}
	}
	var why error
	switch {
	case len(shares) == 0:
		return
	case d.mps.Unavailable() != nil:
		why = d.mps.Unavailable()
	case len(shares) > 1:
		why = errors.New("the claim holds shares of several GPUs, and a container can use the MPS daemon of only one")
	}
	if why != nil {
		d.metrics.claimErrors.WithLabelValues("prepare", "mps-unavailable").Inc()
		d.recorder.Eventf(claim, corev1.EventTypeWarning, "MPSUnavailable",
			"The GPU share runs time-sliced on node %s, its compute and memory limits only advertised to the workload: %v", d.cfg.NodeName, why)
		return
	}
	devices[shares[0]].Sharing.MPS = true
}

// mpsEdits are the container edits of a device whose share MPS enforces.
func (d *Driver) mpsEdits(dev checkpoint.Device, uuid string) *cdispec.ContainerEdits {
	if dev.Sharing == nil || !dev.Sharing.MPS {
		return nil
	}
	return mps.ClientEdits(d.mps.PipeDir(uuid), mps.Limits{ComputePercent: dev.Sharing.ComputePercent, MemoryBytes: dev.Sharing.MemoryShareBytes})
}

// startMPS makes sure the daemons of the claim's MPS shares run. A daemon
// that cannot start does not fail the prepare: the share then runs
// time-sliced, which a pod stuck in ContainerCreating would not be better
// off without. The claim's Event says so.
func (d *Driver) startMPS(ctx context.Context, claim *resourceapi.ResourceClaim, rec checkpoint.Claim) {
	for _, dev := range rec.Devices {
		if dev.Sharing == nil || !dev.Sharing.MPS {
			continue
		}
		g, ok := d.gpus.get(dev.Name)
		if !ok {
			continue
		}
		err := d.mps.Ensure(ctx, g.UUID)
		var replaced *mps.ReplacedError
		if errors.As(err, &replaced) {
			d.mpsReplaced(claim, g.UUID, replaced)
		} else if err != nil {
			klog.FromContext(ctx).Error(err, "Starting the MPS control daemon; the share runs time-sliced", "claim", klog.KObj(claim), "uuid", g.UUID)
			d.metrics.claimErrors.WithLabelValues("prepare", "mps-daemon").Inc()
			d.recorder.Eventf(claim, corev1.EventTypeWarning, "MPSDaemonFailed",
				"The MPS control daemon of device %s on node %s did not start, so the GPU share runs time-sliced: %v", dev.Name, d.cfg.NodeName, err)
		}
	}
}

// mpsReplaced tells those whose containers lost their MPS server when a
// GPU's daemon was replaced: the node, and each other claim that holds an
// MPS share of the GPU. The claim being prepared uses the new daemon.
func (d *Driver) mpsReplaced(claim *resourceapi.ResourceClaim, uuid string, replaced *mps.ReplacedError) {
	d.recorder.Eventf(d.nodeRef(), corev1.EventTypeWarning, "MPSDaemonReplaced",
		"On node %s, %v; containers of its shares that used it have lost their MPS server and must be restarted", d.cfg.NodeName, replaced)
	d.checkpoint.Range(func(c *checkpoint.Claim) bool {
		if c.UID == string(claim.UID) || !slices.ContainsFunc(c.Devices, func(dev checkpoint.Device) bool {
			g, ok := d.gpus.get(dev.Name)
			return ok && g.UUID == uuid && dev.Sharing != nil && dev.Sharing.MPS
		}) {
			return true
		}
		ref := &corev1.ObjectReference{Kind: "ResourceClaim", APIVersion: resourceapi.SchemeGroupVersion.String(), Namespace: c.Namespace, Name: c.Name, UID: types.UID(c.UID)}
		d.recorder.Eventf(ref, corev1.EventTypeWarning, "MPSDaemonReplaced",
			"On node %s, %v; this claim's containers that used it have lost their MPS server and must be restarted", d.cfg.NodeName, replaced)
		return true
	})
}

// mpsNeeded lists the GPUs whose prepared claims hold MPS shares.
func (d *Driver) mpsNeeded() map[string]bool {
	need := map[string]bool{}
	d.checkpoint.Range(func(c *checkpoint.Claim) bool {
		for _, dev := range c.Devices {
			if dev.Sharing == nil || !dev.Sharing.MPS {
				continue
			}
			if g, ok := d.gpus.get(dev.Name); ok {
				need[g.UUID] = true
			}
		}
		return true
	})
	return need
}

// stopUnneededMPS stops the daemons of GPUs that no prepared claim shares
// through MPS any more; it runs after claims are forgotten. A daemon that
// cannot be stopped keeps its record and is stopped by the next start.
func (d *Driver) stopUnneededMPS(ctx context.Context) {
	daemons := d.checkpoint.MPSDaemons()
	if len(daemons) == 0 {
		return
	}
	need := d.mpsNeeded()
	for uuid := range daemons {
		if need[uuid] {
			continue
		}
		if err := d.mps.Stop(ctx, uuid); err != nil {
			klog.FromContext(ctx).Error(err, "Stopping the MPS control daemon of a GPU without shares", "uuid", uuid)
		}
	}
}

// recoverMPS adopts, replaces or stops the recorded daemons at start-up,
// once the claims are reconciled.
func (d *Driver) recoverMPS(ctx context.Context) {
	if err := d.mps.Recover(ctx, d.mpsNeeded()); err != nil {
		klog.FromContext(ctx).Error(err, "Recovering MPS control daemons was incomplete; shares of the GPUs concerned run time-sliced")
		d.recorder.Eventf(d.nodeRef(), corev1.EventTypeWarning, "MPSDaemonFailed",
			"Prism could not recover every MPS control daemon on node %s; shares of the GPUs concerned run time-sliced: %v", d.cfg.NodeName, err)
	}
}

// deviceEdits are a device's sharing edits: what the workload is told of
// its share, and, where MPS enforces it, how to reach the GPU's daemon.
func (d *Driver) deviceEdits(dev checkpoint.Device, uuid string) *cdispec.ContainerEdits {
	base, enforced := sharingEdits(dev.Sharing), d.mpsEdits(dev, uuid)
	if enforced == nil {
		return base
	}
	if base != nil {
		enforced.Env = append(base.Env, enforced.Env...)
	}
	return enforced
}
