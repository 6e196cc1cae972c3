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

package webhook

import (
	"strings"
	"testing"

	"k8s.io/apimachinery/pkg/api/resource"
)

func TestCostlyQuantity(t *testing.T) {
	digits := func(n int) string { return strings.Repeat("7", n) }
	for _, tc := range []struct {
		value string
		want  bool
	}{
		// What Kubernetes writes, at the ends of what a Quantity holds.
		{"1", false},
		{"40Gi", false},
		{"8Ei", false},
		{"1n", false},
		{"9223372036854775807", false},
		{"1e18", false},
		{"100e-3", false},
		{" 2.5 ", false},
		{"-1e-9", false},
		{"1e64", false},
		{"1e-064", false},
		{"1e-0000000000000064", false}, // leading zeros cost nothing
		{digits(maxQuantityDigits), false},
		{digits(maxQuantityDigits) + "Mi", false},

		// Costly exponents and mantissas, in every form ParseQuantity takes.
		{"1e-99999999", true},
		{"1E-99999999", true},
		{"1e99999999", true},
		{"+1e+65", true},
		{"1e-65", true},
		{"\u00a01e-99999999\u00a0", true}, // TrimSpace takes Unicode space
		{"." + digits(maxQuantityDigits) + "1", true},
		{digits(maxQuantityDigits + 1), true},
		{digits(maxQuantityDigits+1) + "Ki", true},
		{digits(1 << 20), true},

		// Not quantities: ParseQuantity refuses them before any arithmetic.
		{"", false},
		{"e-99999999", false},
		{"1e-99999999x", false},
		{"1.2.3e-99999999", false},
		{"1e-9.5", false},
		{digits(maxQuantityDigits+1) + "x", false},
		{digits(maxQuantityDigits+1) + "Kib", false},
		{`\u0031e-99999999`, false}, // the raw JSON value is what Quantity parses
		{"profile-1e-99999999", false},
	} {
		name := tc.value
		if len(name) > 40 {
			name = name[:40] + "..."
		}
		if got := costlyQuantity([]byte(tc.value)); got != tc.want {
			t.Errorf("costlyQuantity(%q) = %v, want %v", name, got, tc.want)
		}
		// A value that is not costly parses (or fails) at once; one that
		// is costly must really be a quantity, or refusing it refuses
		// what costs nothing.
		if tc.want {
			if _, err := resource.ParseQuantity(strings.TrimSpace(strings.ReplaceAll(tc.value, "99999999", "99"))); err != nil {
				t.Errorf("%q: a value refused as costly must be a quantity, but ParseQuantity says %v", name, err)
			}
		}
	}
}

func TestCheckQuantities(t *testing.T) {
	for _, tc := range []struct {
		name, doc string
		wantErr   string
	}{
		{
			name: "an ordinary claim",
			doc:  `{"metadata":{"name":"c","annotations":{"prism.dev/profile":"train"}},"spec":{"devices":{"requests":[{"name":"gpu","exactly":{"deviceClassName":"gpu.prism.dev","capacity":{"requests":{"memory":"40Gi","compute":"25"}}}}]}}}`,
		},
		{
			name:    "a capacity request as a string",
			doc:     `{"spec":{"devices":{"requests":[{"name":"gpu","exactly":{"capacity":{"requests":{"memory":"1e-99999999"}}}}]}}}`,
			wantErr: `the value at byte 91 ("1e-99999999") is a quantity beyond what Prism parses: more than 128 digits or a decimal exponent beyond ±64`,
		},
		{
			name:    "a capacity request as a bare number",
			doc:     `{"requests":{"memory":1e-99999999}}`,
			wantErr: `the value at byte 22 ("1e-99999999") is a quantity beyond what Prism parses`,
		},
		{
			name:    "a negative number",
			doc:     `[-1e-99999999]`,
			wantErr: `the value at byte 1 ("-1e-99999999")`,
		},
		{
			name:    "after escaped quotes",
			doc:     `{"a":"x\"y\\","b":"1e-99999999"}`,
			wantErr: `the value at byte 19 ("1e-99999999")`,
		},
		{
			name: "inside a string after an escaped quote",
			doc:  `{"a":"\"1e-99999999"}`,
		},
		{
			name: "a key is a string like any other, but these are not quantities",
			doc:  `{"1e-3":{"x":[1,2.5,-3e2,true,null]}}`,
		},
		{
			name:    "a long value is shown cut",
			doc:     `{"a":"` + strings.Repeat("1", 200) + `"}`,
			wantErr: `the value at byte 6 ("11111111111111111111111111111111"..., 200 bytes)`,
		},
		{name: "empty", doc: ``},
	} {
		t.Run(tc.name, func(t *testing.T) {
			err := checkQuantities([]byte(tc.doc))
			switch {
			case tc.wantErr == "" && err != nil:
				t.Fatalf("unexpected error: %v", err)
			case tc.wantErr != "" && (err == nil || !strings.Contains(err.Error(), tc.wantErr)):
				t.Fatalf("error %v, want one containing %q", err, tc.wantErr)
			}
		})
	}
}

// The scan allocates nothing, whatever the document: its cost is one read.
func TestCheckQuantitiesAllocatesNothing(t *testing.T) {
	doc := []byte(`{"metadata":{"annotations":{"a":"` + strings.Repeat(`x\"`, 1000) + `"}},"spec":{"v":[` + strings.Repeat(`"40Gi",1.5e3,`, 1000) + `"Ki"]}}`)
	if allocs := testing.AllocsPerRun(10, func() {
		if err := checkQuantities(doc); err != nil {
			t.Fatal(err)
		}
	}); allocs != 0 {
		t.Errorf("checkQuantities allocated %.0f times per run, want 0", allocs)
	}
}

func FuzzCheckQuantities(f *testing.F) {
	for _, seed := range []string{`{"a":"1e-99999999"}`, `[1e-99999999]`, `{"a":"x\"","b":"1"}`, `"\\"`, `"`} {
		f.Add([]byte(seed))
	}
	f.Fuzz(func(t *testing.T, doc []byte) {
		// Any input, valid JSON or not, is scanned without reading past
		// its end; a panic fails the fuzz.
		_ = checkQuantities(doc)
	})
}
