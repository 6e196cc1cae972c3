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
// capacity requests. With DRAConsumableCapacity off it drops them from a new
// claim without an error, and a floor written as one would be gone: the
// claim would fit any GPU. Until a probe has answered yes, claims keep the
// CEL floor.
type MemoryFloorProbe struct {
	Client kubernetes.Interface
	// Namespace is where the dry-run claim is created; nothing is stored.
	Namespace string
	// Interval between tries while the API server cannot be asked (for
	// example while this controller's own webhooks are not yet served).
	Interval time.Duration

	kept atomic.Bool
}

// Capacity reports whether claims may get the floor as a capacity request.
func (p *MemoryFloorProbe) Capacity() bool { return p.kept.Load() }

// Run probes until the API server answers, then returns. A gate is set when
// the API server starts, so one answer holds for this process's lifetime
// against that server; an API server restarted with other gates is seen
// after the controller restarts.
func (p *MemoryFloorProbe) Run(ctx context.Context) {
	logger := klog.FromContext(ctx)
	interval := p.Interval
	if interval <= 0 {
		interval = 10 * time.Second
	}
	_ = wait.PollUntilContextCancel(ctx, interval, true, func(ctx context.Context) (bool, error) {
		kept, err := p.probe(ctx)
		if err != nil {
			logger.Info("Could not ask the API server whether it keeps capacity requests; the memory floor stays in CEL until it answers", "err", err)
			return false, nil
		}
		p.kept.Store(kept)
		if kept {
			logger.Info("The API server keeps capacity requests: memory floors are written as capacity requests (--memory-floor=capacity)")
		} else {
			logger.Error(nil, "The API server drops capacity requests (DRAConsumableCapacity is off): memory floors stay in CEL despite --memory-floor=capacity")
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
