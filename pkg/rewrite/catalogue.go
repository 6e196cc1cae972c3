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
	"fmt"
	"strings"
	"sync"

	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	"k8s.io/dynamic-resource-allocation/cel"

	gpuv1alpha1 "github.com/prismgpu/prism/api/gpu/v1alpha1"
)

// selectorID names one entry of the fixed selector catalogue. Generated
// selectors are only ever looked up by ID; nothing from a profile, a claim or
// an annotation reaches the expression text.
type selectorID int

const (
	selBandwidthUltra selectorID = iota
	selBandwidthHigh
	selBandwidthMid
	selBandwidthLow
	selFP32Fast
	selFP32Value
	// selMemoryFirst is the first of len(memoryFloorsGi) memory floors.
	selMemoryFirst
)

// selCCFirst is the first of len(ccFloors) compute capability floors.
var selCCFirst = selMemoryFirst + selectorID(len(memoryFloorsGi))

// memoryFloorsGi are the memory buckets, in GiB. Each floor sits just below
// what NVML reports for a GPU memory class (8 GB cards, T4 15 GiB, L4/A10
// 22.5 GiB, A100-40GB 40 GiB, L40S 45 GiB, H100/A100-80GB 79.6-80 GiB,
// H200 140.4 GiB), so every card of a class passes its own bucket. Using the
// marketing size instead ("80Gi") would silently exclude an H100, which
// reports 79.6 GiB.
var memoryFloorsGi = [...]int64{7, 15, 22, 39, 44, 79, 139}

// ccFloors are the CUDA compute capability buckets: Turing, Ampere (A100),
// Ampere (GA10x), Ada, Hopper, Blackwell. A need between two floors is
// rounded up, which can only exclude devices, never admit a wrong one.
var ccFloors = [...]struct{ major, minor int }{{7, 5}, {8, 0}, {8, 6}, {8, 9}, {9, 0}, {10, 0}}

// Attribute and capacity references are guarded with "in" so that a device
// published by an older plugin without the attribute is simply not selected.
// An unguarded lookup would be a CEL runtime error, which aborts scheduling
// of the pod on every node, not just this one.
const (
	attrs = `device.attributes["` + gpuv1alpha1.DriverName + `"]`
	caps  = `device.capacity["` + gpuv1alpha1.DriverName + `"]`
)

// The attributes and the capacity the catalogue reads, as CEL names them.
const (
	bandwidthClass = gpuv1alpha1.BandwidthClassAttribute
	fp32           = gpuv1alpha1.FP32GFLOPSAttribute
	memory         = gpuv1alpha1.MemoryCapacity
	cc             = gpuv1alpha1.CUDAComputeCapabilityAttribute
)

func bandwidthIs(class string) string {
	return fmt.Sprintf(`%[1]q in %[2]s && %[2]s.%[1]s == %[3]q`, bandwidthClass, attrs, class)
}

func fp32AtLeast(gflops int64) string {
	return fmt.Sprintf(`%[1]q in %[2]s && %[2]s.%[1]s >= %[3]d`, fp32, attrs, gflops)
}

func memoryAtLeast(gi int64) string {
	q := resource.NewQuantity(gi<<30, resource.BinarySI)
	return fmt.Sprintf(`%[1]q in %[2]s && %[2]s.%[1]s.compareTo(quantity(%[3]q)) >= 0`, memory, caps, q.String())
}

func ccAtLeast(major, minor int) string {
	return fmt.Sprintf(`%[1]q in %[2]s && %[2]s.%[1]s.compareTo(semver("%[3]d.%[4]d.0")) >= 0`, cc, attrs, major, minor)
}

var catalogue = func() []string {
	c := []string{
		selBandwidthUltra: bandwidthIs(gpuv1alpha1.BandwidthClassUltra),
		selBandwidthHigh:  bandwidthIs(gpuv1alpha1.BandwidthClassHigh),
		selBandwidthMid:   bandwidthIs(gpuv1alpha1.BandwidthClassMid),
		selBandwidthLow:   bandwidthIs(gpuv1alpha1.BandwidthClassLow),
		selFP32Fast:       fp32AtLeast(60000),
		// Cheap cards with real FP32 (L4, A10, L40S, RTX 4090): the class test
		// comes first because it rejects the HBM parts without arithmetic.
		selFP32Value: fmt.Sprintf(`%[1]q in %[3]s && %[3]s.%[1]s in [%[4]q, %[5]q] && %[2]q in %[3]s && %[3]s.%[2]s >= 25000`,
			bandwidthClass, fp32, attrs, gpuv1alpha1.BandwidthClassLow, gpuv1alpha1.BandwidthClassMid),
	}
	for _, gi := range memoryFloorsGi {
		c = append(c, memoryAtLeast(gi))
	}
	for _, cc := range ccFloors {
		c = append(c, ccAtLeast(cc.major, cc.minor))
	}
	c = append(c, thresholdExpressions()...)
	return append(c, migProfileExpressions()...)
}()

