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
	"encoding/json"
	"fmt"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	admissionv1 "k8s.io/api/admission/v1"
	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/tools/record"
	"k8s.io/utils/ptr"

	gpuv1alpha1 "github.com/prismgpu/prism/api/gpu/v1alpha1"
	prismv1alpha1 "github.com/prismgpu/prism/api/prism/v1alpha1"
	"github.com/prismgpu/prism/internal/controller/webhook"
	"github.com/prismgpu/prism/internal/controller/webhook/validate"
	"github.com/prismgpu/prism/internal/controller/webhook/webhooktest"
	"github.com/prismgpu/prism/pkg/rewrite"
)

// measured is a profile NVML measured at a p50 duty cycle of 20 %, a p95
// of 32 % and a 6Gi peak over three runs: a share of 30 % (limit 45 %) and
// 8Gi.
func measured(mutate func(*prismv1alpha1.WorkloadProfile)) *prismv1alpha1.WorkloadProfile {
	return webhooktest.Profile("train", func(wp *prismv1alpha1.WorkloadProfile) {
		wp.Status.Usage = &prismv1alpha1.UsageProfile{
			DutyCycleP50MilliPercent: ptr.To(int32(20_000)),
			DutyCycleP95MilliPercent: ptr.To(int32(32_000)),
			PeakMemory:               ptr.To(resource.MustParse("6Gi")),
			Runs:                     3,
		}
		mutate(wp)
	})
}

// timeSliced is a GpuConfig that time-slices the GPU, which a share cannot
// take.
const timeSliced = `{"apiVersion":"gpu.prism.dev/v1alpha1","kind":"GpuConfig","sharing":{"strategy":"TimeSlicing","timeSlicing":{"interval":"Long"}}}`

// withConfig is claim-profiled.json with a GpuConfig for its gpu request.
func withConfig(t *testing.T, parameters string) []byte {
	t.Helper()
	var claim resourceapi.ResourceClaim
	if err := json.Unmarshal(webhooktest.ReadFixture(t, "claim-profiled.json"), &claim); err != nil {
		t.Fatal(err)
	}
	claim.Spec.Devices.Config = []resourceapi.DeviceClaimConfiguration{{Requests: []string{"gpu"}, DeviceConfiguration: resourceapi.DeviceConfiguration{
		Opaque: &resourceapi.OpaqueDeviceConfiguration{Driver: "gpu.prism.dev", Parameters: runtime.RawExtension{Raw: []byte(parameters)}}}}}
	out, err := json.Marshal(&claim)
	if err != nil {
		t.Fatal(err)
	}
	return out
}

