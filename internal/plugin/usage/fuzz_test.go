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

package usage

import (
	"encoding/json"
	"testing"
	"time"

	"k8s.io/klog/v2/ktesting"

	gpuv1alpha1 "github.com/prismgpu/prism/api/gpu/v1alpha1"
	prismv1alpha1 "github.com/prismgpu/prism/api/prism/v1alpha1"
	"github.com/prismgpu/prism/api/prism/v1alpha1/crdtest"
)

// FuzzMerge merges any run the plugin could have recorded (a run is kept
// on disk between samples, so it is read back from JSON) into any usage
// the API server could have stored, and fails on a status the API server
// would refuse: a profile the plugin cannot publish is lost.
func FuzzMerge(f *testing.F) {
	v := crdtest.NewValidator(f)
	f.Add([]byte(`{"dutyCycle":[0,0,0,0,0,0,0,0,0,0,3],"memorySamples":3,"peakMemoryBytes":1073741824}`), []byte(`{"runs":1,"samples":3,"peakMemory":"2Gi"}`), "NVIDIA H100 80GB HBM3", int32(40), int64(4<<30))
	f.Add([]byte(`{"dutyCycle":[5],"smActivitySum":1e300,"smActivitySamples":1,"dramActivitySum":-5,"dramActivitySamples":2}`), []byte(``), "", int32(0), int64(0))
	f.Add([]byte(`{"dutyCycle":[2147483647,2147483647],"memorySamples":1,"peakMemoryBytes":9223372036854775807}`), []byte(`{"runs":2147483647,"samples":2147483647}`), "A100", int32(99), int64(-1))
	f.Fuzz(func(t *testing.T, runJSON, prevJSON []byte, product string, compute int32, memory int64) {
		var run Run
		if json.Unmarshal(runJSON, &run) != nil {
			return
		}
		var prev *prismv1alpha1.UsageProfile
		if len(prevJSON) > 0 {
			prev = &prismv1alpha1.UsageProfile{}
			if json.Unmarshal(prevJSON, prev) != nil {
				return
			}
			// Only what the API server would have stored.
			if errs := v.ValidateStatus(t, prismv1alpha1.WorkloadProfileStatus{Usage: prev}); len(errs) > 0 {
				return
			}
		}
		// The product name comes from NVML, bounded as the plugin
		// bounds it.
		if len(product) > prismv1alpha1.MaxProductNameLength {
			return
		}
		// A share is what the plugin granted: a compute percentage and
		// a memory count the allocation consumed, in the share's range.
		share := gpuv1alpha1.Share{ComputePercent: compute, MemoryBytes: memory}
		if share.Validate() != nil {
			return
		}
		var granted *gpuv1alpha1.Share
		if share != (gpuv1alpha1.Share{}) {
			granted = &share
		}
		_, ctx := ktesting.NewTestContext(t)
		out := Merge(ctx, prev, Finished{Run: run, ProductName: product, Share: granted, EndedAt: time.Unix(1.8e9, 0)})
		if out == nil {
			return
		}
		if errs := v.ValidateStatus(t, prismv1alpha1.WorkloadProfileStatus{Usage: out}); len(errs) > 0 {
			t.Fatalf("Merge(%s, %s) gave a usage the API server refuses: %v", runJSON, prevJSON, errs)
		}
	})
}
