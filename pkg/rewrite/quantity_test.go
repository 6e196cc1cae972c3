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

package rewrite

import (
	"context"
	"errors"
	"math"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"k8s.io/apimachinery/pkg/api/resource"

	prismv1alpha1 "github.com/prismgpu/prism/api/prism/v1alpha1"
)

// TestTenantQuantities writes into a profile the memory figures a tenant can
// choose, among them ones that are cheap to write and were expensive to
// compare (issue 31: CmpInt64 on "E1111011110" ran for more than ten
// minutes per admission). Each must come back at once, as a memory need or
// as ErrInvalidProfile naming the field and the bound.
func TestTenantQuantities(t *testing.T) {
	scaled := func(v int64, s int32) *resource.Quantity { return resource.NewScaledQuantity(v, resource.Scale(s)) }
	const tooLarge = "must be at most 16Ti"
	tests := []struct {
		name    string
		profile Profile
		// needs is the plan's HardNeeds; err the whole error. One is "".
		needs, err string
	}{
		{name: "FuzzRewrite's crasher: zero times 10^1111011110", profile: Profile{MinMemory: qty("E1111011110")}},
		{name: "huge exponent", profile: Profile{MinMemory: qty("1E1111011110")},
			err: `rewrite for profile "p": invalid profile: minMemory: Invalid value: "100e1111011108": ` + tooLarge},
		{name: "huge exponent on the peak", profile: Profile{PeakMemory: qty("9e999999999")},
			err: `rewrite for profile "p": invalid profile: peakMemory: Invalid value: "9e999999999": ` + tooLarge},
		{name: "negative huge exponent", profile: Profile{PeakMemory: qty("-1E1111011110")},
			err: `rewrite for profile "p": invalid profile: peakMemory: Invalid value: "-100e1111011108": must not be negative`},
		{name: "largest scale", profile: Profile{MinMemory: scaled(1, math.MaxInt32)},
			err: `rewrite for profile "p": invalid profile: minMemory: Invalid value: "10e2147483646": ` + tooLarge},
		{name: "smallest scale is a byte", profile: Profile{MinMemory: scaled(1, -math.MaxInt32)}, needs: "memory>=7Gi"},
		{name: "a byte above the bound", profile: Profile{MinMemory: qty("17592186044417")},
			err: `rewrite for profile "p": invalid profile: minMemory: Invalid value: "17592186044417": ` + tooLarge},
		{name: "at the bound, above every bucket", profile: Profile{PeakMemory: qty("16Ti")},
			err: `rewrite for profile "p": invalid profile: needs 19353552132506 bytes per device, more than the largest bucket (139Gi)`},
		{name: "a fraction of a byte", profile: Profile{MinMemory: qty("0.5")}, needs: "memory>=7Gi"},
		{name: "ordinary", profile: Profile{MinMemory: qty("40Gi"), PeakMemory: qty("20Gi")}, needs: "memory>=44Gi"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			tc.profile.Name, tc.profile.BoundType = "p", prismv1alpha1.BoundTypeMemoryBound
			var (
				plan *Plan
				err  error
			)
			done := make(chan struct{})
			go func() {
				defer close(done)
				_, plan, err = Rewrite(context.Background(), gpuSpec(exactGPU("gpu", 1)), tc.profile)
			}()
			// Only turns a hang into a failure; it says nothing about speed.
			select {
			case <-done:
			case <-time.After(time.Minute):
				t.Fatal("Rewrite still running after a minute")
			}
			gotErr, gotNeeds := "", ""
			if err != nil {
				gotErr = err.Error()
				if !errors.Is(err, ErrInvalidProfile) {
					t.Errorf("error %v is not ErrInvalidProfile", err)
				}
			} else {
				gotNeeds = plan.HardNeeds
			}
			if diff := cmp.Diff(tc.err, gotErr); diff != "" {
				t.Errorf("error (-want +got):\n%s", diff)
			}
			if diff := cmp.Diff(tc.needs, gotNeeds); diff != "" {
				t.Errorf("hard needs (-want +got):\n%s", diff)
			}
		})
	}
}