// TestRewriterSharesFromUsage: with shares allowed, a claim for one GPU of
// a profile whose usage fits a share gets the share first; the event and
// the metric say so, and every way to keep a whole GPU is honoured.
func TestRewriterSharesFromUsage(t *testing.T) {
	memoryBound := func(wp *prismv1alpha1.WorkloadProfile) { wp.Status.BoundType = prismv1alpha1.BoundTypeMemoryBound }
	for _, tc := range []struct {
		name    string
		profile *prismv1alpha1.WorkloadProfile
		claim   func(*testing.T) []byte
		shares  bool
		// tiers are the gpu request's subrequests; nil: not rewritten.
		tiers   []string
		event   string
		verdict string // the metric's label; "": not counted
	}{
		{"shares allowed", measured(memoryBound), nil, true,
			[]string{"share", "ultra", "high", "fits"}, EventReasonShared, "sized"},
		{"before the probe has answered", measured(memoryBound), nil, false,
			[]string{"ultra", "high", "fits"}, EventReasonRewritten, ""},
		{"measured by NVML only", measured(func(*prismv1alpha1.WorkloadProfile) {}), nil, true,
			[]string{"share", "fits"}, EventReasonShared, "sized"},
		{"measured by NVML only, heavy: profiled as before", measured(func(wp *prismv1alpha1.WorkloadProfile) {
			wp.Status.Usage.DutyCycleP50MilliPercent = ptr.To(int32(70_000))
			wp.Status.Usage.DutyCycleP95MilliPercent = ptr.To(int32(90_000))
		}), nil, true, nil, EventReasonProfiling, ""},
		{"the profile says Exclusive", measured(func(wp *prismv1alpha1.WorkloadProfile) {
			memoryBound(wp)
			wp.Spec.Sharing = prismv1alpha1.SharingExclusive
		}), nil, true, []string{"ultra", "high", "fits"}, EventReasonRewritten, "opted-out"},
		{"the claim's GpuConfig says Exclusive", measured(memoryBound), func(t *testing.T) []byte {
			return withConfig(t, `{"apiVersion":"gpu.prism.dev/v1alpha1","kind":"GpuConfig","sharing":{"strategy":"Exclusive"}}`)
		}, true, []string{"ultra", "high", "fits"}, EventReasonRewritten, "opted-out"},
		{"the claim's GpuConfig says TimeSlicing", measured(memoryBound), func(t *testing.T) []byte {
			return withConfig(t, timeSliced)
		}, true, []string{"ultra", "high", "fits"}, EventReasonRewritten, "opted-out"},
		{"a GpuConfig that only defaults to Exclusive", measured(memoryBound), func(t *testing.T) []byte {
			return withConfig(t, `{"apiVersion":"gpu.prism.dev/v1alpha1","kind":"GpuConfig","profiling":{"enabled":true}}`)
		}, true, []string{"share", "ultra", "high", "fits"}, EventReasonShared, "sized"},
		{"no usage", webhooktest.Profile("train", memoryBound), nil, true,
			[]string{"ultra", "high", "fits"}, EventReasonRewritten, "no-usage"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			m, err := NewMetrics(nil)
			if err != nil {
				t.Fatal(err)
			}
			rec := record.NewFakeRecorder(10)
			h, err := New(Options{Profiles: fakeReader(t, tc.profile), Policy: prismv1alpha1.PolicyPerformance, AutoProfile: true,
				Recorder: rec, Metrics: m, Capacity: func() rewrite.Capacity { return rewrite.Capacity{Shares: tc.shares} }})
			if err != nil {
				t.Fatal(err)
			}
			object := webhooktest.ReadFixture(t, "claim-profiled.json")
			if tc.claim != nil {
				object = tc.claim(t)
			}
			claim := applyPatch(t, object, webhooktest.Call(t, h, webhooktest.ReviewBody(t, admissionv1.Create, webhooktest.ClaimGVK, object)))
			var tiers []string
			for _, sub := range claim.Spec.Devices.Requests[0].FirstAvailable {
				tiers = append(tiers, sub.Name)
			}
			if diff := cmp.Diff(tc.tiers, tiers); diff != "" {
				t.Errorf("tiers (-want +got):\n%s", diff)
			}
			event := <-rec.Events
			if !strings.Contains(event, " "+tc.event+" ") {
				t.Errorf("event %q, want reason %s", event, tc.event)
			}
			checkVerdicts(t, "prism_webhook_share_total", m.shares, rewrite.ShareVerdicts(), tc.verdict)
			if tc.verdict == "" {
				return
			}
			var plan rewrite.Plan
			if err := json.Unmarshal([]byte(claim.Annotations[rewrite.AnnotationKey]), &plan); err != nil || plan.Share == nil {
				t.Fatalf("plan without a share decision (%v): %s", err, claim.Annotations[rewrite.AnnotationKey])
			}
			if plan.Share.Verdict != tc.verdict || (plan.Share.Usage == "") != (tc.profile.Status.Usage == nil) {
				t.Errorf("plan share %+v, want verdict %s and the measured use", plan.Share, tc.verdict)
			}
			if tc.verdict != "sized" {
				return
			}
			share := claim.Spec.Devices.Requests[0].FirstAvailable[0].Capacity
			if share == nil {
				t.Fatalf("share tier without capacity requests")
			}
			got := map[string]string{}
			for k, q := range share.Requests {
				got[string(k)] = q.String()
			}
			// Without a fleet view no plugin is known to grant a compute
			// limit: the share is counted at its limit, and has no config.
			if diff := cmp.Diff(map[string]string{"gpu.prism.dev/compute": "45", "gpu.prism.dev/memory": "8Gi"}, got); diff != "" {
				t.Errorf("share (-want +got):\n%s", diff)
			}
			want := "gpu gets 45% compute, 8Gi memory of a shareable GPU first (duty cycle p50 20% p95 32%, peak memory 6Gi, 3 runs), a whole GPU after"
			if !strings.Contains(event, want) {
				t.Errorf("event %q does not say %q", event, want)
			}
			for _, c := range claim.Spec.Devices.Config {
				if strings.Contains(string(c.Opaque.Parameters.Raw), "computeLimitPercent") {
					t.Errorf("config %s gives a compute limit that no plugin is known to grant", c.Opaque.Parameters.Raw)
				}
			}
		})
	}
}

