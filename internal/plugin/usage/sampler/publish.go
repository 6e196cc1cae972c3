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

package sampler

import (
	"context"
	"fmt"
	"strings"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/klog/v2"

	prismv1alpha1 "github.com/prismgpu/prism/api/prism/v1alpha1"
	"github.com/prismgpu/prism/internal/plugin/profiling"
	"github.com/prismgpu/prism/internal/plugin/usage"
)

// EventReasonShareExceeded is recorded on the WorkloadProfile and the pods
// of a run that used more than the share of a GPU it was given.
const EventReasonShareExceeded = "ShareExceeded"

// Outcomes of publishing a run, the label of usage_runs_total.
const (
	outcomeMerged       = "Merged"
	outcomeTooShort     = "TooShort"
	outcomeNoProfile    = "NoProfile"
	outcomePublishError = "PublishFailed"
)

// maxPublishTries bounds the tries of a run whose publish fails, as the
// plugin bounds those of a profiled claim's report.
const maxPublishTries = 10

// PublishNext publishes the next released run, and returns false once the
// queue is shut down; Run calls it until then.
func (s *Sampler) PublishNext(ctx context.Context) bool {
	uid, shutdown := s.queue.Get()
	if shutdown {
		return false
	}
	defer s.queue.Done(uid)
	s.mu.Lock()
	r, ok := s.ended[uid]
	s.mu.Unlock()
	if !ok {
		s.queue.Forget(uid)
		return true
	}
	logger := klog.FromContext(ctx).WithValues("claim", klog.KRef(r.Claim.Namespace, r.Claim.Name), "workloadProfile", r.Profile)
	ctx = klog.NewContext(ctx, logger)
	if s.queue.NumRequeues(uid) == 0 {
		// Marked ended on disk before the first try, so that a restart
		// publishes it rather than waiting for a claim that is gone.
		if err := s.write(r); err != nil {
			logger.Error(err, "Writing the usage record of an unprepared claim; a restart now would publish it without its last samples")
		}
	}
	finished := usage.Finished{Run: r.Run, ProductName: r.ProductName, Share: r.Share, Profiled: r.Profiled, EndedAt: *r.EndedAt}
	enough := r.Run.Samples() >= usage.MinSamples
	exceeded := usage.Exceeded(r.Run, r.Share)
	if enough && exceeded != nil && !r.Signalled {
		s.signalShareExceeded(ctx, r, exceeded)
		r.Signalled = true
		s.mu.Lock()
		s.ended[uid] = r
		s.mu.Unlock()
		_ = s.write(r)
	}
	outcome, err := s.publish(ctx, r, finished)
	if err != nil {
		if tries := s.queue.NumRequeues(uid) + 1; tries < maxPublishTries && ctx.Err() == nil {
			logger.Info("Publishing the claim's GPU usage failed; retrying", "try", tries, "err", err)
			s.queue.AddRateLimited(uid)
			return true
		}
		if ctx.Err() != nil {
			// Stopping: the record stays for the next start.
			return false
		}
		logger.Error(err, "Publishing the claim's GPU usage failed; dropping the run", "tries", maxPublishTries)
		s.env.Dropped.Inc()
	}
	s.env.Metrics.runs.WithLabelValues(outcome).Inc()
	s.queue.Forget(uid)
	if err := s.remove(uid); err != nil {
		logger.Error(err, "Removing a published usage record; it would be published again after a restart")
	}
	s.mu.Lock()
	delete(s.ended, uid)
	s.mu.Unlock()
	return true
}

// publish merges the run into status.usage of the claim's WorkloadProfile,
// creating the profile (with an empty spec, as the ncu path does) when it
// does not exist. The error is an API error worth retrying.
func (s *Sampler) publish(ctx context.Context, r runRecord, f usage.Finished) (string, error) {
	logger := klog.FromContext(ctx)
	switch {
	case r.Profile == "":
		logger.V(2).Info("Claim names no WorkloadProfile (annotation prism.dev/profile); its GPU usage is not kept", "samples", f.Run.Samples())
		return outcomeNoProfile, nil
	case f.Run.Samples() < usage.MinSamples:
		logger.Info("Claim's run was too short to merge into its WorkloadProfile", "samples", f.Run.Samples(), "minimum", usage.MinSamples)
		return outcomeTooShort, nil
	case s.cfg.Profiles == nil:
		return outcomeNoProfile, nil
	}
	key := types.NamespacedName{Namespace: r.Claim.Namespace, Name: r.Profile}
	var merged *prismv1alpha1.UsageProfile
	var profileUID types.UID
	err := profiling.UpdateStatus(ctx, s.cfg.Profiles, key, func(wp *prismv1alpha1.WorkloadProfile) bool {
		profileUID = wp.UID
		merged = usage.Merge(ctx, wp.Status.Usage, f)
		wp.Status.Usage = merged
		return true
	})
	if err != nil {
		return outcomePublishError, err
	}
	logger.Info("Merged the claim's GPU usage into its WorkloadProfile", "runs", merged.Runs, "samples", merged.Samples,
		"dutyCycleP95MilliPercent", merged.DutyCycleP95MilliPercent, "peakMemory", merged.PeakMemory)
	if merged.Exceeded != nil {
		s.env.Recorder.Eventf(&corev1.ObjectReference{
			Kind: "WorkloadProfile", APIVersion: prismv1alpha1.GroupVersion.String(), Namespace: key.Namespace, Name: key.Name, UID: profileUID,
		}, corev1.EventTypeWarning, EventReasonShareExceeded, "%s", s.shareExceededMessage(r, merged.Exceeded))
	}
	return outcomeMerged, nil
}

// signalShareExceeded counts a run that outgrew its share and tells its
// pods, whose owners see their Events first.
func (s *Sampler) signalShareExceeded(ctx context.Context, r runRecord, e *prismv1alpha1.ShareExceeded) {
	for _, res := range e.Resources {
		s.env.Metrics.shareExceeded.WithLabelValues(strings.ToLower(string(res))).Inc()
	}
	msg := s.shareExceededMessage(r, e)
	klog.FromContext(ctx).Info("Claim's run used more than its share of the GPU", "resources", e.Resources, "message", e.Message)
	for _, p := range r.Pods {
		s.env.Recorder.Eventf(&corev1.ObjectReference{Kind: "Pod", APIVersion: "v1", Namespace: r.Claim.Namespace, Name: p.Name, UID: p.UID},
			corev1.EventTypeWarning, EventReasonShareExceeded, "%s", msg)
	}
}

func (s *Sampler) shareExceededMessage(r runRecord, e *prismv1alpha1.ShareExceeded) string {
	next := "its next run gets a larger share or a whole GPU"
	if r.Profile == "" {
		next = "it names no WorkloadProfile (annotation prism.dev/profile), so its next run is sized as before"
	}
	return fmt.Sprintf("Claim %s on node %s used more than its share of the GPU (%s); %s", r.Claim.Name, s.env.NodeName, e.Message, next)
}
