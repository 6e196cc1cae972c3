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
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/klog/v2"

	"github.com/prismgpu/prism/internal/plugin/checkpoint"
)

// collectStaleLoop releases claims whose ResourceClaim no longer exists. The
// kubelet normally unprepares every claim, but not always: a pod deleted while
// the kubelet restarts is cleaned up as an orphan without NodeUnprepareResources,
// and the device would stay blocked on this node for good.
func (d *Driver) collectStaleLoop(ctx context.Context, interval, grace time.Duration) {
	d.every(ctx, interval, func() { d.collectStale(ctx, grace) })
}

func (d *Driver) collectStale(ctx context.Context, grace time.Duration) {
	logger := klog.FromContext(ctx)
	for _, c := range d.state.checkpoint.List() {
		if c.State != checkpoint.PrepareCompleted {
			continue
		}
		stale, err := d.isStale(ctx, c)
		if err != nil {
			logger.V(2).Info("Cannot tell whether a prepared claim is stale", "claim", c.Namespace+"/"+c.Name, "err", err)
			continue
		}
		if !stale {
			d.staleSince.Delete(c.UID)
			continue
		}
		// A claim must look stale for a while before it is released, so that
		// an API server restored from backup or a lagging cache cannot make
		// the plugin pull a device from under a running pod.
		first, _ := d.staleSince.LoadOrStore(c.UID, d.clock.Now())
		if d.clock.Since(first.(time.Time)) < grace {
			continue
		}
		err = d.state.releaseStale(ctx, c)
		if err != nil {
			logger.Error(err, "Releasing a stale claim", "claim", c.Namespace+"/"+c.Name)
			continue
		}
		d.staleSince.Delete(c.UID)
		d.metrics.checkpointRecover.WithLabelValues("stale-released").Inc()
		logger.Info("Released a claim that no longer exists in the API", "claim", c.Namespace+"/"+c.Name, "uid", c.UID)
		d.recorder.Eventf(d.node, corev1.EventTypeNormal, "StaleClaimReleased",
			"Released devices of claim %s/%s (uid %s): the claim no longer exists and the kubelet never unprepared it", c.Namespace, c.Name, c.UID)
		d.state.updateGauges()
	}
}

// isStale reports whether the claim is gone from the API: deleted, or
// replaced by a new claim of the same name.
func (d *Driver) isStale(ctx context.Context, c checkpoint.Claim) (bool, error) {
	claim, err := d.cfg.SweepClient.ResourceV1().ResourceClaims(c.Namespace).Get(ctx, c.Name, metav1.GetOptions{})
	if apierrors.IsNotFound(err) {
		return true, nil
	}
	if err != nil {
		return false, err
	}
	return string(claim.UID) != c.UID, nil
}
