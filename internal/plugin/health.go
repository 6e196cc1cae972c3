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
	"strconv"
	"time"

	gonvml "github.com/NVIDIA/go-nvml/pkg/nvml"
	corev1 "k8s.io/api/core/v1"
	resourceapi "k8s.io/api/resource/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/tools/record"
	"k8s.io/klog/v2"
	"k8s.io/utils/clock"

	"github.com/prismgpu/prism/internal/plugin/checkpoint"
	"github.com/prismgpu/prism/pkg/gpu/nvml"
)

// HealthConfig turns on health watching.
type HealthConfig struct {
	// NVML is watched for Xid events; it must stay initialised-able for the
	// plugin's lifetime.
	NVML gonvml.Interface
	// IgnoredXIDs are the application's fault (a bad kernel, a page fault),
	// not the GPU's, and taint nothing.
	IgnoredXIDs map[uint64]bool
	// RecoverAfter is how long a GPU must go without a new fatal event
	// before its taint is removed. A lost GPU's taint is not: it is lifted
	// only when NVML reads the GPU again.
	RecoverAfter time.Duration
	// Retry paces the attempts to read a GPU that NVML cannot read when
	// the watch starts; zero means nvml.DefaultHealthRetry.
	Retry wait.Backoff
}

// DefaultIgnoredXIDs are Xids caused by applications rather than the GPU:
// 13 graphics engine exception, 31 memory page fault, 43 GPU stopped
// processing, 45 preemptive cleanup, 68 video processor exception, 109
// context switch timeout.
var DefaultIgnoredXIDs = []uint64{13, 31, 43, 45, 68, 109}

// healthWatch keeps the node's GPUs and their taints current: it reads the
// GPUs again (rediscover), taints a GPU on a fatal Xid or when NVML cannot
// read it, lifts a taint after a quiet period or when a lost GPU reads
// again, records the taints in the checkpoint, and tells the kubelet
// (reportTo). Every change is published through the pool.
type healthWatch struct {
	// cfg is nil where Xid events are not watched; rediscovery still
	// taints the GPUs NVML cannot read.
	cfg        *HealthConfig
	inventory  nvml.Inventory
	gpus       *nodeGPUs
	checkpoint *checkpoint.Store
	guard      *guard
	pool       *slicePool
	partitions *migPartitions
	recorder   record.EventRecorder
	node       *corev1.ObjectReference
	metrics    *Metrics
	clock      clock.WithTicker
}

func (h *healthWatch) watch(ctx context.Context) {
	logger := klog.FromContext(ctx)
	events := make(chan nvml.HealthEvent, 16)
	go func() {
		if err := nvml.WatchHealth(ctx, h.cfg.NVML, events, h.cfg.Retry); err != nil {
			logger.Error(err, "GPU health is not watched")
			h.notWatched(err)
		}
	}()
	recheck := h.clock.NewTicker(max(h.cfg.RecoverAfter/4, 100*time.Millisecond))
	defer recheck.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case ev := <-events:
			h.handleEvent(ctx, ev)
		case <-recheck.C():
			h.recoverQuietGPUs(ctx)
		}
	}
}

