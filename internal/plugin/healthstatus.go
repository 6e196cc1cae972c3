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
	"cmp"
	"context"
	"fmt"
	"slices"
	"strings"
	"time"

	"k8s.io/dynamic-resource-allocation/kubeletplugin"
	"k8s.io/klog/v2"

	"github.com/prismgpu/prism/pkg/gpu/nvml"
)

// The kubelet shows the health of a pod's devices in its status
// (containerStatuses[].allocatedResourcesStatus, Kubernetes feature gate
// ResourceHealthStatus). Prism tells it what its device taints say: a
// tainted GPU is Unhealthy, with the Xid that tainted it, an untainted one
// Healthy, or Unknown if NVML's Xid events cannot be watched at all. There
// is no second record of health: each report is read from the taints and
// the discovered GPUs as they are when it is sent.

// healthLease is how long the kubelet trusts a reported health before it
// shows the GPU's health as Unknown; reports are sent again well within it,
// changed or not, for as long as the kubelet watches.
const (
	healthLease       = 30 * time.Second
	healthResendEvery = healthLease / 3
)

// reportTo reports the health of the node's GPUs to the kubelet:
// all of them when the stream opens, again whenever one changes, and again
// every healthResendEvery. Each kubelet stream has its own call; they share
// nothing but the driver's state.
func (h *healthWatch) reportTo(ctx context.Context, reports chan<- kubeletplugin.DeviceHealthReport) error {
	if h.cfg == nil {
		return kubeletplugin.ErrHealthNotSupported
	}
	logger := klog.FromContext(ctx)
	resend := h.clock.NewTicker(healthResendEvery)
	defer resend.Stop()
	var sent []kubeletplugin.DeviceHealth
	due := true
	for {
		changed := h.pool.changed.wait()
		devices, discovered := h.deviceHealth()
		if discovered && (due || !slices.Equal(devices, sent)) {
			report := kubeletplugin.DeviceHealthReport{Devices: slices.Clone(devices)}
			now := h.clock.Now()
			for i := range report.Devices {
				report.Devices[i].LastUpdated = now
			}
			select {
			case <-ctx.Done():
				return nil
			case <-changed:
				// Newer state: send that instead.
				continue
			case reports <- report:
				logger.V(5).Info("Reported GPU health to the kubelet", "devices", len(devices))
				sent, due = devices, false
			}
		}
		select {
		case <-ctx.Done():
			return nil
		case <-changed:
		case <-resend.C():
			due = true
		}
	}
}

// deviceHealth is the health of the published GPUs, in index order, without
// LastUpdated. discovered is false until the GPUs were first read: a report
// then would say the node has none.
func (h *healthWatch) deviceHealth() (devices []kubeletplugin.DeviceHealth, discovered bool) {
	h.gpus.mu.RLock()
	defer h.gpus.mu.RUnlock()
	if h.gpus.byName == nil {
		return nil, false
	}
	names := make([]string, 0, len(h.gpus.byName))
	for name := range h.gpus.byName {
		names = append(names, name)
	}
	for _, dev := range h.gpus.rememberedDevicesLocked() {
		names = append(names, dev.Name)
	}
	slices.SortFunc(names, func(a, b string) int { return cmp.Compare(deviceIndex(a), deviceIndex(b)) })
	devices = make([]kubeletplugin.DeviceHealth, 0, len(names))
	for _, name := range names {
		dh := kubeletplugin.DeviceHealth{PoolName: h.node.Name, DeviceName: name, Health: kubeletplugin.HealthStatusHealthy, HealthCheckTimeout: healthLease}
		if u, tainted := h.gpus.unhealthy[name]; tainted {
			dh.Health, dh.Message = kubeletplugin.HealthStatusUnhealthy, healthMessage(u)
		} else if h.gpus.unwatched != nil {
			dh.Health, dh.Message = kubeletplugin.HealthStatusUnknown, "Xid events are not watched: "+h.gpus.unwatched.Error()
		}
		devices = append(devices, dh)
	}
	return devices, true
}

// healthMessage says why a GPU is unhealthy: the Xid, or that NVML cannot
// read it, and its taint. It stays the same while the taint does, since
// the kubelet updates the pods for every new message.
func healthMessage(u unhealthy) string {
	taint := fmt.Sprintf("tainted %s=%s:%s", u.taint.Key, u.taint.Value, u.taint.Effect)
	switch {
	case u.taint.Value != lostValue:
		return fmt.Sprintf("Xid %s, a fatal GPU error; %s", strings.TrimPrefix(u.taint.Value, "xid-"), taint)
	case u.xid == nvml.XIDGPULost:
		return fmt.Sprintf("Xid %d, the GPU fell off the bus; %s", nvml.XIDGPULost, taint)
	default:
		return "NVML cannot read the GPU; " + taint
	}
}

// notWatched records that NVML's Xid events cannot be watched, so
// that the untainted GPUs are reported Unknown rather than Healthy.
func (h *healthWatch) notWatched(err error) {
	h.gpus.mu.Lock()
	h.gpus.unwatched = err
	h.gpus.mu.Unlock()
	h.pool.changed.notify()
}
