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
	"errors"
	"strings"
	"testing"
	"unsafe"

	"github.com/google/go-cmp/cmp"

	"github.com/prismgpu/prism/api/prism/v1alpha1"
)

// TestProfileName: only a name the API could hold comes out; an invalid
// value, however large, comes back as an error of a few hundred bytes that
// keeps none of the value's memory.
func TestProfileName(t *testing.T) {
	huge := strings.Repeat("a", 200<<10)
	tests := []struct {
		name        string
		annotations map[string]string
		want        string
		// wantErr is the error's message; "" for none.
		wantErr string
	}{
		{name: "no annotations"},
		{name: "no profile annotation", annotations: map[string]string{"other": "x"}},
		{name: "empty value names none", annotations: map[string]string{v1alpha1.ProfileAnnotation: ""}},
		{name: "name", annotations: map[string]string{v1alpha1.ProfileAnnotation: "train"}, want: "train"},
		{name: "subdomain", annotations: map[string]string{v1alpha1.ProfileAnnotation: "train.v2-large"}, want: "train.v2-large"},
		{name: "longest name", annotations: map[string]string{v1alpha1.ProfileAnnotation: strings.Repeat("a", 253)}, want: strings.Repeat("a", 253)},
		{
			name: "upper case", annotations: map[string]string{v1alpha1.ProfileAnnotation: "Train"},
			wantErr: `prism.dev/profile "Train" is not a WorkloadProfile name: a lowercase RFC 1123 subdomain must consist of`,
		},
		{
			// Profiles live in the claim's namespace; there is no other form.
			name: "namespace and name", annotations: map[string]string{v1alpha1.ProfileAnnotation: "ml/train"},
			wantErr: `prism.dev/profile "ml/train" is not a WorkloadProfile name: a lowercase RFC 1123 subdomain`,
		},
		{
			name: "CEL", annotations: map[string]string{v1alpha1.ProfileAnnotation: `x") || true || ("`},
			wantErr: `prism.dev/profile "x\") || true || (\"" is not a WorkloadProfile name`,
		},
		{
			name: "one byte too long", annotations: map[string]string{v1alpha1.ProfileAnnotation: strings.Repeat("a", 254)},
			wantErr: `prism.dev/profile "` + strings.Repeat("a", 64) + `"... (254 bytes) is not a WorkloadProfile name: must be no more than 253 characters`,
		},
		{
			name: "200 KiB", annotations: map[string]string{v1alpha1.ProfileAnnotation: huge},
			wantErr: `prism.dev/profile "` + strings.Repeat("a", 64) + `"... (204800 bytes) is not a WorkloadProfile name: must be no more than 253 characters`,
		},
		{
			// The cut does not split the three bytes of "€".
			name: "cut at a character", annotations: map[string]string{v1alpha1.ProfileAnnotation: strings.Repeat("a", 63) + "€" + strings.Repeat("a", 300)},
			wantErr: `prism.dev/profile "` + strings.Repeat("a", 63) + `"... (366 bytes) is not a WorkloadProfile name: must be no more than 253 characters`,
		},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			got, err := v1alpha1.ProfileName(tc.annotations)
			if diff := cmp.Diff(tc.want, got); diff != "" {
				t.Errorf("name (-want +got):\n%s", diff)
			}
			if tc.wantErr == "" {
				if err != nil {
					t.Fatalf("unexpected error: %v", err)
				}
				return
			}
			var invalid *v1alpha1.InvalidProfileError
			if !errors.As(err, &invalid) {
				t.Fatalf("error %v, want an *InvalidProfileError", err)
			}
			if msg := err.Error(); !strings.HasPrefix(msg, tc.wantErr) {
				t.Errorf("error\n%s\nwant prefix\n%s", msg, tc.wantErr)
			}
			if n := len(err.Error()); n > 512 {
				t.Errorf("error of %d bytes, want at most 512", n)
			}
			value := tc.annotations[v1alpha1.ProfileAnnotation]
			if invalid.Length != len(value) || len(invalid.Start) > v1alpha1.MaxShownProfileBytes {
				t.Errorf("error keeps %d bytes of a value of %d, says %d: want at most %d and the length", len(invalid.Start), len(value), invalid.Length, v1alpha1.MaxShownProfileBytes)
			}
			// A slice of the value would keep all of it alive.
			if len(invalid.Start) > 0 && unsafe.StringData(invalid.Start) == unsafe.StringData(value) {
				t.Error("the error's quote shares the value's memory")
			}
		})
	}
}