// TestRewriterCountsABurstyShareAtItsRequest: where every shareable GPU's
// plugin leaves a share's SMs uncapped, a bursty job's share is counted at
// its request, the Event names its peak, and no config caps it; where one
// plugin is from before that rule (a rolling upgrade) and would hold the
// share to its request, the share is counted at its peak.
func TestRewriterCountsABurstyShareAtItsRequest(t *testing.T) {
	h100 := rewrite.Model{Name: "NVIDIA H100 80GB HBM3", Devices: 8, SharedDevices: 8, ComputeLimitDevices: 8, BandwidthGBps: 3352, FP32GFLOPS: 66908, MemoryBytes: 80 << 30}
	older := h100
	older.ComputeLimitDevices = 7
	for _, tc := range []struct {
		name    string
		model   rewrite.Model
		compute string
		event   string
	}{
		{"every plugin leaves shares uncapped", h100, "30", "gpu gets 30% compute (peaks at 45%), 8Gi memory of a shareable GPU first"},
		{"one plugin does not yet", older, "45", "gpu gets 45% compute, 8Gi memory of a shareable GPU first"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			m, err := NewMetrics(nil)
			if err != nil {
				t.Fatal(err)
			}
			rec := record.NewFakeRecorder(10)
			fleet := &rewrite.Fleet{Models: []rewrite.Model{tc.model}}
			h, err := New(Options{Profiles: fakeReader(t, measured(func(*prismv1alpha1.WorkloadProfile) {})), Policy: prismv1alpha1.PolicyPerformance, AutoProfile: true,
				Recorder: rec, Metrics: m, Capacity: func() rewrite.Capacity { return rewrite.Capacity{Shares: true} }, Fleet: func() *rewrite.Fleet { return fleet }})
			if err != nil {
				t.Fatal(err)
			}
			object := webhooktest.ReadFixture(t, "claim-profiled.json")
			claim := applyPatch(t, object, webhooktest.Call(t, h, webhooktest.ReviewBody(t, admissionv1.Create, webhooktest.ClaimGVK, object)))
			share := claim.Spec.Devices.Requests[0].FirstAvailable[0]
			if q := share.Capacity.Requests[gpuv1alpha1.ComputeCapacity.Qualified()]; share.Name != rewrite.ShareTierName || q.String() != tc.compute {
				t.Fatalf("first tier %s requests %s compute, want the share at %s", share.Name, q.String(), tc.compute)
			}
			if event := <-rec.Events; !strings.Contains(event, tc.event) {
				t.Errorf("event %q does not say %q", event, tc.event)
			}
			if configs := claim.Spec.Devices.Config; len(configs) > 0 {
				t.Errorf("configs %+v, want none: nothing caps the share", configs)
			}
			validateAdmits(t, claim)
		})
	}
}