func (h *healthWatch) handleEvent(ctx context.Context, ev nvml.HealthEvent) {
	logger := klog.FromContext(ctx)
	if ev.Unreadable != nil {
		h.handleUnreadable(ctx, ev.Index, ev.Unreadable)
		return
	}
	dev, ok := h.gpus.withUUID(ev.UUID)
	if !ok {
		return
	}
	name := dev.Name()
	if h.cfg.IgnoredXIDs[ev.XID] {
		logger.V(2).Info("Ignoring an application Xid", "device", name, "xid", ev.XID)
		h.metrics.healthEvents.WithLabelValues("ignored").Inc()
		return
	}
	// An Xid of a MIG instance taints the partition that holds it, whose
	// taint record, like its GPU's, is kept under its device name.
	what, instance := fmt.Sprintf("GPU %s (%s)", name, ev.UUID), []any{}
	if ev.GPUInstance != nil && ev.XID != nvml.XIDGPULost {
		if partition, ok := h.partitions.ofInstance(ev.UUID, *ev.GPUInstance); ok {
			name = partition
			what = fmt.Sprintf("MIG partition %s (GPU instance %d of GPU %s)", name, *ev.GPUInstance, ev.UUID)
			instance = []any{"gpuInstance", *ev.GPUInstance}
		} else {
			// Not an instance Prism created and recorded (an operator's, or
			// one whose creation a prepare has not recorded yet): the fault
			// cannot be placed, so the whole GPU and all its partitions are
			// tainted, the safe side.
			logger.Info("Xid names a GPU instance that no prepared partition holds; tainting the whole GPU",
				"device", name, "uuid", ev.UUID, "gpuInstance", *ev.GPUInstance, "xid", ev.XID)
		}
	}
	effect, value, xid := resourceapi.DeviceTaintEffectNoSchedule, "xid-"+strconv.FormatUint(ev.XID, 10), ev.XID
	if ev.XID == nvml.XIDGPULost {
		effect, value = resourceapi.DeviceTaintEffectNoExecute, lostValue
	}
	now := h.clock.Now()
	h.gpus.mu.Lock()
	prev, had := h.gpus.unhealthy[name]
	if had && prev.taint.Value == lostValue && value != lostValue {
		// A lost GPU stays lost; a later Xid must not weaken its taint.
		effect, value = prev.taint.Effect, prev.taint.Value
	}
	if had && prev.taint.Value == value {
		// The same taint keeps its cause, and the kubelet its message.
		xid = prev.xid
	}
	h.gpus.unhealthy[name] = unhealthy{uuid: ev.UUID, taint: newTaint(value, effect, now), lastEvent: now, xid: xid}
	h.gpus.mu.Unlock()
	h.metrics.healthEvents.WithLabelValues("fatal").Inc()
	if had && prev.taint.Value == value {
		return
	}
	logger.Info("GPU unhealthy, tainting it", append([]any{"device", name, "uuid", ev.UUID, "xid", ev.XID, "effect", effect}, instance...)...)
	h.recorder.Eventf(h.node, corev1.EventTypeWarning, "GPUUnhealthy", "%s reported Xid %d; tainted %s=%s:%s", what, ev.XID, TaintKey, value, effect)
	h.saveTaints(ctx)
	h.republish(ctx)
}

// recoverQuietGPUs lifts the NoSchedule taints of GPUs that raised no
// fatal event for RecoverAfter. Lost GPUs are left to rediscover.
func (h *healthWatch) recoverQuietGPUs(ctx context.Context) {
	var changes []healthChange
	now := h.clock.Now()
	h.gpus.mu.Lock()
	for name, u := range h.gpus.unhealthy {
		if u.taint.Value != lostValue && now.Sub(u.lastEvent) >= h.cfg.RecoverAfter {
			delete(h.gpus.unhealthy, name)
			changes = append(changes, healthChange{device: name, uuid: u.uuid, reason: fmt.Sprintf("no fatal event for %s", h.cfg.RecoverAfter)})
		}
	}
	h.gpus.mu.Unlock()
	if len(changes) > 0 {
		h.reportChanges(ctx, changes)
		h.republish(ctx)
	}
}

// reportChanges logs and announces taints that rediscovery or the
// quiet period changed, and persists the result.
func (h *healthWatch) reportChanges(ctx context.Context, changes []healthChange) {
	if len(changes) == 0 {
		return
	}
	logger := klog.FromContext(ctx)
	save := false
	for _, c := range changes {
		switch {
		case c.unpublished:
			logger.Error(errors.New(c.reason), "GPU cannot be read and was not read since the plugin started; not publishing it until NVML reads it", "device", c.device)
			h.recorder.Eventf(h.node, corev1.EventTypeWarning, "GPUUnhealthy", "GPU %s cannot be read through NVML (%s) and was not read since the plugin started, so it is not published until NVML reads it", c.device, c.reason)
		case c.tainted:
			save = true
			logger.Info("GPU cannot be read, tainting it lost", "device", c.device, "uuid", c.uuid, "reason", c.reason)
			h.metrics.healthEvents.WithLabelValues("unreadable").Inc()
			h.recorder.Eventf(h.node, corev1.EventTypeWarning, "GPUUnhealthy", "GPU %s (%s) cannot be read through NVML (%s); tainted %s=%s:%s", c.device, uuidOrUnknown(c.uuid), c.reason, TaintKey, lostValue, resourceapi.DeviceTaintEffectNoExecute)
		default:
			save = true
			logger.Info("GPU healthy again, removing its taint", "device", c.device, "uuid", c.uuid, "reason", c.reason)
			h.metrics.healthEvents.WithLabelValues("recovered").Inc()
			h.recorder.Eventf(h.node, corev1.EventTypeNormal, "GPURecovered", "GPU %s (%s): %s; taint removed", c.device, uuidOrUnknown(c.uuid), c.reason)
		}
	}
	if save {
		h.saveTaints(ctx)
	}
}

