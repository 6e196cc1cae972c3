package rewrite

import (
	"fmt"
	"strings"
	"sync"

	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	"k8s.io/dynamic-resource-allocation/cel"
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
	attrs = `device.attributes["` + DriverName + `"]`
	caps  = `device.capacity["` + DriverName + `"]`
)

func bandwidthIs(class string) string {
	return fmt.Sprintf(`"bandwidthClass" in %[1]s && %[1]s.bandwidthClass == %[2]q`, attrs, class)
}

func fp32AtLeast(gflops int64) string {
	return fmt.Sprintf(`"fp32GFLOPS" in %[1]s && %[1]s.fp32GFLOPS >= %[2]d`, attrs, gflops)
}

func memoryAtLeast(gi int64) string {
	q := resource.NewQuantity(gi<<30, resource.BinarySI)
	return fmt.Sprintf(`"memory" in %[1]s && %[1]s.memory.compareTo(quantity(%[2]q)) >= 0`, caps, q.String())
}

func ccAtLeast(major, minor int) string {
	return fmt.Sprintf(`"cudaComputeCapability" in %[1]s && %[1]s.cudaComputeCapability.compareTo(semver("%[2]d.%[3]d.0")) >= 0`, attrs, major, minor)
}

var catalogue = func() []string {
	c := []string{
		selBandwidthUltra: bandwidthIs("ultra"),
		selBandwidthHigh:  bandwidthIs("high"),
		selBandwidthMid:   bandwidthIs("mid"),
		selBandwidthLow:   bandwidthIs("low"),
		selFP32Fast:       fp32AtLeast(60000),
		// Cheap cards with real FP32 (L4, A10, L40S, RTX 4090): the class test
		// comes first because it rejects the HBM parts without arithmetic.
		selFP32Value: fmt.Sprintf(`"bandwidthClass" in %[1]s && %[1]s.bandwidthClass in ["low", "mid"] && "fp32GFLOPS" in %[1]s && %[1]s.fp32GFLOPS >= 25000`, attrs),
	}
	for _, gi := range memoryFloorsGi {
		c = append(c, memoryAtLeast(gi))
	}
	for _, cc := range ccFloors {
		c = append(c, ccAtLeast(cc.major, cc.minor))
	}
	return append(c, thresholdExpressions()...)
}()

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
