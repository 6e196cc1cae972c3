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

package v1alpha1_test

import (
	"fmt"
	"slices"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
	"k8s.io/apiextensions-apiserver/pkg/apis/apiextensions"
	apiextensionsv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"
	structuralschema "k8s.io/apiextensions-apiserver/pkg/apiserver/schema"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/prismgpu/prism/api/prism/v1alpha1"
	"github.com/prismgpu/prism/api/prism/v1alpha1/crdtest"
)

func TestCRDShape(t *testing.T) {
	crd := crdtest.Load(t)
	if crd.Spec.Group != v1alpha1.GroupVersion.Group || crd.Spec.Scope != apiextensionsv1.NamespaceScoped ||
		crd.Spec.Names.Kind != "WorkloadProfile" || len(crd.Spec.Versions) != 1 {
		t.Fatalf("unexpected CRD: %+v", crd.Spec)
	}
	v := crd.Spec.Versions[0]
	if v.Name != v1alpha1.GroupVersion.Version || v.Subresources == nil || v.Subresources.Status == nil {
		t.Errorf("version %s lacks the status subresource", v.Name)
	}
	var columns []string
	for _, c := range v.AdditionalPrinterColumns {
		columns = append(columns, c.Name+"="+c.JSONPath)
	}
	want := []string{
		"Bound=.status.boundType",
		"SM=.status.smThroughput",
		"Memory=.status.memoryThroughput",
		"Occupancy=.status.achievedOccupancy",
		"Age=.metadata.creationTimestamp",
	}
	if strings.Join(columns, "\n") != strings.Join(want, "\n") {
		t.Errorf("printer columns\n%s\nwant\n%s", strings.Join(columns, "\n"), strings.Join(want, "\n"))
	}
	// The API has no floats: every number in the schema is an integer
	// or a quantity (int-or-string).
	eachProperty("", *v.Schema.OpenAPIV3Schema, func(path string, p apiextensionsv1.JSONSchemaProps) {
		if p.Type == "number" {
			t.Errorf("%s is a float", path)
		}
	})
}

// eachProperty calls visit on p and every property below it, with its
// path: ".spec.minMemory", "[]" for the items of an array.
func eachProperty(path string, p apiextensionsv1.JSONSchemaProps, visit func(path string, p apiextensionsv1.JSONSchemaProps)) {
	visit(path, p)
	for name, c := range p.Properties {
		eachProperty(path+"."+name, c, visit)
	}
	if p.Items != nil && p.Items.Schema != nil {
		eachProperty(path+"[]", *p.Items.Schema, visit)
	}
}