// TestTimeSlicedClaimIsNeverAShare: whichever way the rewrite could make a
// request a share (the share tier, a Fractional profile's memory share, the
// memory floor as a capacity request), a request whose GpuConfig
// time-slices its GPU gets none of them, and prism-validate admits what
// the rewrite wrote.
func TestTimeSlicedClaimIsNeverAShare(t *testing.T) {
	// A memory floor, or a Fractional profile's memory share, needs a
	// measured peak.
	memoryBound := func(wp *prismv1alpha1.WorkloadProfile) {
		wp.Status.BoundType = prismv1alpha1.BoundTypeMemoryBound
		wp.Status.PeakMemory = ptr.To(resource.MustParse("20Gi"))
	}
	for _, tc := range []struct {
		name    string
		profile *prismv1alpha1.WorkloadProfile
		opts    func(*Options)
	}{
		{"a share from usage", measured(memoryBound), func(o *Options) { o.Capacity = func() rewrite.Capacity { return rewrite.Capacity{Shares: true} } }},
		{"the memory floor as a capacity request", measured(memoryBound), func(o *Options) {
			o.Capacity = func() rewrite.Capacity { return rewrite.Capacity{MemoryFloor: true, TierBounds: true} }
		}},
		{"a Fractional profile's memory share", measured(func(wp *prismv1alpha1.WorkloadProfile) {
			memoryBound(wp)
			wp.Spec.Sharing = prismv1alpha1.SharingFractional
		}), func(*Options) {}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			m, err := NewMetrics(nil)
			if err != nil {
				t.Fatal(err)
			}
			opts := Options{Profiles: fakeReader(t, tc.profile), Policy: prismv1alpha1.PolicyPerformance, Recorder: record.NewFakeRecorder(10), Metrics: m}
			tc.opts(&opts)
			h, err := New(opts)
			if err != nil {
				t.Fatal(err)
			}
			object := withConfig(t, timeSliced)
			claim := applyPatch(t, object, webhooktest.Call(t, h, webhooktest.ReviewBody(t, admissionv1.Create, webhooktest.ClaimGVK, object)))
			subs := claim.Spec.Devices.Requests[0].FirstAvailable
			if len(subs) == 0 {
				t.Fatalf("gpu request not rewritten: %+v", claim.Spec.Devices.Requests[0])
			}
			for _, sub := range subs {
				if c := gpuv1alpha1.SharedCapacities(sub.Capacity); len(c) > 0 {
					t.Errorf("tier %s of a time-sliced request names amounts of %v", sub.Name, c)
				}
			}

			validateAdmits(t, claim)
		})
	}
}

