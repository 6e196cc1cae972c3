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
	"math"
	"math/big"
	"regexp"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"gopkg.in/inf.v0"
	"k8s.io/apimachinery/pkg/api/resource"
	"k8s.io/apimachinery/pkg/util/validation/field"

	"github.com/prismgpu/prism/api/prism/v1alpha1"
)

// finish runs f and fails the test if f has not returned after a minute.
// The deadline only turns a hang into a failure (Cmp on "1E1111011110"
// ran for more than ten minutes); it says nothing about speed.
func finish(t *testing.T, f func()) {
	t.Helper()
	done := make(chan struct{})
	go func() {
		defer close(done)
		f()
	}()
	select {
	case <-done:
	case <-time.After(time.Minute):
		t.Fatal("still running after a minute")
	}
}

func TestBoundedValue(t *testing.T) {
	parsed := func(s string) resource.Quantity { return resource.MustParse(s) }
	pow10 := func(n int64) *big.Int { return new(big.Int).Exp(big.NewInt(10), big.NewInt(n), nil) }
	const tooLarge = "must be at most 16Ti"
	tests := []struct {
		name  string
		q     resource.Quantity
		bound int64 // 0: MaxDeviceMemory
		want  int64
		// wantErr is the whole error; "" means none.
		wantErr string
	}{
		{name: "binary suffix", q: parsed("40Gi"), want: 40 << 30},
		{name: "decimal suffix", q: parsed("20G"), want: 20e9},
		{name: "zero", q: parsed("0")},
		{name: "zero with a huge exponent (FuzzRewrite's crasher)", q: parsed("E1111011110")},
		{name: "fraction rounds up", q: parsed("0.5"), want: 1},
		{name: "milli rounds up", q: parsed("1500m"), want: 2},
		{name: "binary fraction", q: parsed("1.5Gi"), want: 3 << 29},
		{name: "at the bound", q: parsed("16Ti"), want: v1alpha1.MaxDeviceMemory},
		{name: "at the bound in milli", q: parsed("17592186044416000m"), want: v1alpha1.MaxDeviceMemory},
		{name: "a milli above the bound", q: parsed("17592186044416001m"),
			wantErr: `spec.minMemory: Invalid value: "17592186044416001m": ` + tooLarge},
		{name: "a byte above the bound", q: parsed("17592186044417"),
			wantErr: `spec.minMemory: Invalid value: "17592186044417": ` + tooLarge},
		{name: "huge exponent", q: parsed("1E1111011110"),
			wantErr: `spec.minMemory: Invalid value: "100e1111011108": ` + tooLarge},
		{name: "huge exponent, lower case", q: parsed("9e999999999"),
			wantErr: `spec.minMemory: Invalid value: "9e999999999": ` + tooLarge},
		{name: "negative", q: parsed("-1"),
			wantErr: `spec.minMemory: Invalid value: "-1": must not be negative`},
		{name: "negative with a huge exponent", q: parsed("-1E1111011110"),
			wantErr: `spec.minMemory: Invalid value: "-100e1111011108": must not be negative`},
		{name: "thirty digits", q: parsed("123456789012345678901234567890"),
			wantErr: `spec.minMemory: Invalid value: "123456789012345678901234567890": ` + tooLarge},
		{name: "capped by the parser", q: parsed("9Ei"),
			wantErr: `spec.minMemory: Invalid value: "9223372036854775807": ` + tooLarge},
		{name: "largest scale", q: *resource.NewScaledQuantity(1, math.MaxInt32),
			wantErr: `spec.minMemory: Invalid value: "10e2147483646": ` + tooLarge},
		{name: "smallest scale", q: *resource.NewScaledQuantity(7, -math.MaxInt32), want: 1},
		{name: "decimal with a huge negative scale", q: *resource.NewDecimalQuantity(*inf.NewDec(5, -1_000_000_000), resource.DecimalSI),
			wantErr: `spec.minMemory: Invalid value: "50e999999999": ` + tooLarge},
		{name: "decimal with a huge positive scale", q: *resource.NewDecimalQuantity(*inf.NewDec(5, 1_000_000_000), resource.DecimalSI), want: 1},
		{name: "decimal of many digits that is one", q: *resource.NewDecimalQuantity(*inf.NewDecBig(pow10(400), 400), resource.DecimalSI), want: 1},
		{name: "decimal of many digits just above one", q: *resource.NewDecimalQuantity(*inf.NewDecBig(new(big.Int).Add(pow10(400), big.NewInt(1)), 400), resource.DecimalSI), want: 2},
		{name: "another bound", q: parsed("2Ti"), bound: 1 << 40,
			wantErr: `spec.minMemory: Invalid value: "2Ti": must be at most 1Ti`},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			bound := tc.bound
			if bound == 0 {
				bound = v1alpha1.MaxDeviceMemory
			}
			before := tc.q.DeepCopy()
			var (
				got  int64
				gerr *field.Error
			)
			finish(t, func() { got, gerr = v1alpha1.BoundedValue(field.NewPath("spec", "minMemory"), tc.q, bound) })
			gotErr := ""
			if gerr != nil {
				gotErr = gerr.Error()
			}
			if diff := cmp.Diff(tc.wantErr, gotErr); diff != "" {
				t.Errorf("error (-want +got):\n%s", diff)
			}
			if diff := cmp.Diff(tc.want, got); diff != "" {
				t.Errorf("value (-want +got):\n%s", diff)
			}
			// The caller's quantity is left as it was (it may be shared
			// with an informer's cache).
			if tc.q.Format != before.Format || tc.q.String() != before.String() {
				t.Errorf("quantity changed from %s to %s", before.String(), tc.q.String())
			}
		})
	}
}

