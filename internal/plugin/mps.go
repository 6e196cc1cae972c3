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
	"maps"
	"slices"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	corev1 "k8s.io/api/core/v1"
	resourceapi "k8s.io/api/resource/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/record"
	"k8s.io/klog/v2"
	cdispec "tags.cncf.io/container-device-interface/specs-go"

	"github.com/prismgpu/prism/internal/plugin/checkpoint"
	"github.com/prismgpu/prism/internal/plugin/mps"
	"github.com/prismgpu/prism/pkg/gpu"
)

// mpsShares runs the MPS control daemons that enforce shares of GPUs, one
// per share: it marks the shares MPS can enforce at plan, starts each
// one's daemon with its limits at prepare, gives its containers the
// daemon's pipe and shared-memory directories and stops the daemon once
// its share is unprepared. A daemon of its own per share is what lets MPS
// enforce each share's limits and keeps tenants apart (see package mps).
type mpsShares struct {
	daemons    *mps.Manager
	gpus       *nodeGPUs
	checkpoint *checkpoint.Store
	recorder   record.EventRecorder
	// kube reads the claims whose pods hear of a replaced daemon.
	kube kubernetes.Interface
	// claimErrors is the plugin's claim_errors_total.
	claimErrors *prometheus.CounterVec
	node        *corev1.ObjectReference
}

// open makes the MPS daemon manager once the checkpoint is open, and says
// once, in the log and as a Node Event, when shares cannot be enforced.
func (m *mpsShares) open(ctx context.Context, opts mps.Options) {
	m.daemons = mps.New(opts)
	if opts.DriverRoot == "" {
		return
	}
	logger := klog.FromContext(ctx)
	if err := m.daemons.Unavailable(); err != nil {
		logger.Info("MPS is unavailable: GPU shares run time-sliced and their memory limits are not enforced", "reason", err.Error())
		m.recorder.Eventf(m.node, corev1.EventTypeWarning, "MPSUnavailable",
			"Shares of GPUs on node %s run time-sliced, their memory limits and compute caps not enforced: %v", m.node.Name, err)
		return
	}
	if opts.Pods != nil {
		logger.Info("MPS control daemons run in pods of their own, which outlive the plugin's", "namespace", opts.Pods.Namespace, "image", opts.Pods.Image)
	}
	if err := m.daemons.Unbounded(); err != nil {
		logger.Error(err, "MPS pipe directories are not size-limited; a container of a GPU share can fill the state directory's file system", "root", opts.Root)
		m.recorder.Eventf(m.node, corev1.EventTypeWarning, "MPSPipeDirUnbounded",
			"MPS pipe directories on node %s are not size-limited, so a container of a GPU share can fill %s: %v", m.node.Name, opts.Root, err)
		return
	}
	logger.Info("MPS pipe directories are size-limited", "bytes", mps.PipeDirSize)
}

// partOfGPU says whether a device is a share of part of the GPU: of part
// of its compute or of its memory (see sharedDevice). A share of the whole
// GPU, which a claim that names no amount gets on a shareable GPU, has the
// GPU to itself and is not one.
func partOfGPU(dev checkpoint.Device, g gpu.Device) bool {
	s := dev.Sharing
	if dev.ShareID == "" || s == nil {
		return false
	}
	return s.Share.LimitsCompute() || partOfMemory(*s, g)
}

func partOfMemory(s checkpoint.Sharing, g gpu.Device) bool {
	return s.Share.LimitsMemory() && int64(g.MemoryBytes)-s.Share.MemoryBytes >= gpu.MemoryShareStep.Value()
}

// mpsShare says whether a device is a share that MPS should enforce: a
// share of part of the GPU's memory, or one whose config caps its compute
// (see checkpoint.Sharing.Limits). A share of compute alone has nothing
// for MPS to hold it to, and runs time-sliced, as the servers of shares'
// daemons do anyway.
func mpsShare(dev checkpoint.Device, g gpu.Device) bool {
	return partOfGPU(dev, g) && (dev.Sharing.Limits().LimitsCompute() || partOfMemory(*dev.Sharing, g))
}

