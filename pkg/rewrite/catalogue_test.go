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
	"slices"
	"strings"
	"testing"

	"k8s.io/dynamic-resource-allocation/cel"

	gpuv1alpha1 "github.com/prismgpu/prism/api/gpu/v1alpha1"
)

func TestCatalogueEntriesDoNotHoldTheSeparator(t *testing.T) {
	for _, e := range Catalogue() {
		if strings.Contains(e, joinSeparator) || strings.HasPrefix(e, "(") && strings.HasSuffix(e, ")") {
			t.Errorf("entry %q would make a joined selector ambiguous", e)
		}
	}
}

func TestConjuncts(t *testing.T) {
	ultra, floor, cc := catalogue[selBandwidthUltra], catalogue[selMemoryFirst+3], catalogue[selCCFirst+1]
	user := `device.attributes["gpu.prism.dev"].index < 4`
	for name, tc := range map[string]struct {
		expr string
		want []string
	}{
		"one entry":                     {ultra, []string{ultra}},
		"a tier test and its two needs": {"(" + ultra + joinSeparator + floor + joinSeparator + cc + ")", []string{ultra, floor, cc}},
		"a user's test joined in":       {"(" + ultra + joinSeparator + user + ")", nil},
		"a user's test":                 {user, nil},
		"one entry in parentheses":      {"(" + ultra + ")", nil},
		"an unclosed join":              {"(" + ultra + joinSeparator + floor, nil},
		"an unopened join":              {ultra + joinSeparator + floor + ")", nil},
		"an or spliced between entries": {"(" + ultra + ") || (" + floor + ")", nil},
		"empty":                         {"", nil},
	} {
		t.Run(name, func(t *testing.T) {
			got, ok := Conjuncts(tc.expr)
			if ok != (tc.want != nil) || !slices.Equal(got, tc.want) {
				t.Errorf("Conjuncts = %q, %v; want %q", got, ok, tc.want)
			}
		})
	}
}

// TestJoinedSelectsWhatItsEntriesDo: on every known model, a joined
// selector matches exactly where each of its entries does.
func TestJoinedSelectsWhatItsEntriesDo(t *testing.T) {
	cache := cel.NewCache(64, cel.Features{EnableConsumableCapacity: true})
	matches := func(t *testing.T, expr string, d cel.Device) bool {
		t.Helper()
		prog := cache.GetOrCompile(expr)
		if prog.Error != nil {
			t.Fatalf("%s: %v", expr, prog.Error)
		}
		ok, _, err := prog.DeviceMatches(context.Background(), d)
		if err != nil {
			t.Fatalf("%s: %v", expr, err)
		}
		return ok
	}
	tiers := []selectorID{selBandwidthUltra, selBandwidthHigh, selBandwidthLow, selFP32Fast, selFP32Value}
	for name, s := range loadSKUs(t) {
		dev := nodeSlice("n", s, 1).Spec.Devices[0]
		d := cel.Device{Driver: gpuv1alpha1.DriverName, Attributes: dev.Attributes, Capacity: dev.Capacity}
		for _, tierID := range tiers {
			for floor := range len(memoryFloorsGi) {
				for cc := range len(ccFloors) {
					entries := []string{catalogue[tierID], catalogue[selMemoryFirst+selectorID(floor)], catalogue[selCCFirst+selectorID(cc)]}
					expr, err := joined(entries)
					if err != nil {
						t.Fatal(err)
					}
					want := true
					for _, e := range entries {
						want = want && matches(t, e, d)
					}
					if got := matches(t, expr, d); got != want {
						t.Errorf("%s: %s matches %v, its entries %v", name, expr, got, want)
					}
				}
			}
		}
	}
}
