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

package bench

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"slices"
	"time"

	admissionv1 "k8s.io/api/admission/v1"
	corev1 "k8s.io/api/core/v1"
	resourceapi "k8s.io/api/resource/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"

	gpuv1alpha1 "github.com/prismgpu/prism/api/gpu/v1alpha1"
	prismv1alpha1 "github.com/prismgpu/prism/api/prism/v1alpha1"
	"github.com/prismgpu/prism/internal/sim"
	"github.com/prismgpu/prism/test/testbed"
)

// ControllerScaleOptions bound the controller-scale phase.
type ControllerScaleOptions struct {
	AdmissionOptions
	// Nodes are the fleets measured, smallest first, in nodes of 8 GPUs
	// each; the largest is a multiple of 4 (the four MixedModels), and
	// every smaller one is as even a mix as its size allows.
	Nodes []int
	// ClaimsPerNode is how many ResourceClaims per node the informers
	// hold; half of them allocated, half waiting.
	ClaimsPerNode int
}

// scaleNamespace holds the phase's claims.
const scaleNamespace = "scale"

// ControllerScale measures what the size of the cluster costs
// prism-controller: its informers hold every Prism ResourceSlice and every
// ResourceClaim, and its webhook cuts each claim's ladder from that fleet.
// For each fleet size, smallest first, it grows the cluster to that many
// nodes and claims, starts a fresh controller, and measures the time until
// it rewrites, its RSS, and the admission latency under the rate of the
// admission phase. The rows compare the largest size with the smallest.
func ControllerScale(ctx context.Context, c *testbed.Cluster, client kubernetes.Interface, o ControllerScaleOptions) ([]Row, error) {
	largest := o.Nodes[len(o.Nodes)-1]
	if len(o.Nodes) < 2 || !slices.IsSorted(o.Nodes) || largest%len(MixedModels) != 0 {
		return nil, fmt.Errorf("controller scale: want at least two fleet sizes, smallest first, the largest a multiple of %d; got %v", len(MixedModels), o.Nodes)
	}
	fleet, err := NewMixedFleet(ctx, "scale-", largest, 8)
	if err != nil {
		return nil, err
	}
	// Node i of the order takes the groups in turn, so that every size is
	// the same mix of models.
	per := largest / len(MixedModels)
	order := make([]*resourceapi.ResourceSlice, 0, largest)
	for i := range per {
		for g := range MixedModels {
			order = append(order, fleet.Slices[g*per+i])
		}
	}
	// Slices of earlier phases would count towards the first size.
	if err := client.ResourceV1().ResourceSlices().DeleteCollection(ctx, metav1.DeleteOptions{}, metav1.ListOptions{
		FieldSelector: resourceapi.ResourceSliceSelectorDriver + "=" + gpuv1alpha1.DriverName,
	}); err != nil {
		return nil, fmt.Errorf("removing earlier phases' slices: %w", err)
	}
	if err := createTrainProfile(ctx, c, client); err != nil {
		return nil, err
	}
	if err := createMLProfile(ctx, c, client, loadAwareProfile, prismv1alpha1.PolicyLoadAware); err != nil {
		return nil, err
	}
	if _, err := client.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: scaleNamespace}}, metav1.CreateOptions{}); err != nil && !apierrors.IsAlreadyExists(err) {
		return nil, err
	}

	type measured struct {
		nodes, claims int
		// ready is the time from the start to the first rewrite, of a
		// claim whose policy reads no load; loadAwareReady to the first
		// of one whose policy reads the load, which waits for every claim
		// and pod.
		ready, loadAwareReady time.Duration
		idleRSS, loadedRSS    float64
		heap                  float64
		plainP99, rewriteP99  time.Duration
		// The machine's CPUs' busy fraction over the second before the
		// controller started and before the load.
		busyAtStart, busyAtLoad float64
	}
	var results []measured
	nodes, claims := 0, 0
	for _, n := range o.Nodes {
		start := time.Now()
		if err := parallel(n-nodes, 32, func(i int) error {
			_, err := client.ResourceV1().ResourceSlices().Create(ctx, order[nodes+i], metav1.CreateOptions{})
			return err
		}); err != nil {
			return nil, fmt.Errorf("creating slices: %w", err)
		}
		want := n * o.ClaimsPerNode
		added := order[nodes:n]
		if err := parallel(want-claims, 32, func(i int) error {
			return createScaleClaim(ctx, client, claims, i, added)
		}); err != nil {
			return nil, fmt.Errorf("creating claims: %w", err)
		}
		nodes, claims = n, want
		fmt.Printf("  controller scale: %d nodes, %d claims in the API server (%s)\n", nodes, claims, time.Since(start).Round(time.Second))
		// The control plane works through what was just created before
		// the controller starts, and again before the load: what is
		// measured is the controller's time, not the test bed's.
		busy, err := waitQuiet(ctx, quietBusy, quietLimit)
		if err != nil {
			return nil, err
		}

		begin := time.Now()
		w, err := startWebhook(ctx, c, o.AdmissionOptions, "prism-controller")
		if err != nil {
			return nil, err
		}
		m := measured{nodes: nodes, claims: claims, ready: w.ready, busyAtStart: busy}
		if err := w.rewriteLoadAware(); err != nil {
			w.stop()
			return nil, fmt.Errorf("load-aware claim: %w", err)
		}
		m.loadAwareReady = time.Since(begin)
		time.Sleep(2 * time.Second)
		if m.busyAtLoad, err = waitQuiet(ctx, quietBusy, quietLimit); err != nil {
			w.stop()
			return nil, err
		}
		if m.idleRSS, err = RSSMiB(w.proc.Pid()); err != nil {
			w.stop()
			return nil, err
		}
		samples, err := w.load(o.Rate, o.Duration)
		if err == nil {
			m.loadedRSS, err = RSSMiB(w.proc.Pid())
		}
		if err == nil {
			m.heap, err = heapInUseMiB(w.httpAddr)
		}
		w.stop()
		if err != nil {
			return nil, err
		}
		m.plainP99, m.rewriteP99 = Percentile(samples[0], 0.99), Percentile(samples[1], 0.99)
		results = append(results, m)
	}

	small, large := results[0], results[len(results)-1]
	name := func(m measured) string { return fmt.Sprintf("%d nodes", m.nodes) }
	cse := fmt.Sprintf("prism-controller, informers of %d vs %d nodes x 8 GPUs and %d vs %d claims", small.nodes, large.nodes, small.claims, large.claims)
	load := fmt.Sprintf("%d req/s each for %s; CPUs %s busy before it", o.Rate, o.Duration, busyRange(small.busyAtLoad, large.busyAtLoad))
	return []Row{
		NewRow("controller scale", cse, "start to first rewrite", "s", name(small), small.ready.Seconds(), name(large), large.ready.Seconds(),
			"profile of policy performance (the chart's default), which reads no load: served once the profiles and slices have synced; CPUs "+busyRange(small.busyAtStart, large.busyAtStart)+" busy before the start"),
		NewRow("controller scale", cse, "start to first load-aware rewrite", "s", name(small), small.loadAwareReady.Seconds(), name(large), large.loadAwareReady.Seconds(),
			"profile of policy load-aware, which reads every claim and pod: it waits for their informers"),
		NewRow("controller scale", cse, "RSS after sync (VmRSS)", "MiB", name(small), small.idleRSS, name(large), large.idleRSS, ""),
		NewRow("controller scale", cse, "RSS after admission load (VmRSS)", "MiB", name(small), small.loadedRSS, name(large), large.loadedRSS, load),
		NewRow("controller scale", cse, "Go heap in use after admission load", "MiB", name(small), small.heap, name(large), large.heap, "go_memstats_heap_inuse_bytes"),
		NewRow("controller scale", cse, "mutating webhook p99, rewrite", "ms", name(small), ms(small.rewriteP99), name(large), ms(large.rewriteP99), load),
		NewRow("controller scale", cse, "mutating webhook p99, no-annotation", "ms", name(small), ms(small.plainP99), name(large), ms(large.plainP99), load),
	}, nil
}

