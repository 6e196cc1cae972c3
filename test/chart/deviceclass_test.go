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
	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/utils/ptr"
)

// TestExtendedResourceDeviceClass: with deviceClasses.extendedResourceName
// a DeviceClass maps that resource to every Prism GPU; without, there is
// none, and a name that is not domain/name is refused.
func TestExtendedResourceDeviceClass(t *testing.T) {
	classes := func(args ...string) map[string]*resourceapi.DeviceClass {
		return objectsOfKind[resourceapi.DeviceClass](t, mustTemplate(t, args...), "DeviceClass")
	}
	if c, ok := classes()["extended-resource.gpu.prism.dev"]; ok {
		t.Errorf("DeviceClass %s rendered by default", c.Name)
	}
	c, ok := classes("--set", "deviceClasses.extendedResourceName=nvidia.com/gpu")["extended-resource.gpu.prism.dev"]
	if !ok {
		t.Fatal("no DeviceClass extended-resource.gpu.prism.dev with deviceClasses.extendedResourceName set")
	}
	want := resourceapi.DeviceClassSpec{
		ExtendedResourceName: ptr.To("nvidia.com/gpu"),
		Selectors:            []resourceapi.DeviceSelector{{CEL: &resourceapi.CELDeviceSelector{Expression: `device.driver == "gpu.prism.dev" && !has(device.attributes["gpu.prism.dev"].migProfile)`}}},
	}
	if diff := cmp.Diff(want, c.Spec); diff != "" {
		t.Errorf("DeviceClass spec (-want +got):\n%s", diff)
	}
	for _, bad := range []string{"gpu", "nvidia.com/", "Nvidia.com/gpu"} {
		if _, stderr, err := helmTemplate(t, "--set", "deviceClasses.extendedResourceName="+bad); err == nil || !strings.Contains(stderr, "extendedResourceName") {
			t.Errorf("extendedResourceName %q: err %v, stderr %q; want the schema to refuse it", bad, err, stderr)
		}
	}
}

// TestMIGDeviceClasses: the plain class never selects a MIG partition; the
// class of partitions, mig.gpu.prism.dev, exists only when the plugin's
// MIGPartitions gate is set in the chart, which also passes the gate on and
// keeps partitions out of the rewrite's class.
func TestMIGDeviceClasses(t *testing.T) {
	render := func(args ...string) (map[string]*resourceapi.DeviceClass, string) {
		out := mustTemplate(t, args...)
		return objectsOfKind[resourceapi.DeviceClass](t, out, "DeviceClass"), string(out)
	}
	selector := func(c *resourceapi.DeviceClass) string {
		if c == nil || len(c.Spec.Selectors) != 1 || c.Spec.Selectors[0].CEL == nil {
			t.Fatalf("DeviceClass %+v: want one CEL selector", c)
		}
		return c.Spec.Selectors[0].CEL.Expression
	}

	classes, out := render()
	if want := `device.driver == "gpu.prism.dev" && !has(device.attributes["gpu.prism.dev"].migProfile)`; selector(classes["gpu.prism.dev"]) != want {
		t.Errorf("gpu.prism.dev selects %q, want %q", selector(classes["gpu.prism.dev"]), want)
	}
	if _, ok := classes["mig.gpu.prism.dev"]; ok {
		t.Error("DeviceClass mig.gpu.prism.dev rendered without the MIGPartitions gate")
	}
	if c := classes["rewrite.gpu.prism.dev"]; c == nil || len(c.Spec.Selectors) != 0 {
		t.Errorf("rewrite.gpu.prism.dev without the gate: %+v, want no selectors (the tiers' own guards keep other devices out)", c)
	}
	if strings.Contains(out, "PRISM_FEATURE_GATES") {
		t.Error("PRISM_FEATURE_GATES set without any gate in the values")
	}

	classes, out = render("--set", "kubeletPlugin.featureGates.MIGPartitions=true")
	if want := `device.driver == "gpu.prism.dev" && has(device.attributes["gpu.prism.dev"].migProfile)`; selector(classes["mig.gpu.prism.dev"]) != want {
		t.Errorf("mig.gpu.prism.dev selects %q, want %q", selector(classes["mig.gpu.prism.dev"]), want)
	}
	if want := `!has(device.attributes["gpu.prism.dev"].migProfile)`; selector(classes["rewrite.gpu.prism.dev"]) != want {
		t.Errorf("rewrite.gpu.prism.dev selects %q, want %q: the rewrite's tiers are for whole GPUs", selector(classes["rewrite.gpu.prism.dev"]), want)
	}
	if !strings.Contains(out, "name: PRISM_FEATURE_GATES\n              value: \"MIGPartitions=true\"") {
		t.Error("the plugin is not given PRISM_FEATURE_GATES=MIGPartitions=true")
	}
	if _, stderr, err := helmTemplate(t, "--set", "kubeletPlugin.featureGates.MIGPartitions=yes"); err == nil || !strings.Contains(stderr, "featureGates") {
		t.Errorf("featureGates.MIGPartitions=yes: err %v, stderr %q; want the schema to refuse it", err, stderr)
	}
}