// plan marks the claim's shares that MPS enforces, each with a daemon of
// its own. A container has one CUDA_MPS_PIPE_DIRECTORY, so a claim with
// shares of several GPUs cannot be enforced by their daemons, and runs
// time-sliced.
func (m *mpsShares) plan(claim *resourceapi.ResourceClaim, devices []checkpoint.Device) {
	var shares []int
	for i, dev := range devices {
		if g, ok := m.gpus.get(dev.Name); ok && mpsShare(dev, g) {
			shares = append(shares, i)
		}
	}
	var why error
	switch {
	case len(shares) == 0:
		return
	case m.daemons.Unavailable() != nil:
		why = m.daemons.Unavailable()
	case len(shares) > 1:
		why = errors.New("the claim holds shares of several GPUs, and a container can use the MPS daemon of only one")
	}
	if why != nil {
		m.claimErrors.WithLabelValues("prepare", "mps-unavailable").Inc()
		m.recorder.Eventf(claim, corev1.EventTypeWarning, "MPSUnavailable",
			"The GPU share runs time-sliced on node %s, its memory limit and any compute cap only advertised to the workload: %v", m.node.Name, why)
		return
	}
	dev := &devices[shares[0]]
	dev.Sharing.MPS = true
	dev.Sharing.MPSDaemon = string(claim.UID) + "-" + dev.Name
}

// daemon is the MPS daemon that a device's share uses, if MPS enforces it:
// its own or, for a share prepared when a GPU's shares had one daemon,
// its GPU's, without limits of its own.
func (m *mpsShares) daemon(dev checkpoint.Device) (mps.Daemon, bool) {
	if dev.Sharing == nil || !dev.Sharing.MPS {
		return mps.Daemon{}, false
	}
	g, ok := m.gpus.get(dev.Name)
	if !ok {
		return mps.Daemon{}, false
	}
	if dev.Sharing.MPSDaemon == "" {
		return mps.Daemon{Key: g.UUID, UUID: g.UUID}, true
	}
	return mps.Daemon{Key: dev.Sharing.MPSDaemon, UUID: g.UUID, Limits: dev.Sharing.Limits()}, true
}

// clientEdits are the container edits of a device whose share MPS enforces.
func (m *mpsShares) clientEdits(dev checkpoint.Device) *cdispec.ContainerEdits {
	d, ok := m.daemon(dev)
	if !ok {
		return nil
	}
	var shm string
	if dev.Sharing.MPSDaemon != "" {
		shm = m.daemons.ShmDir(d.Key)
	}
	return mps.ClientEdits(m.daemons.PipeDir(d.Key), shm, dev.Sharing.Limits())
}

// start makes sure the daemons of the claim's MPS shares run. A daemon
// that cannot start does not fail the prepare: the share then runs
// time-sliced, which a pod stuck in ContainerCreating would not be better
// off without. The claim's Event says so.
func (m *mpsShares) start(ctx context.Context, claim *resourceapi.ResourceClaim, rec checkpoint.Claim) {
	for _, dev := range rec.Devices {
		d, ok := m.daemon(dev)
		if !ok {
			continue
		}
		err := m.daemons.Ensure(ctx, d)
		var replaced *mps.ReplacedError
		if errors.As(err, &replaced) {
			m.replaced(ctx, replaced)
		} else if err != nil {
			klog.FromContext(ctx).Error(err, "Starting the MPS control daemon; the share runs time-sliced", "claim", klog.KObj(claim), "uuid", d.UUID)
			m.claimErrors.WithLabelValues("prepare", "mps-daemon").Inc()
			m.recorder.Eventf(claim, corev1.EventTypeWarning, "MPSDaemonFailed",
				"The MPS control daemon of device %s on node %s did not start, so the GPU share runs time-sliced: %v", dev.Name, m.node.Name, err)
		}
	}
}

// replaced tells those whose containers lost their MPS server when a
// daemon was replaced: the node, each prepared claim whose share used it,
// and the pods that the API server says reserve such a claim.
func (m *mpsShares) replaced(ctx context.Context, replaced *mps.ReplacedError) {
	m.recorder.Eventf(m.node, corev1.EventTypeWarning, "MPSDaemonReplaced",
		"On node %s, %v; containers of its shares that used it have lost their MPS server and must be restarted", m.node.Name, replaced)
	for _, c := range m.checkpoint.List() {
		if !slices.ContainsFunc(c.Devices, func(dev checkpoint.Device) bool {
			d, ok := m.daemon(dev)
			return ok && d.Key == replaced.Key
		}) {
			continue
		}
		ref := &corev1.ObjectReference{Kind: "ResourceClaim", APIVersion: resourceapi.SchemeGroupVersion.String(), Namespace: c.Namespace, Name: c.Name, UID: types.UID(c.UID)}
		m.recorder.Eventf(ref, corev1.EventTypeWarning, "MPSDaemonReplaced",
			"On node %s, %v; this claim's containers that used it have lost their MPS server and must be restarted", m.node.Name, replaced)
		for _, pod := range m.reservingPods(ctx, c) {
			m.recorder.Eventf(pod, corev1.EventTypeWarning, "MPSDaemonReplaced",
				"On node %s, the MPS control daemon of this pod's GPU share (claim %s) was replaced: %s; restart the pod's containers that use the GPU, or they run without their MPS server", m.node.Name, c.Name, replaced.Reason)
		}
	}
}

