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
	"time"

	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/dynamic-resource-allocation/kubeletplugin"
	"k8s.io/dynamic-resource-allocation/resourceslice"
	"k8s.io/klog/v2"
)

// The kubelet's calls, as kubeletplugin.DRAPlugin names them: each counts
// and times the call and hands it to the part of the plugin that does it.
var _ kubeletplugin.DRAPlugin = (*Driver)(nil)

// PrepareResourceClaims prepares the claims of one kubelet call together,
// so that the checkpoint is written twice per call rather than per claim,
// but judges each on its own: one claim's bad config or conflict fails only
// that claim, and the kubelet shows the error in the pod's events.
func (d *Driver) PrepareResourceClaims(ctx context.Context, claims []*resourceapi.ResourceClaim) (map[types.UID]kubeletplugin.PrepareResult, error) {
	defer span(ctx, stageDriverTotal)()
	start := time.Now()
	defer func() { d.metrics.duration.WithLabelValues("prepare").Observe(time.Since(start).Seconds()) }()
	results := make(map[types.UID]kubeletplugin.PrepareResult, len(claims))
	for uid, res := range d.state.prepareClaims(ctx, claims) {
		if res.Err != nil {
			klog.FromContext(ctx).Error(res.Err, "Prepare failed", "claimUID", uid)
			d.metrics.requests.WithLabelValues("prepare", "error").Inc()
		} else {
			d.metrics.requests.WithLabelValues("prepare", "success").Inc()
		}
		results[uid] = res
	}
	d.state.updateGauges()
	return results, nil
}

// UnprepareResourceClaims releases the claims of one kubelet call together.
// A claim the plugin does not know was never prepared here or was already
// released: that is success.
func (d *Driver) UnprepareResourceClaims(ctx context.Context, claims []kubeletplugin.NamespacedObject) (map[types.UID]error, error) {
	defer span(ctx, stageDriverTotal)()
	start := time.Now()
	defer func() { d.metrics.duration.WithLabelValues("unprepare").Observe(time.Since(start).Seconds()) }()
	results := d.state.unprepareClaims(ctx, claims)
	for _, claim := range claims {
		if err := results[claim.UID]; err != nil {
			err = fmt.Errorf("unprepare claim %s: %w", claim.String(), err)
			results[claim.UID] = err
			klog.FromContext(ctx).Error(err, "Unprepare failed")
			d.metrics.requests.WithLabelValues("unprepare", "error").Inc()
		} else {
			d.metrics.requests.WithLabelValues("unprepare", "success").Inc()
		}
	}
	d.state.updateGauges()
	return results, nil
}

// WatchHealthStatus reports the health of the node's GPUs to the kubelet
// (healthWatch.reportTo).
func (d *Driver) WatchHealthStatus(ctx context.Context, reports chan<- kubeletplugin.DeviceHealthReport) error {
	return d.health.reportTo(ctx, reports)
}

// HandleError is called by the helper for errors it cannot return to anyone,
// such as a failure to publish the slice.
func (d *Driver) HandleError(ctx context.Context, err error, msg string) {
	var dropped *resourceslice.DroppedFieldsError
	if errors.As(err, &dropped) {
		d.pool.reportDroppedFields(ctx, dropped)
		return
	}
	klog.FromContext(ctx).Error(err, msg)
	d.metrics.claimErrors.WithLabelValues("background", "helper").Inc()
}