// selMIGFirst is the first of len(migProfileNames) MIG profile tests.
var selMIGFirst = selectorID(len(catalogue) - len(migProfileNames))

// Catalogue returns every selector expression Rewrite can generate. The
// list is fixed at build time; it is small because kube-scheduler keeps only
// ten compiled CEL programs, and a cache miss costs a full compilation.
func Catalogue() []string {
	return append([]string(nil), catalogue...)
}

var (
	verifyOnce sync.Once
	verifyErrs []error
)

// verifiedSelector returns the selector for id after it has been compiled,
// with cost estimation, under the limits the API server enforces. The
// catalogue is fixed, so every entry is compiled once per process.
func verifiedSelector(id selectorID) (string, error) {
	verifyOnce.Do(func() {
		compiler := cel.GetCompiler(cel.Features{})
		verifyErrs = make([]error, len(catalogue))
		for i, expr := range catalogue {
			verifyErrs[i] = checkExpression(compiler.CompileCELExpression(expr, cel.Options{}))
		}
	})
	if id < 0 || int(id) >= len(catalogue) {
		return "", fmt.Errorf("selector %d is not in the catalogue", id)
	}
	if err := verifyErrs[id]; err != nil {
		return "", err
	}
	return catalogue[id], nil
}

func checkExpression(r cel.CompilationResult) error {
	switch {
	case r.Error != nil:
		return fmt.Errorf("catalogue selector %q: %w", r.Expression, r.Error)
	case len(r.Expression) > resourceapi.CELSelectorExpressionMaxLength:
		return fmt.Errorf("catalogue selector %q: length %d exceeds %d", r.Expression, len(r.Expression), resourceapi.CELSelectorExpressionMaxLength)
	case r.MaxCost > resourceapi.CELSelectorExpressionMaxCost:
		return fmt.Errorf("catalogue selector %q: estimated cost %d exceeds %d", r.Expression, r.MaxCost, resourceapi.CELSelectorExpressionMaxCost)
	}
	return nil
}

// joinSeparator sits between the catalogue entries of a joined selector.
// No entry holds it (TestCatalogueEntriesDoNotHoldTheSeparator), so a
// joined selector splits back into its entries without ambiguity.
const joinSeparator = ") && ("

// joined is the one selector that carries a subrequest's generated tests.
// The allocator builds a full CEL activation of the device for every
// selector it evaluates, and that activation is most of what an evaluation
// costs; the program itself adds little. So a tier test, a memory floor and
// a compute-capability floor in one expression cost one activation on a
// device, where three selectors cost up to three. A single entry stays as
// it is. Every joined string is compiled and cost-checked once per process.
func joined(exprs []string) (string, error) {
	if len(exprs) == 1 {
		return exprs[0], nil
	}
	expr := "(" + strings.Join(exprs, joinSeparator) + ")"
	if err, ok := joinedChecked.Load(expr); ok {
		return expr, asError(err)
	}
	err := checkExpression(cel.GetCompiler(cel.Features{}).CompileCELExpression(expr, cel.Options{}))
	joinedChecked.Store(expr, err)
	return expr, err
}

// joinedChecked caches checkExpression per joined string: a few strings
// per profile and fleet, so it stays small.
var joinedChecked sync.Map

func asError(v any) error {
	err, _ := v.(error)
	return err
}

var catalogueSet = sync.OnceValue(func() map[string]bool {
	set := make(map[string]bool, len(catalogue))
	for _, e := range catalogue {
		set[e] = true
	}
	return set
})

// Conjuncts returns the catalogue entries a selector that Rewrite generated
// joins, in order, and false where expr is not such a selector. Callers use
// it to check that a stored claim holds no CEL that neither Rewrite nor the
// user wrote, and to say which of the joined tests a device fails.
func Conjuncts(expr string) ([]string, bool) {
	set := catalogueSet()
	if set[expr] {
		return []string{expr}, true
	}
	inner, opened := strings.CutPrefix(expr, "(")
	inner, closed := strings.CutSuffix(inner, ")")
	if !opened || !closed {
		return nil, false
	}
	parts := strings.Split(inner, joinSeparator)
	if len(parts) < 2 {
		return nil, false
	}
	for _, p := range parts {
		if !set[p] {
			return nil, false
		}
	}
	return parts, true
}
