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
	"os"
	"testing"

	"github.com/google/go-cmp/cmp"
	"sigs.k8s.io/yaml"
)

// TestShippedIsTheChartDefault: the form the summary leads with is the one
// the chart's values ship. Where a default changes, the headline rows and
// the scheduling phase's --sched-figures-as-capacity default follow it.
func TestShippedIsTheChartDefault(t *testing.T) {
	raw, err := os.ReadFile("../../deployments/helm/prism/values.yaml")
	if err != nil {
		t.Fatal(err)
	}
	type shipped struct {
		Sharing struct {
			ConsumableCapacity bool `json:"consumableCapacity"`
		} `json:"sharing"`
		Rewrite struct {
			Enabled     bool   `json:"enabled"`
			Preference  string `json:"preference"`
			MemoryFloor string `json:"memoryFloor"`
		} `json:"rewrite"`
		KubeletPlugin struct {
			FiguresAsCapacity bool `json:"figuresAsCapacity"`
		} `json:"kubeletPlugin"`
	}
	var got shipped
	if err := yaml.Unmarshal(raw, &got); err != nil {
		t.Fatal(err)
	}
	var want shipped
	// The bench's fleets publish no shareable GPU, where the capacity
	// forms would be declined.
	want.Sharing.ConsumableCapacity = false
	want.Rewrite.Enabled = true
	want.Rewrite.Preference = string(ShippedPreference)
	want.Rewrite.MemoryFloor = ShippedForm.String()
	want.KubeletPlugin.FiguresAsCapacity = ShippedFiguresAsCapacity
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("the chart's defaults are not what the bench's summary leads with (-want +got):\n%s", diff)
	}
}