func TestCRDValidation(t *testing.T) {
	validator := crdtest.NewValidator(t)
	i32 := func(v int32) *int32 { return &v }
	valid := func() *v1alpha1.WorkloadProfile {
		min := resource.MustParse("40Gi")
		return &v1alpha1.WorkloadProfile{
			TypeMeta:   metav1.TypeMeta{APIVersion: "prism.dev/v1alpha1", Kind: "WorkloadProfile"},
			ObjectMeta: metav1.ObjectMeta{Name: "w", Namespace: "ml"},
			Spec: v1alpha1.WorkloadProfileSpec{
				MinMemory: &min, MinComputeCapability: "8.0", Policy: v1alpha1.PolicyEconomy, Sharing: v1alpha1.SharingFractional,
			},
			Status: v1alpha1.WorkloadProfileStatus{
				BoundType: v1alpha1.BoundTypeMemoryBound, SMThroughputMilliPercent: i32(20_410), MemoryThroughputMilliPercent: i32(100_000),
				BoundTimeShares: &v1alpha1.BoundTimeShares{MemoryBoundMilliPercent: 100_000},
				WavesPerSM:      resource.NewMilliQuantity(10, resource.DecimalSI),
				TopKernels:      []v1alpha1.KernelSummary{{Name: "k", Launches: 1, TimeShareMilliPercent: 100_000}},
				Device:          &v1alpha1.ProfiledDevice{ComputeCapability: "10.0"},
				Source:          &v1alpha1.ProfileSource{Type: v1alpha1.ProfileSourceImport},
			},
		}
	}
	tests := []struct {
		name   string
		mutate func(*v1alpha1.WorkloadProfile)
		// field is the path the error must name; "" means valid.
		field string
	}{
		{"valid", func(*v1alpha1.WorkloadProfile) {}, ""},
		{"compute capability without minor", func(w *v1alpha1.WorkloadProfile) { w.Spec.MinComputeCapability = "8" }, "spec.minComputeCapability"},
		{"unknown policy", func(w *v1alpha1.WorkloadProfile) { w.Spec.Policy = "fastest" }, "spec.policy"},
		{"unknown sharing", func(w *v1alpha1.WorkloadProfile) { w.Spec.Sharing = "yes" }, "spec.sharing"},
		{"unknown bound type", func(w *v1alpha1.WorkloadProfile) { w.Status.BoundType = "IOBound" }, "status.boundType"},
		{"over 100 %", func(w *v1alpha1.WorkloadProfile) { w.Status.SMThroughputMilliPercent = i32(100_001) }, "status.smThroughputMilliPercent"},
		{"negative", func(w *v1alpha1.WorkloadProfile) { w.Status.AchievedOccupancyMilliPercent = i32(-1) }, "status.achievedOccupancyMilliPercent"},
		{"kernel without launches", func(w *v1alpha1.WorkloadProfile) { w.Status.TopKernels[0].Launches = 0 }, "status.topKernels[0].launches"},
		{"class share over 100 %", func(w *v1alpha1.WorkloadProfile) {
			w.Status.BoundTimeShares = &v1alpha1.BoundTimeShares{MemoryBoundMilliPercent: 100_001}
		}, "status.boundTimeShares.memoryBoundMilliPercent"},
		{"negative class share", func(w *v1alpha1.WorkloadProfile) {
			w.Status.BoundTimeShares = &v1alpha1.BoundTimeShares{LatencyBoundMilliPercent: -1}
		}, "status.boundTimeShares.latencyBoundMilliPercent"},
		{"unknown source", func(w *v1alpha1.WorkloadProfile) { w.Status.Source.Type = "Guess" }, "status.source.type"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			w := valid()
			tc.mutate(w)
			errs := validator.ValidateProfile(t, w)
			var fields []string
			for _, e := range errs {
				fields = append(fields, e.Error())
			}
			got := strings.Join(fields, "; ")
			switch {
			case tc.field == "" && len(errs) > 0:
				t.Errorf("valid object rejected: %s", got)
			case tc.field != "" && !strings.Contains(got, tc.field):
				t.Errorf("errors %q do not name %s", got, tc.field)
			}
		})
	}
}

// TestCRDStructural checks the manifest's schema the way the API server
// does before it accepts a CRD: it must be structural, allOf patterns
// beside the int-or-string of every quantity included.
func TestCRDStructural(t *testing.T) {
	crd := crdtest.Load(t)
	internal := &apiextensions.JSONSchemaProps{}
	if err := apiextensionsv1.Convert_v1_JSONSchemaProps_To_apiextensions_JSONSchemaProps(crd.Spec.Versions[0].Schema.OpenAPIV3Schema, internal, nil); err != nil {
		t.Fatal(err)
	}
	s, err := structuralschema.NewStructural(internal)
	if err != nil {
		t.Fatal(err)
	}
	if errs := structuralschema.ValidateStructural(nil, s); len(errs) > 0 {
		t.Errorf("schema is not structural: %v", errs.ToAggregate())
	}
}

