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
	"strings"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/klog/v2"

	prismv1alpha1 "github.com/prismgpu/prism/api/prism/v1alpha1"
	"github.com/prismgpu/prism/pkg/profiling"
	"github.com/prismgpu/prism/pkg/usage"
)

// EventReasonShareExceeded is recorded on the WorkloadProfile and the pods
// of a run that used more than the share of a GPU it was given.
const EventReasonShareExceeded = "ShareExceeded"

// Outcomes of publishing a run, the label of usage_runs_total.
const (
	usageMerged       = "Merged"
	usageTooShort     = "TooShort"
	usageNoProfile    = "NoProfile"
	usagePublishError = "PublishFailed"
)

// startUsagePublishing starts the worker that merges ended runs into their
// WorkloadProfiles; it stops with ctx, and what it did not publish stays
// on disk for the next start.
func (d *Driver) startUsagePublishing(ctx context.Context) {
	go func() {
		<-ctx.Done()
		d.usage.queue.ShutDown()
	}()
	go func() {
		for d.publishNextUsage(ctx) {
		}
	}()
}

// publishNextUsage publishes the next ended run, and returns false once the
// queue is shut down.
func (d *Driver) publishNextUsage(ctx context.Context) bool {
	u := d.usage
	uid, shutdown := u.queue.Get()
	if shutdown {
		return false
	}
	defer u.queue.Done(uid)
	u.mu.Lock()
	r, ok := u.ended[uid]
	u.mu.Unlock()
	if !ok {
		u.queue.Forget(uid)
		return true
	}
	logger := klog.FromContext(ctx).WithValues("claim", klog.KRef(r.Claim.Namespace, r.Claim.Name), "workloadProfile", r.Profile)
	ctx = klog.NewContext(ctx, logger)
	if u.queue.NumRequeues(uid) == 0 {
		// Marked ended on disk before the first try, so that a restart
		// publishes it rather than waiting for a claim that is gone.
		if err := u.write(r); err != nil {
			logger.Error(err, "Writing the usage record of an unprepared claim; a restart now would publish it without its last samples")
		}
	}
	finished := usage.Finished{Run: r.Run, ProductName: r.ProductName, Share: r.Share, EndedAt: *r.EndedAt}
	enough := r.Run.Samples() >= usage.MinSamples
	exceeded := usage.Exceeded(r.Run, r.Share)
	if enough && exceeded != nil && !r.Signalled {
		d.signalShareExceeded(ctx, r, exceeded)
		r.Signalled = true
		u.mu.Lock()
		u.ended[uid] = r
		u.mu.Unlock()
		_ = u.write(r)
	}
	outcome, err := d.publishUsage(ctx, r, finished)
	if err != nil {
		if tries := u.queue.NumRequeues(uid) + 1; tries < maxPublishTries && ctx.Err() == nil {
			logger.Info("Publishing the claim's GPU usage failed; retrying", "try", tries, "err", err)
			u.queue.AddRateLimited(uid)
			return true
		}
		if ctx.Err() != nil {
			// Stopping: the record stays for the next start.
			return false
		}
		logger.Error(err, "Publishing the claim's GPU usage failed; dropping the run", "tries", maxPublishTries)
		d.metrics.claimErrors.WithLabelValues("unprepare", "usage-publish").Inc()
	}
	d.metrics.usage.runs.WithLabelValues(outcome).Inc()
	u.queue.Forget(uid)
	if err := u.remove(uid); err != nil {
		logger.Error(err, "Removing a published usage record; it would be published again after a restart")
	}
	u.mu.Lock()
	delete(u.ended, uid)
	u.mu.Unlock()
	return true
}

// publishUsage merges the run into status.usage of the claim's
// WorkloadProfile, creating the profile (with an empty spec, as the ncu
// path does) when it does not exist. The error is an API error worth
// retrying.
func (d *Driver) publishUsage(ctx context.Context, r usageRecord, f usage.Finished) (string, error) {
	logger := klog.FromContext(ctx)
	switch {
	case r.Profile == "":
		logger.V(2).Info("Claim names no WorkloadProfile (annotation prism.dev/profile); its GPU usage is not kept", "samples", f.Run.Samples())
		return usageNoProfile, nil
	case f.Run.Samples() < usage.MinSamples:
		logger.Info("Claim's run was too short to merge into its WorkloadProfile", "samples", f.Run.Samples(), "minimum", usage.MinSamples)
		return usageTooShort, nil
	case d.usage.cfg.Profiles == nil:
		return usageNoProfile, nil
	}
	key := types.NamespacedName{Namespace: r.Claim.Namespace, Name: r.Profile}
	var merged *prismv1alpha1.UsageProfile
	var profileUID types.UID
	err := profiling.UpdateStatus(ctx, d.usage.cfg.Profiles, key, func(wp *prismv1alpha1.WorkloadProfile) bool {
		profileUID = wp.UID
		merged = usage.Merge(ctx, wp.Status.Usage, f)
		wp.Status.Usage = merged
		return true
	})
	if err != nil {
		return usagePublishError, err
	}
	logger.Info("Merged the claim's GPU usage into its WorkloadProfile", "runs", merged.Runs, "samples", merged.Samples,
		"dutyCycleP95MilliPercent", merged.DutyCycleP95MilliPercent, "peakMemory", merged.PeakMemory)
	if merged.Exceeded != nil {
		d.recorder.Eventf(&corev1.ObjectReference{
			Kind: "WorkloadProfile", APIVersion: prismv1alpha1.GroupVersion.String(), Namespace: key.Namespace, Name: key.Name, UID: profileUID,
		}, corev1.EventTypeWarning, EventReasonShareExceeded, "%s", d.shareExceededMessage(r, merged.Exceeded))
	}
	return usageMerged, nil
}

// signalShareExceeded counts a run that outgrew its share and tells its
// pods, whose owners see their Events first.
func (d *Driver) signalShareExceeded(ctx context.Context, r usageRecord, e *prismv1alpha1.ShareExceeded) {
	for _, res := range e.Resources {
		d.metrics.usage.shareExceeded.WithLabelValues(strings.ToLower(string(res))).Inc()
	}
	msg := d.shareExceededMessage(r, e)
	klog.FromContext(ctx).Info("Claim's run used more than its share of the GPU", "resources", e.Resources, "message", e.Message)
	for _, p := range r.Pods {
		d.recorder.Eventf(&corev1.ObjectReference{Kind: "Pod", APIVersion: "v1", Namespace: r.Claim.Namespace, Name: p.Name, UID: p.UID},
			corev1.EventTypeWarning, EventReasonShareExceeded, "%s", msg)
	}
}

func (d *Driver) shareExceededMessage(r usageRecord, e *prismv1alpha1.ShareExceeded) string {
	next := "its next run gets a larger share or a whole GPU"
	if r.Profile == "" {
		next = "it names no WorkloadProfile (annotation prism.dev/profile), so its next run is sized as before"
	}
	return fmt.Sprintf("Claim %s on node %s used more than its share of the GPU (%s); %s", r.Claim.Name, d.cfg.NodeName, e.Message, next)
}