// The controller-scale phase waits, at most quietLimit, for the machine's
// CPUs to be less than quietBusy busy over a second before it starts the
// controller and before the load. On an idle 2-core machine the test
// bed's control plane settles below it within seconds of the last create.
const (
	quietBusy  = 0.15
	quietLimit = time.Minute
)

func busyRange(a, b float64) string { return fmt.Sprintf("%.0f%%, %.0f%%", 100*a, 100*b) }

// createScaleClaim creates claim first+i of the phase. Even ones of a
// size's new claims are allocated a device of that size's new slices, each
// device once (half of ClaimsPerNode per node, at most its 8 GPUs); odd
// ones wait, claims made by hand that the load does not count but the
// informer holds.
func createScaleClaim(ctx context.Context, client kubernetes.Interface, first, i int, slices []*resourceapi.ResourceSlice) error {
	claim := &resourceapi.ResourceClaim{
		ObjectMeta: metav1.ObjectMeta{Name: fmt.Sprintf("claim-%d", first+i), Namespace: scaleNamespace,
			Annotations: map[string]string{prismv1alpha1.ProfileAnnotation: "train"}},
		Spec: *sim.GPUClaim(1),
	}
	created, err := client.ResourceV1().ResourceClaims(scaleNamespace).Create(ctx, claim, metav1.CreateOptions{})
	if err != nil || i%2 == 1 {
		return err
	}
	held := i / 2
	s := slices[held%len(slices)]
	dev := s.Spec.Devices[(held/len(slices))%len(s.Spec.Devices)]
	created.Status.Allocation = &resourceapi.AllocationResult{Devices: resourceapi.DeviceAllocationResult{
		Results: []resourceapi.DeviceRequestAllocationResult{{
			Request: created.Spec.Devices.Requests[0].Name, Driver: gpuv1alpha1.DriverName, Pool: s.Spec.Pool.Name, Device: dev.Name,
		}},
	}}
	_, err = client.ResourceV1().ResourceClaims(scaleNamespace).UpdateStatus(ctx, created, metav1.UpdateOptions{})
	return err
}

// loadAwareProfile is the phase's profile of policy load-aware: the train
// profile's measurements, and a policy that reads the fleet's load.
const loadAwareProfile = "train-load-aware"

// rewriteLoadAware posts the profiled claim annotated with
// loadAwareProfile, once: the controller answers it once the claims and
// pods have synced, within the review's 10 s deadline.
func (w *webhookUnderLoad) rewriteLoadAware() error {
	var review admissionv1.AdmissionReview
	if err := json.Unmarshal(w.bodies[1], &review); err != nil {
		return err
	}
	claim := &resourceapi.ResourceClaim{}
	if err := json.Unmarshal(review.Request.Object.Raw, claim); err != nil {
		return err
	}
	claim.Annotations[prismv1alpha1.ProfileAnnotation] = loadAwareProfile
	object, err := json.Marshal(claim)
	if err != nil {
		return err
	}
	review.Request.Object.Raw = object
	body, err := json.Marshal(review)
	if err != nil {
		return err
	}
	_, data, err := w.post(body)
	if err != nil {
		return err
	}
	if err := json.Unmarshal(data, &review); err != nil || review.Response == nil || !bytes.Contains(review.Response.Patch, []byte("firstAvailable")) {
		return fmt.Errorf("not rewritten: %s", data)
	}
	return nil
}