func uuidOrUnknown(uuid string) string {
	if uuid == "" {
		return "UUID unknown"
	}
	return uuid
}

func (h *healthWatch) republish(ctx context.Context) {
	if err := h.pool.publish(ctx); err != nil {
		klog.FromContext(ctx).Error(err, "Republishing after a health change")
	}
}

// saveTaints records the current taints in the checkpoint, so that a
// restart does not offer a faulty GPU again.
func (h *healthWatch) saveTaints(ctx context.Context) {
	err := h.guard.exclusive(ctx, func() error {
		h.gpus.mu.RLock()
		taints := make(map[string]checkpoint.Taint, len(h.gpus.unhealthy))
		for name, u := range h.gpus.unhealthy {
			taints[name] = checkpoint.Taint{UUID: u.uuid, Key: u.taint.Key, Value: u.taint.Value, Effect: string(u.taint.Effect), TimeAdded: u.taint.TimeAdded.Time}
		}
		h.gpus.mu.RUnlock()
		return h.checkpoint.Update(ctx, func(data *checkpoint.Data) error {
			data.Taints = taints
			return nil
		})
	})
	if err != nil {
		klog.FromContext(ctx).Error(err, "Recording GPU taints; a restart would offer the GPUs again")
	}
}

// restoreTaints takes up the taints of the previous run. Each counts as
// fresh for the quiet period: the plugin cannot know whether the GPU
// raised events while it was down.
func (h *healthWatch) restoreTaints(ctx context.Context) {
	now := h.clock.Now()
	h.gpus.mu.Lock()
	defer h.gpus.mu.Unlock()
	for name, t := range h.checkpoint.Taints() {
		h.gpus.unhealthy[name] = unhealthy{
			uuid:      t.UUID,
			taint:     resourceapi.DeviceTaint{Key: t.Key, Value: t.Value, Effect: resourceapi.DeviceTaintEffect(t.Effect), TimeAdded: &metav1.Time{Time: t.TimeAdded}},
			lastEvent: now,
		}
		klog.FromContext(ctx).Info("GPU still tainted from before the restart", "device", name, "uuid", t.UUID, "taint", t.Value, "effect", t.Effect)
	}
}

// handleUnreadable taints the GPU at index that the health watcher cannot
// read, as a rediscovery would.
func (h *healthWatch) handleUnreadable(ctx context.Context, index int, why error) {
	claimed := h.claimedDevices()
	h.gpus.mu.Lock()
	change, report := h.gpus.taintUnreadableLocked(index, why, claimed, h.clock.Now())
	h.gpus.mu.Unlock()
	if report {
		h.reportChanges(ctx, []healthChange{change})
	}
	if _, err := h.pool.publishIfChanged(ctx, false); err != nil {
		klog.FromContext(ctx).Error(err, "Republishing after a health change")
	}
}

// claimedDevices are the names of this node's devices that prepared claims
// hold.
func (h *healthWatch) claimedDevices() map[string]bool {
	claimed := map[string]bool{}
	for _, c := range h.checkpoint.List() {
		for _, dev := range c.Devices {
			if dev.Pool == "" || dev.Pool == h.node.Name {
				claimed[dev.Name] = true
			}
		}
	}
	return claimed
}