// TestCRDQuantityPattern checks that every quantity field carries
// QuantityPattern beside resource.Quantity's own, and that the API server
// turns away, in each of them, the strings that make ParseQuantity or Cmp
// run for minutes, before anything decodes them (issue 31).
func TestCRDQuantityPattern(t *testing.T) {
	crd := crdtest.Load(t)
	var quantities []string
	eachProperty("", *crd.Spec.Versions[0].Schema.OpenAPIV3Schema, func(path string, p apiextensionsv1.JSONSchemaProps) {
		if p.XIntOrString {
			quantities = append(quantities, path)
			if !slices.ContainsFunc(p.AllOf, func(a apiextensionsv1.JSONSchemaProps) bool { return a.Pattern == v1alpha1.QuantityPattern }) {
				t.Errorf("%s lacks QuantityPattern: pattern %q, allOf %+v", path, p.Pattern, p.AllOf)
			}
		}
	})
	slices.Sort(quantities)
	want := []string{".spec.minMemory", ".status.arithmeticIntensity", ".status.dramBytes", ".status.flops", ".status.peakMemory", ".status.usage.peakMemory", ".status.usage.share.memory", ".status.wavesPerSM"}
	if diff := cmp.Diff(want, quantities); diff != "" {
		t.Errorf("quantity fields (-want +got):\n%s", diff)
	}

	validator := crdtest.NewValidatorFor(t, crd)
	for _, path := range want {
		for value, ok := range map[string]bool{
			"40Gi": true, "1500m": true, "0.5": true, "1e18": true, "9223372036854775807": true, "-1": true,
			"1E1111011110": false, "E1111011110": false, "9e999999999": false, "1e-999999999": false,
			"1234567890123456789e999999999": false, strings.Repeat("9", 33): false,
		} {
			// The strings are set in the decoded object: resource.MustParse
			// would itself hang on some of them.
			obj := map[string]any{"apiVersion": "prism.dev/v1alpha1", "kind": "WorkloadProfile", "metadata": map[string]any{"name": "w"}}
			parts := strings.Split(strings.TrimPrefix(path, "."), ".")
			var field any = value
			for i := len(parts) - 1; i > 0; i-- {
				field = map[string]any{parts[i]: field}
			}
			obj[parts[0]] = field
			var got []string
			for _, e := range validator.Validate(obj) {
				got = append(got, e.Error())
			}
			switch {
			case ok && len(got) > 0:
				t.Errorf("%s: %q rejected: %s", path, value, strings.Join(got, "; "))
			case !ok && !strings.Contains(strings.Join(got, "; "), strings.Join(parts, ".")):
				t.Errorf("%s: %q not rejected there: %q", path, value, got)
			}
		}
	}
}

// TestCRDLimits keeps the limits the writers of a status hold its fields
// to equal to the manifest's: a constant above its marker lets through
// what the API server then refuses, with the whole status.
func TestCRDLimits(t *testing.T) {
	want := map[string]string{
		".status.ncuVersion":               fmt.Sprintf("maxLength %d", v1alpha1.MaxNCUVersionLength),
		".status.device.productName":       fmt.Sprintf("maxLength %d", v1alpha1.MaxProductNameLength),
		".status.topKernels[].name":        fmt.Sprintf("maxLength %d", v1alpha1.MaxKernelNameLength),
		".status.topKernels":               fmt.Sprintf("maxItems %d", v1alpha1.MaxTopKernels),
		".status.device.computeCapability": "pattern " + v1alpha1.ComputeCapabilityPattern,
		".spec.minComputeCapability":       "pattern " + v1alpha1.ComputeCapabilityPattern,
	}
	got := map[string]string{}
	eachProperty("", *crdtest.Load(t).Spec.Versions[0].Schema.OpenAPIV3Schema, func(path string, p apiextensionsv1.JSONSchemaProps) {
		if _, ok := want[path]; !ok {
			return
		}
		switch {
		case p.MaxLength != nil:
			got[path] = fmt.Sprintf("maxLength %d", *p.MaxLength)
		case p.MaxItems != nil:
			got[path] = fmt.Sprintf("maxItems %d", *p.MaxItems)
		case p.Pattern != "":
			got[path] = "pattern " + p.Pattern
		}
	})
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("limits (-constants +manifest):\n%s", diff)
	}
}