// reservingPods are the pods that the API server says reserve the claim;
// none where it cannot be read, which the log says.
func (m *mpsShares) reservingPods(ctx context.Context, c checkpoint.Claim) []*corev1.ObjectReference {
	if m.kube == nil {
		return nil
	}
	ctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	claim, err := m.kube.ResourceV1().ResourceClaims(c.Namespace).Get(ctx, c.Name, metav1.GetOptions{})
	if err != nil || string(claim.UID) != c.UID {
		klog.FromContext(ctx).Info("Cannot tell the pods of a claim whose MPS daemon was replaced; the claim's Event names it", "claim", klog.KRef(c.Namespace, c.Name), "err", err)
		return nil
	}
	var out []*corev1.ObjectReference
	for _, r := range claim.Status.ReservedFor {
		if r.Resource == "pods" && r.APIGroup == "" {
			out = append(out, &corev1.ObjectReference{Kind: "Pod", APIVersion: "v1", Namespace: c.Namespace, Name: r.Name, UID: r.UID})
		}
	}
	return out
}

// repair replaces each share's daemon that has died, or that its
// containers can no longer reach, since it served: the share's running
// clients have lost their server, and a new process in its containers
// would run without MPS, so without the share's limits, until a daemon is
// back. It runs under the driver lock, every mpsRepairInterval.
func (m *mpsShares) repair(ctx context.Context) {
	recorded := m.checkpoint.MPSDaemons()
	need := m.needed()
	for _, key := range slices.Sorted(maps.Keys(need)) {
		if rec, ok := recorded[key]; !ok || rec.PID <= 0 {
			// Never started, or its start was cut short: nothing served.
			continue
		}
		err := m.daemons.Ensure(ctx, need[key])
		var replaced *mps.ReplacedError
		switch {
		case errors.As(err, &replaced):
			m.replaced(ctx, replaced)
		case err != nil:
			klog.FromContext(ctx).Error(err, "Replacing an MPS control daemon that died; its share runs without MPS until the next try", "daemon", key)
			m.recorder.Eventf(m.node, corev1.EventTypeWarning, "MPSDaemonFailed",
				"On node %s, the MPS control daemon %s died and a fresh one did not start; its share runs without MPS until the next try: %v", m.node.Name, key, err)
		}
	}
}

// needed lists the daemons, by key, that the prepared claims' MPS shares
// use.
func (m *mpsShares) needed() map[string]mps.Daemon {
	need := map[string]mps.Daemon{}
	m.checkpoint.Range(func(c *checkpoint.Claim) bool {
		for _, dev := range c.Devices {
			if d, ok := m.daemon(dev); ok {
				need[d.Key] = d
			}
		}
		return true
	})
	return need
}

// stopUnneeded stops the daemons that no prepared claim's share uses any
// more; it runs after claims are forgotten. A daemon that cannot be
// stopped keeps its record and is stopped by the next start.
func (m *mpsShares) stopUnneeded(ctx context.Context) {
	daemons := m.checkpoint.MPSDaemons()
	if len(daemons) == 0 {
		return
	}
	need := m.needed()
	for key, rec := range daemons {
		if _, ok := need[key]; ok {
			continue
		}
		if err := m.daemons.Stop(ctx, key); err != nil {
			klog.FromContext(ctx).Error(err, "Stopping an MPS control daemon whose share has ended", "daemon", key, "uuid", rec.UUID)
		}
	}
}

// recoverDaemons adopts, replaces or stops the recorded daemons at start-up,
// once the claims are reconciled, and tells the claims and pods of each
// daemon it replaced (after a plugin container restart, every daemon)
// that their containers lost their MPS server.
func (m *mpsShares) recoverDaemons(ctx context.Context) {
	replaced, err := m.daemons.Recover(ctx, m.needed())
	for _, r := range replaced {
		m.replaced(ctx, r)
	}
	if err != nil {
		klog.FromContext(ctx).Error(err, "Recovering MPS control daemons was incomplete; shares of the GPUs concerned run time-sliced")
		m.recorder.Eventf(m.node, corev1.EventTypeWarning, "MPSDaemonFailed",
			"Prism could not recover every MPS control daemon on node %s; shares of the GPUs concerned run time-sliced: %v", m.node.Name, err)
	}
}
