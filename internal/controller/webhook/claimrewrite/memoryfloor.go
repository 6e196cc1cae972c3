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

package claimrewrite

import (
	"context"
	"fmt"
	"sync/atomic"
	"time"

	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/kubernetes"
	"k8s.io/klog/v2"

	gpuv1alpha1 "github.com/prismgpu/prism/api/gpu/v1alpha1"
	"github.com/prismgpu/prism/pkg/rewrite"
)

// MemoryFloorProbe finds out whether the API server keeps a ResourceClaim's
// capacity requests, and decides from its answer and --memory-floor what
// the rewrite may write (rewrite.Capacity). With DRAConsumableCapacity off
// the API server drops them from a new claim without an error: a floor
// written as one would be gone, and the claim would fit any GPU; a share
// would take a whole GPU. Until a probe has answered yes, claims get no
// share and keep the CEL floor.
type MemoryFloorProbe struct {
	Client kubernetes.Interface
	// Namespace is where the dry-run claim is created; nothing is stored.
	Namespace string
	// Form is --memory-floor: the form memory floors and tier bounds are
	// asked in where the API server keeps capacity requests.
	Form rewrite.Form
	// Interval between tries while the API server cannot be asked (for
	// example while this controller's own webhooks are not yet served).
	Interval time.Duration

	decision atomic.Pointer[rewrite.Capacity]
}

// unanswered is the decision until the probe has an answer.
var unanswered = rewrite.Capacity{Why: "the API server has not yet answered whether it keeps capacity requests"}

// Unprobed is the decision where there is nowhere to probe the API server
// from: no shares, and the CEL forms.
func Unprobed() rewrite.Capacity {
	return rewrite.Capacity{Why: "no --namespace to probe the API server in with a dry-run claim"}
}

// Capacity is the decision on capacity requests as it stands: made once,
// when the probe has its answer.
func (p *MemoryFloorProbe) Capacity() rewrite.Capacity {
	if d := p.decision.Load(); d != nil {
		return *d
	}
	return unanswered
}

// decideCapacity is the decision once the API server has answered whether
// it keeps capacity requests.
func decideCapacity(form rewrite.Form, kept bool) rewrite.Capacity {
	if !kept {
		return rewrite.Capacity{Why: "the API server drops capacity requests (DRAConsumableCapacity is off)"}
	}
	// The tier bounds go with the floor: they pay only where the floor
	// leaves a tier without CEL.
	asCapacity := form == rewrite.FormCapacity
	return rewrite.Capacity{Shares: true, MemoryFloor: asCapacity, TierBounds: asCapacity,
		Why: "the API server keeps capacity requests, and --memory-floor=" + form.String()}
}

// Run probes until the API server answers, then decides and returns. A gate
// is set when the API server starts, so one answer holds for this
// process's lifetime against that server; an API server restarted with
// other gates is seen after the controller restarts.
func (p *MemoryFloorProbe) Run(ctx context.Context) {
	logger := klog.FromContext(ctx)
	interval := p.Interval
	if interval <= 0 {
		interval = 10 * time.Second
	}
	_ = wait.PollUntilContextCancel(ctx, interval, true, func(ctx context.Context) (bool, error) {
		kept, err := p.probe(ctx)
		if err != nil {
			logger.Info("Could not ask the API server whether it keeps capacity requests; no GPU shares, and the memory floor stays in CEL until it answers", "err", err)
			return false, nil
		}
		d := decideCapacity(p.Form, kept)
		p.decision.Store(&d)
		if kept {
			logger.Info("The API server keeps capacity requests: GPU shares are offered", "capacityForms", d.MemoryFloor, "why", d.Why)
		} else {
			logger.Error(nil, "The API server drops capacity requests (DRAConsumableCapacity is off): no GPU shares, and memory floors and tier bounds stay in CEL")
		}
		return true, nil
	})
}

// probe creates a claim with a capacity request as a server-side dry run
// and reads back what the API server would have stored.
func (p *MemoryFloorProbe) probe(ctx context.Context) (bool, error) {
	claim := &resourceapi.ResourceClaim{
		ObjectMeta: metav1.ObjectMeta{GenerateName: "prism-memory-floor-probe-", Namespace: p.Namespace},
		Spec: resourceapi.ResourceClaimSpec{Devices: resourceapi.DeviceClaim{Requests: []resourceapi.DeviceRequest{{
			Name: "gpu",
			Exactly: &resourceapi.ExactDeviceRequest{
				DeviceClassName: rewrite.DeviceClassName,
				Capacity: &resourceapi.CapacityRequirements{Requests: map[resourceapi.QualifiedName]resource.Quantity{
					gpuv1alpha1.MemoryCapacity.Qualified(): resource.MustParse("1Gi"),
				}},
			},
		}}}},
	}
	got, err := p.Client.ResourceV1().ResourceClaims(p.Namespace).Create(ctx, claim, metav1.CreateOptions{DryRun: []string{metav1.DryRunAll}})
	if err != nil {
		return false, fmt.Errorf("dry-run create of a ResourceClaim with a capacity request in namespace %s: %w", p.Namespace, err)
	}
	reqs := got.Spec.Devices.Requests
	return len(reqs) == 1 && reqs[0].Exactly != nil && reqs[0].Exactly.Capacity != nil &&
		len(reqs[0].Exactly.Capacity.Requests) == 1, nil
}