// TestQuantityPattern checks what the CRD pattern lets in: everything Prism
// writes and people write, nothing that makes ParseQuantity or Cmp slow.
func TestQuantityPattern(t *testing.T) {
	re := regexp.MustCompile(v1alpha1.QuantityPattern)
	for s, want := range map[string]bool{
		"40Gi": true, "20G": true, "1500m": true, "0.5": true, ".5": true, "+1": true, "-1": true,
		"9223372036854775807": true, "4Ei": true, "1e18": true, "1E-9": true, "12n": true, "1E": true,
		"1E1111011110": false, "E1111011110": false, "9e999999999": false, "1e-999999999": false,
		"1e100": false, "1e2.5": false, "123456789012345678901234567890123": false, "": false, "Gi": false,
	} {
		if got := re.MatchString(s); got != want {
			t.Errorf("QuantityPattern matches %q: %v, want %v", s, got, want)
		}
	}
	// The extremes of what Prism writes into a status.
	for _, q := range []*resource.Quantity{
		resource.NewQuantity(math.MaxInt64, resource.DecimalSI),
		resource.NewQuantity(1<<62, resource.BinarySI),
		resource.NewMilliQuantity(math.MaxInt64, resource.DecimalSI),
		resource.NewMilliQuantity(1, resource.DecimalSI),
	} {
		if !re.MatchString(q.String()) {
			t.Errorf("QuantityPattern does not match %q", q.String())
		}
	}
}

// FuzzBoundedValue checks BoundedValue against exact rational arithmetic
// on quantities of any scale, and on any string the CRD pattern admits.
func FuzzBoundedValue(f *testing.F) {
	f.Add("E1111011110", int64(0), int32(1111011110), int64(v1alpha1.MaxDeviceMemory), false)
	f.Add("1E1111011110", int64(1), int32(1111011110), int64(v1alpha1.MaxDeviceMemory), true)
	f.Add("17592186044416001m", int64(17592186044416001), int32(-3), int64(v1alpha1.MaxDeviceMemory), false)
	f.Add("-5Gi", int64(-5), int32(-2147483647), int64(1), true)
	f.Add("1.5Gi", int64(15), int32(8), int64(1<<40), false)
	re := regexp.MustCompile(v1alpha1.QuantityPattern)
	path := field.NewPath("q")
	f.Fuzz(func(t *testing.T, s string, value int64, scale int32, bound int64, dec bool) {
		bound &= math.MaxInt64             // bounds are never negative
		scale = max(scale, -math.MaxInt32) // -scale must fit an inf.Scale
		q := resource.NewScaledQuantity(value, resource.Scale(scale))
		if dec {
			q = resource.NewDecimalQuantity(*inf.NewDec(value, inf.Scale(-int64(scale))), resource.DecimalSI)
		}
		checkAgainstOracle(t, path, *q, bound, new(big.Rat).SetFrac(big.NewInt(value), big.NewInt(1)), int64(scale))
		if !re.MatchString(s) {
			return
		}
		p, err := resource.ParseQuantity(s)
		if err != nil {
			t.Fatalf("%q matches QuantityPattern but does not parse: %v", s, err)
		}
		c := p // AsDec converts in place
		d := c.AsDec()
		checkAgainstOracle(t, path, p, bound, new(big.Rat).SetInt(d.UnscaledBig()), -int64(d.Scale()))
	})
}

// checkAgainstOracle compares BoundedValue(q) with the exact ceiling of
// mantissa × 10^exp, an integer times a power of ten. Exponents beyond
// ±200 are decided by their sign alone, which is exact for mantissas below
// 10^200 and bounds below 10^200; both hold for every caller here.
func checkAgainstOracle(t *testing.T, path *field.Path, q resource.Quantity, bound int64, mantissa *big.Rat, exp int64) {
	t.Helper()
	var want *big.Int // nil: out of range
	switch sign := mantissa.Sign(); {
	case sign == 0:
		want = big.NewInt(0)
	case sign < 0:
	case exp > 200:
	case exp < -200:
		want = big.NewInt(1)
	default:
		r := new(big.Rat).Set(mantissa)
		p := new(big.Rat).SetInt(new(big.Int).Exp(big.NewInt(10), big.NewInt(max(exp, -exp)), nil))
		if exp >= 0 {
			r.Mul(r, p)
		} else {
			r.Quo(r, p)
		}
		want = new(big.Int).Quo(r.Num(), r.Denom())
		if !r.IsInt() {
			want.Add(want, big.NewInt(1))
		}
	}
	if want != nil && want.Cmp(big.NewInt(bound)) > 0 {
		want = nil
	}
	var (
		got int64
		err *field.Error
	)
	finish(t, func() { got, err = v1alpha1.BoundedValue(path, q, bound) })
	switch {
	case want == nil && err == nil:
		t.Fatalf("BoundedValue(%s × 10^%d, bound %d) = %d, want an error", mantissa.RatString(), exp, bound, got)
	case want != nil && err != nil:
		t.Fatalf("BoundedValue(%s × 10^%d, bound %d): %v, want %s", mantissa.RatString(), exp, bound, err, want)
	case want != nil && want.Int64() != got:
		t.Fatalf("BoundedValue(%s × 10^%d, bound %d) = %d, want %s", mantissa.RatString(), exp, bound, got, want)
	case err != nil && err.Field != path.String():
		t.Fatalf("error %v does not name %s", err, path)
	}
}
