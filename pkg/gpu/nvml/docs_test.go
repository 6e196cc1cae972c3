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

package nvml

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	dracel "k8s.io/dynamic-resource-allocation/cel"
	"k8s.io/klog/v2/ktesting"

	gpuv1alpha1 "github.com/prismgpu/prism/api/gpu/v1alpha1"
	"github.com/prismgpu/prism/pkg/gpu"
)

// Every CEL example in docs/attributes.md must compile with the
// scheduler's CEL environment and select gpu-0 of the simulated HGX H100
// node, so the documentation cannot drift from what is published.
func TestDocumentedCELExamplesSelectAnH100(t *testing.T) {
	_, ctx := ktesting.NewTestContext(t)
	doc, err := os.ReadFile(filepath.Join("..", "..", "..", "docs", "attributes.md"))
	if err != nil {
		t.Fatalf("reading docs: %v", err)
	}
	var examples []string
	for i, block := range strings.Split(string(doc), "```cel\n") {
		if i == 0 {
			continue
		}
		body, _, _ := strings.Cut(block, "```")
		for _, line := range strings.Split(strings.TrimSpace(body), "\n") {
			examples = append(examples, line)
		}
	}
	if len(examples) < 21 {
		t.Fatalf("found %d CEL examples in docs/attributes.md, want at least one per attribute", len(examples))
	}

	sim := simulate(t, loadFleet(t, filepath.Join("testdata", "h100-sxm-8.yaml")), "node-a")
	published, err := gpu.ResourceDevices(ctx, discover(t, sim), gpu.PublishOptions{SysFS: sim.SysFS()})
	if err != nil {
		t.Fatalf("ResourceDevices: %v", err)
	}
	device := dracel.Device{Driver: gpuv1alpha1.DriverName, Attributes: published[0].Attributes, Capacity: published[0].Capacity}

	compiler := dracel.GetCompiler(dracel.Features{})
	for _, expr := range examples {
		result := compiler.CompileCELExpression(expr, dracel.Options{})
		if result.Error != nil {
			t.Errorf("%s\n  does not compile: %v", expr, result.Error)
			continue
		}
		matches, _, err := result.DeviceMatches(ctx, device)
		if err != nil || !matches {
			t.Errorf("%s\n  = %v, %v on gpu-0; want true", expr, matches, err)
		}
	}
}
