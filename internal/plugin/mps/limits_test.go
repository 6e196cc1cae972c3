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

package mps

import "testing"

// TestParseBytes: a pinned memory limit as the control client may print
// it, in NVIDIA's forms.
func TestParseBytes(t *testing.T) {
	for _, tc := range []struct {
		in      string
		want    float64
		wantErr bool
	}{
		{in: "8192M", want: 8 << 30},
		{in: "8G", want: 8 << 30},
		{in: "8GB", want: 8 << 30},
		{in: " 1024m\n", want: 1 << 30},
		{in: "2.5G", want: 2.5 * (1 << 30)},
		{in: "4096", want: 4096},
		{in: "", wantErr: true},
		{in: "M", wantErr: true},
		{in: "8X", wantErr: true},
		{in: "G8", wantErr: true},
	} {
		got, err := parseBytes(tc.in)
		if (err != nil) != tc.wantErr || (err == nil && got != tc.want) {
			t.Errorf("parseBytes(%q) = %v, %v; want %v, error %v", tc.in, got, err, tc.want, tc.wantErr)
		}
	}
}
