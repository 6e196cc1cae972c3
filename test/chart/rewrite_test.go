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

package chart

import (
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
)

// TestRewriteKnobs: the controller gets the rewrite's three knobs and the
// profiling switch from rewrite.*, with the binary's defaults.
func TestRewriteKnobs(t *testing.T) {
	var got []string
	for _, a := range container(t, render(t).controller(t), "controller").Args {
		for _, f := range []string{"--policy=", "--preference=", "--memory-floor=", "--auto-profile="} {
			if strings.HasPrefix(a, f) {
				got = append(got, a)
			}
		}
	}
	want := []string{"--policy=performance", "--auto-profile=true", "--preference=ladder", "--memory-floor=capacity"}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("controller's rewrite flags (-want +got):\n%s", diff)
	}
}

// TestPluginPublishesFiguresForCapacityBounds: the plugin publishes its
// figures as capacities where the controller may write tier bounds as
// capacity requests, and kubeletPlugin.figuresAsCapacity turns that off.
func TestPluginPublishesFiguresForCapacityBounds(t *testing.T) {
	for _, tc := range []struct {
		name string
		args []string
		want string
	}{
		{"default", nil, "true"},
		{"CEL memory floor", []string{"--set", "rewrite.memoryFloor=cel"}, "false"},
		{"no rewrite", []string{"--set", "rewrite.enabled=false"}, "false"},
		{"turned off", []string{"--set", "kubeletPlugin.figuresAsCapacity=false"}, "false"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, _ := envValue(container(t, render(t, tc.args...).plugin(t), "kubelet-plugin"), "PRISM_FIGURES_AS_CAPACITY")
			if got != tc.want {
				t.Errorf("PRISM_FIGURES_AS_CAPACITY=%q, want %q", got, tc.want)
			}
		})
	}
}
