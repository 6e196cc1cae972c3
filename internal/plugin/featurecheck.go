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
	"fmt"
	"sync"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/dynamic-resource-allocation/resourceslice"
	"k8s.io/klog/v2"
)

// Event reasons of apiFeatures, named so that operators' alerts and the
// docs' Event table can rely on them.
const (
	EventReasonDeviceTaintsDropped         = "DeviceTaintsDropped"
	EventReasonConsumableCapacityDropped   = "ConsumableCapacityDropped"
	EventReasonPartitionableDevicesDropped = "PartitionableDevicesDropped"
)

// partitionableDevicesGate governs the shared counters that keep the MIG
// partitions of one GPU, and the GPU itself, from being allocated together.
const partitionableDevicesGate = "DRAPartitionableDevices"

// apiFeature is what the cluster loses when the API server drops, without
// an error, the fields of a published slice that a feature gate governs.
// The gates Prism publishes for are off by default before Kubernetes 1.36,
// so on 1.34 and 1.35 the cluster silently behaves as if the plugin had
// never published them.
type apiFeature struct {
	reason string // the Event's reason
	// lost says what the cluster does without the fields, for the log
	// line and the Event.
	lost string
}

// apiFeatures are keyed by the gate names resourceslice.DroppedFieldsError
// reports.
var apiFeatures = map[string]apiFeature{
	"DRADeviceTaints": {
		reason: EventReasonDeviceTaintsDropped,
		lost:   "the taints Prism set on unhealthy GPUs, so they stay schedulable",
	},
	"DRAConsumableCapacity": {
		reason: EventReasonConsumableCapacityDropped,
		lost:   "the GPUs' shareable memory (--consumable-capacity), so every claim is given whole GPUs",
	},
	// Without its counters every partition and its GPU would look free at
	// once, so the plugin falls back to publishing whole GPUs only.
	partitionableDevicesGate: {
		reason: EventReasonPartitionableDevicesDropped,
		lost:   "the shared counters of GPUs in MIG mode (--feature-gates=MIGPartitions=true), without which partitions of one GPU could be allocated twice over, so Prism publishes whole GPUs only until it restarts",
	},
}

// droppedFeatures remembers which gates were already reported, so that a
// cluster without them gets one log line and one Event per gate, not one
// per publication.
type droppedFeatures struct {
	mu       sync.Mutex
	reported map[string]bool
}

// reportDroppedFields says, once per feature gate, that the API server
// dropped fields of the published slice. The ResourceSlice controller
// compares what it wrote with what the server stored and names the gates;
// it then publishes what the server keeps, so nothing retries.
func (p *slicePool) reportDroppedFields(ctx context.Context, dropped *resourceslice.DroppedFieldsError) {
	logger := klog.FromContext(ctx)
	for _, gate := range dropped.DisabledFeatures() {
		p.metrics.apiFeatureDropped.WithLabelValues(gate).Set(1)
		p.dropped.mu.Lock()
		first := !p.dropped.reported[gate]
		if p.dropped.reported == nil {
			p.dropped.reported = map[string]bool{}
		}
		p.dropped.reported[gate] = true
		p.dropped.mu.Unlock()
		if !first {
			continue
		}
		f, known := apiFeatures[gate]
		if !known {
			// A field Prism does not publish today; the library knows more
			// gates than the plugin uses.
			logger.Error(dropped, "The API server dropped fields of the published ResourceSlice", "featureGate", gate)
			continue
		}
		msg := fmt.Sprintf("The API server dropped %s: enable the %s feature gate on the API server and the scheduler (off by default before Kubernetes 1.36)", f.lost, gate)
		logger.Error(nil, msg, "featureGate", gate, "pool", dropped.PoolName)
		p.recorder.Eventf(p.node, corev1.EventTypeWarning, f.reason, "%s", msg)
		if gate == partitionableDevicesGate {
			// Now, not at the next rediscovery: until then the server holds
			// partitions without counters. The controller calls this
			// without its own lock held, so publishing from here is safe.
			if _, err := p.publishIfChanged(ctx, false); err != nil {
				logger.Error(err, "Republishing whole GPUs only")
			}
		}
	}
}

// has reports whether the API server was seen to lack the gate.
func (f *droppedFeatures) has(gate string) bool {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.reported[gate]
}
