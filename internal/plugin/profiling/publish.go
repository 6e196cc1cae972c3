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

package profiling

import (
	"context"
	"errors"
	"fmt"
	"time"

	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/klog/v2"

	prismv1alpha1 "github.com/prismgpu/prism/api/prism/v1alpha1"
	"github.com/prismgpu/prism/pkg/profile"
)

// Result is what a Publisher writes: a collected report's status, or the
// reason there is none.
type Result struct {
	// Claim is the claim the report was collected under.
	Claim prismv1alpha1.ClaimReference
	// Profile is the WorkloadProfile's name, from
	// prismv1alpha1.ProfileName.
	Profile string
	// Status and Err are what Collect returned.
	Status *prismv1alpha1.WorkloadProfileStatus
	Err    error
}

// Publisher writes collected profiles to WorkloadProfiles.
type Publisher struct {
	client WorkloadProfiles
	now    func() time.Time
}

// NewPublisher returns a Publisher that writes through c.
func NewPublisher(c WorkloadProfiles) *Publisher {
	return &Publisher{client: c, now: time.Now}
}

// Publish creates the WorkloadProfile if it does not exist (with an empty
// spec) and writes the result into its status through the status
// subresource. A missing or bad report is not an error: it becomes
// Profiled=False with the reason, and measured fields from an earlier
// profile are kept. A profile with spec.disableAutoProfiling is left
// alone. Errors are API errors the caller may retry.
func (p *Publisher) Publish(ctx context.Context, r Result) error {
	if r.Profile == "" {
		return errors.New("publishing profile: no WorkloadProfile name")
	}
	if _, err := prismv1alpha1.ParseProfileName(r.Profile); err != nil {
		return fmt.Errorf("publishing profile: %w", err)
	}
	key := types.NamespacedName{Namespace: r.Claim.Namespace, Name: r.Profile}
	logger := klog.FromContext(ctx).WithValues("workloadProfile", klog.KRef(key.Namespace, key.Name), "claim", klog.KRef(r.Claim.Namespace, r.Claim.Name))
	ctx = klog.NewContext(ctx, logger)

	st, failed := p.status(r)
	skipped := false
	err := UpdateStatus(ctx, p.client, key, func(wp *prismv1alpha1.WorkloadProfile) bool {
		if wp.Spec.DisableAutoProfiling {
			skipped = true
			return false
		}
		if failed != nil {
			failed.ObservedGeneration = wp.Generation
			meta.SetStatusCondition(&wp.Status.Conditions, *failed)
		} else {
			profile.Apply(wp, st)
		}
		return true
	})
	if err != nil {
		return err
	}
	switch {
	case skipped:
		logger.V(2).Info("WorkloadProfile disables auto-profiling, report not written")
	case failed != nil:
		logger.Info("No usable profile", "reason", failed.Reason, "message", failed.Message)
	default:
		logger.V(2).Info("Published profile", "boundType", st.BoundType)
	}
	return nil
}

// status turns a result into either a full status or, when there is no
// usable report, the Profiled=False condition alone.
func (p *Publisher) status(r Result) (prismv1alpha1.WorkloadProfileStatus, *metav1.Condition) {
	fail := func(reason Reason, msg string) (prismv1alpha1.WorkloadProfileStatus, *metav1.Condition) {
		return prismv1alpha1.WorkloadProfileStatus{}, &metav1.Condition{
			Type:               prismv1alpha1.ConditionProfiled,
			Status:             metav1.ConditionFalse,
			Reason:             string(reason),
			Message:            profile.Truncate(fmt.Sprintf("claim %s/%s: %s", r.Claim.Namespace, r.Claim.Name, msg), maxConditionMessage),
			LastTransitionTime: metav1.NewTime(p.now()),
		}
	}
	if r.Err != nil {
		var ce *CollectError
		if errors.As(r.Err, &ce) {
			return fail(ce.Reason, ce.Error())
		}
		return fail(ReasonReportMissing, r.Err.Error())
	}
	if r.Status == nil {
		return fail(ReasonReportMissing, "no report was collected")
	}
	return *r.Status, nil
}

// maxConditionMessage is the API's limit on a condition message.
const maxConditionMessage = 32768