// TestRewriterCountsPartitionVerdicts: on a fleet that publishes MIG
// partitions, a claim whose usage fits one gets the partition first, and the
// metric counts the partition step's verdict, sized or why not.
func TestRewriterCountsPartitionVerdicts(t *testing.T) {
	const mib = 1 << 20
	fleet := &rewrite.Fleet{
		Models: []rewrite.Model{{Name: "NVIDIA H100 80GB HBM3", Devices: 2, BandwidthGBps: 3352, FP32GFLOPS: 66908, MemoryBytes: 81559 * mib, Multiprocessors: 132}},
		Partitions: []rewrite.PartitionModel{
			{Model: "NVIDIA H100 80GB HBM3", Profile: "1g.10gb", Devices: 7, MemoryBytes: 9984 * mib, Multiprocessors: 16},
			{Model: "NVIDIA H100 80GB HBM3", Profile: "1g.20gb", Devices: 4, MemoryBytes: 20096 * mib, Multiprocessors: 26},
			{Model: "NVIDIA H100 80GB HBM3", Profile: "3g.40gb", Devices: 2, MemoryBytes: 40448 * mib, Multiprocessors: 60},
		},
	}
	light := measured(func(wp *prismv1alpha1.WorkloadProfile) {
		wp.Status.Usage.DutyCycleP95MilliPercent = ptr.To(int32(5_000))
		wp.Status.Usage.PeakMemory = ptr.To(resource.MustParse("3Gi"))
	})
	// Heavy and measured by ncu too, so that the rewrite runs (a heavy
	// profile that NVML alone measured is profiled instead).
	heavy := measured(func(wp *prismv1alpha1.WorkloadProfile) {
		wp.Status.BoundType = prismv1alpha1.BoundTypeMemoryBound
		wp.Status.Usage.DutyCycleP95MilliPercent = ptr.To(int32(95_000))
	})
	// One whole GPU and nothing else: what a partition can stand in for.
	plain := `{"apiVersion":"resource.k8s.io/v1","kind":"ResourceClaim",
 "metadata":{"name":"light-0-gpu","namespace":"ml","annotations":{"prism.dev/profile":"train"}},
 "spec":{"devices":{"requests":[{"name":"gpu","exactly":{"deviceClassName":"gpu.prism.dev"}}]}}}`
	// The same with a GpuConfig that says Exclusive; the handler is made
	// without shares, so only the partition step reads the opt-out.
	exclusive := strings.Replace(plain, `}]}}}`, `}],"config":[{"opaque":{"driver":"gpu.prism.dev",
 "parameters":{"apiVersion":"gpu.prism.dev/v1alpha1","kind":"GpuConfig","sharing":{"strategy":"Exclusive"}}}}]}}}`, 1)
	for _, tc := range []struct {
		name    string
		profile *prismv1alpha1.WorkloadProfile
		claim   string
		// first is the gpu request's first subrequest; "": not rewritten.
		first   string
		verdict string
	}{
		{"light use: the smallest partition with 15 % of the SMs", light, plain, "mig-1g20gb", "sized"},
		{"heavy use: whole GPUs", heavy, plain, "", "heavy"},
		{"the claim's GpuConfig says Exclusive: opted out", light, exclusive, "", "opted-out"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			m, err := NewMetrics(nil)
			if err != nil {
				t.Fatal(err)
			}
			h, err := New(Options{Profiles: fakeReader(t, tc.profile), Policy: prismv1alpha1.PolicyPerformance, AutoProfile: true,
				Recorder: record.NewFakeRecorder(10), Metrics: m, Fleet: func() *rewrite.Fleet { return fleet }})
			if err != nil {
				t.Fatal(err)
			}
			object := []byte(tc.claim)
			first := ""
			if resp := webhooktest.Call(t, h, webhooktest.ReviewBody(t, admissionv1.Create, webhooktest.ClaimGVK, object)); resp.Patch != nil {
				if subs := applyPatch(t, object, resp).Spec.Devices.Requests[0].FirstAvailable; len(subs) > 0 {
					first = subs[0].Name
				}
			}
			if first != tc.first {
				t.Errorf("first subrequest %q, want %q", first, tc.first)
			}
			checkVerdicts(t, "prism_webhook_partition_total", m.partitions, rewrite.PartitionVerdicts(), tc.verdict)
		})
	}
}

// checkVerdicts: the counter of verdict want is 1 and every other is 0;
// want "" means none was counted.
func checkVerdicts[V fmt.Stringer](t *testing.T, name string, vec *prometheus.CounterVec, all []V, want string) {
	t.Helper()
	for _, v := range all {
		n := 0.0
		if v.String() == want {
			n = 1
		}
		if got := testutil.ToFloat64(vec.WithLabelValues(v.String())); got != n {
			t.Errorf("%s{verdict=%q} = %v, want %v", name, v, got, n)
		}
	}
}

// validateAdmits fails t if prism-validate refuses claim, as the rewrite
// wrote it, at create.
func validateAdmits(t *testing.T, claim *resourceapi.ResourceClaim) {
	t.Helper()
	vm, err := webhook.NewMetrics(nil)
	if err != nil {
		t.Fatal(err)
	}
	v, err := validate.New(vm)
	if err != nil {
		t.Fatal(err)
	}
	rewritten, err := json.Marshal(claim)
	if err != nil {
		t.Fatal(err)
	}
	if resp := webhooktest.Call(t, v, webhooktest.ReviewBody(t, admissionv1.Create, webhooktest.ClaimGVK, rewritten)); !resp.Allowed {
		t.Errorf("prism-validate refuses the rewritten claim: %s", resp.Result.Message)
	}
}
