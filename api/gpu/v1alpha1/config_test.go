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

package v1alpha1

import (
	"encoding/json"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"
)

var typeMeta = metav1.TypeMeta{APIVersion: "gpu.prism.dev/v1alpha1", Kind: "GpuConfig"}

func readFixture(t testing.TB, name string) []byte {
	t.Helper()
	data, err := os.ReadFile(filepath.Join("testdata", name))
	if err != nil {
		t.Fatal(err)
	}
	return data
}

// dump renders a config for failure messages; pointers make %+v useless.
func dump(c *GpuConfig) string {
	data, err := json.Marshal(c)
	if err != nil {
		return err.Error()
	}
	return string(data)
}

func TestDecodeValid(t *testing.T) {
	exclusive := &GpuSharing{Strategy: ExclusiveSharing}
	tests := []struct {
		fixture string
		want    *GpuConfig
	}{
		{
			fixture: "minimal.json",
			want:    &GpuConfig{TypeMeta: typeMeta, Sharing: exclusive},
		},
		{
			fixture: "timeslicing.json",
			want: &GpuConfig{TypeMeta: typeMeta, Sharing: &GpuSharing{
				Strategy: TimeSlicingSharing, TimeSlicing: &TimeSlicingConfig{Interval: LongTimeSlice},
			}},
		},
		{
			fixture: "timeslicing-defaulted.json",
			want: &GpuConfig{TypeMeta: typeMeta, Sharing: &GpuSharing{
				Strategy: TimeSlicingSharing, TimeSlicing: &TimeSlicingConfig{Interval: DefaultTimeSlice},
			}},
		},
		{
			fixture: "compute-limit.json",
			want:    &GpuConfig{TypeMeta: typeMeta, Sharing: &GpuSharing{Strategy: ExclusiveSharing, ComputeLimitPercent: ptr.To[int32](60)}},
		},
		{
			fixture: "profiling-set.json",
			want: &GpuConfig{TypeMeta: typeMeta, Sharing: exclusive, Profiling: &GpuProfiling{
				Enabled: true, Set: RooflineProfilingSet, LaunchCount: ptr.To[int32](5), KernelFilter: "regex:gemm.+tensorop",
			}},
		},
		{
			fixture: "profiling-metrics.json",
			want: &GpuConfig{TypeMeta: typeMeta, Sharing: exclusive, Profiling: &GpuProfiling{
				Enabled:     true,
				Metrics:     []string{"sm__throughput.avg.pct_of_peak_sustained_elapsed", "dram__bytes.sum"},
				LaunchCount: ptr.To[int32](1),
			}},
		},
		{
			fixture: "profiling-defaulted.json",
			want: &GpuConfig{TypeMeta: typeMeta, Sharing: exclusive, Profiling: &GpuProfiling{
				Enabled: true, Set: BasicProfilingSet, LaunchCount: ptr.To[int32](1),
			}},
		},
	}
	for _, tc := range tests {
		t.Run(tc.fixture, func(t *testing.T) {
			got, err := Decode(readFixture(t, tc.fixture))
			if err != nil {
				t.Fatalf("unexpected error: %v", err)
			}
			if !reflect.DeepEqual(tc.want, got) {
				t.Errorf("decoded config mismatch:\nwant %s\ngot  %s", dump(tc.want), dump(got))
			}
		})
	}
}

func TestDecodeInvalid(t *testing.T) {
	tests := []struct {
		fixture string
		// wantErr are substrings the user-facing message must contain, so
		// that the author can find the offending field.
		wantErr []string
	}{
		{"unknown-field.json", []string{`unknown field "sharing.stratgy"`}},
		{"duplicate-field.json", []string{`duplicate field "sharing.strategy"`}},
		{"wrong-case-field.json", []string{`unknown field "Sharing"`}},
		{"wrong-version.json", []string{`unsupported apiVersion "gpu.prism.dev/v1beta9"`, `"gpu.prism.dev/v1alpha1"`}},
		{"wrong-group.json", []string{`unsupported apiVersion "gpu.example.com/v1alpha1"`}},
		{"wrong-kind.json", []string{`unsupported kind "MigDeviceConfig"`, `"GpuConfig"`}},
		{"missing-type.json", []string{`unsupported apiVersion ""`}},
		{"bad-strategy.json", []string{"sharing.strategy", `"MPS"`, `"TimeSlicing"`}},
		{"bad-interval.json", []string{"sharing.timeSlicing.interval", `"Forever"`}},
		{"timeslicing-with-exclusive.json", []string{"sharing.timeSlicing", "may only be set when strategy is TimeSlicing"}},
		{"compute-limit-above-gpu.json", []string{"sharing.computeLimitPercent", "between 1 and 100"}},
		{"compute-limit-timesliced.json", []string{"sharing.computeLimitPercent", "a share cannot take strategy TimeSlicing"}},
		{"set-and-metrics.json", []string{"profiling.metrics", "may not be combined with set"}},
		{"bad-set.json", []string{"profiling.set", `"everything"`}},
		{"bad-metric.json", []string{"profiling.metrics[0]", "lower case letters"}},
		{"duplicate-metric.json", []string{"profiling.metrics[1]", "Duplicate value"}},
		{"launchcount-zero.json", []string{"profiling.launchCount", "between 1 and 1000"}},
		{"launchcount-huge.json", []string{"launchCount"}},
		// GpuConfig holds no resource.Quantity; a number with a huge
		// exponent (issue 31) is only a number that fits no int32.
		{"launchcount-exponent.json", []string{"launchCount"}},
		{"launchcount-string.json", []string{"launchCount"}},
		{"kernelfilter-shell.json", []string{"profiling.kernelFilter", "not starting with '-'"}},
		{"kernelfilter-option.json", []string{"profiling.kernelFilter"}},
		{"kernelfilter-disabled-still-checked.json", []string{"profiling.kernelFilter"}},
		{"not-object.json", []string{"not a JSON object"}},
		{"truncated.json", []string{"not a JSON object"}},
	}
	for _, tc := range tests {
		t.Run(tc.fixture, func(t *testing.T) {
			cfg, err := Decode(readFixture(t, tc.fixture))
			if err == nil {
				t.Fatalf("expected an error, got %+v", cfg)
			}
			for _, want := range tc.wantErr {
				if !strings.Contains(err.Error(), want) {
					t.Errorf("error %q does not contain %q", err, want)
				}
			}
		})
	}
}

func TestDecodeSizeAndEmpty(t *testing.T) {
	padded := func(n int) []byte {
		prefix := `{"apiVersion":"gpu.prism.dev/v1alpha1","kind":"GpuConfig"}`
		return []byte(prefix + strings.Repeat(" ", n-len(prefix)))
	}
	tests := []struct {
		name    string
		raw     []byte
		wantErr string
	}{
		{name: "at limit", raw: padded(MaxParametersSize)},
		{name: "over limit", raw: padded(MaxParametersSize + 1), wantErr: "more than the limit of 10240"},
		{name: "empty", raw: nil, wantErr: "GpuConfig is empty"},
		{name: "whitespace", raw: []byte(" \n\t"), wantErr: "GpuConfig is empty"},
		{name: "null", raw: []byte("null"), wantErr: `unsupported apiVersion ""`},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			_, err := Decode(tc.raw)
			switch {
			case tc.wantErr == "" && err != nil:
				t.Fatalf("unexpected error: %v", err)
			case tc.wantErr != "" && (err == nil || !strings.Contains(err.Error(), tc.wantErr)):
				t.Fatalf("expected error containing %q, got %v", tc.wantErr, err)
			}
		})
	}
}

func TestDefault(t *testing.T) {
	got := Default()
	if err := got.Validate(); err != nil {
		t.Fatalf("default config is invalid: %v", err)
	}
	fromMinimal, err := Decode(readFixture(t, "minimal.json"))
	if err != nil {
		t.Fatal(err)
	}
	if !reflect.DeepEqual(fromMinimal, got) {
		t.Errorf("Default() differs from a decoded minimal config:\ndecoded %s\ndefault %s", dump(fromMinimal), dump(got))
	}
	again := got.DeepCopy()
	again.SetDefaults()
	if !reflect.DeepEqual(got, again) {
		t.Errorf("SetDefaults is not idempotent:\nonce  %s\ntwice %s", dump(got), dump(again))
	}
}

func TestValidateReportsAllErrors(t *testing.T) {
	cfg := &GpuConfig{
		Sharing: &GpuSharing{Strategy: "Bogus"},
		Profiling: &GpuProfiling{
			Enabled:     true,
			Metrics:     make([]string, MaxMetrics+1),
			LaunchCount: ptr.To[int32](MaxLaunchCount + 1),
		},
	}
	err := cfg.Validate()
	if err == nil {
		t.Fatal("expected an error")
	}
	for _, want := range []string{"apiVersion", "kind", "sharing.strategy", "profiling.metrics: Too many", "profiling.launchCount"} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("error %q does not mention %q", err, want)
		}
	}
}

func FuzzDecode(f *testing.F) {
	entries, err := os.ReadDir("testdata")
	if err != nil {
		f.Fatal(err)
	}
	for _, e := range entries {
		f.Add(readFixture(f, e.Name()))
	}
	f.Fuzz(func(t *testing.T, raw []byte) {
		cfg, err := Decode(raw)
		if err != nil {
			if cfg != nil {
				t.Fatalf("Decode returned both a config and an error: %v", err)
			}
			return
		}
		if err := cfg.Validate(); err != nil {
			t.Fatalf("accepted config does not validate: %v\ninput: %q", err, raw)
		}
		encoded, err := json.Marshal(cfg)
		if err != nil {
			t.Fatalf("accepted config cannot be encoded: %v", err)
		}
		again, err := Decode(encoded)
		if err != nil {
			t.Fatalf("re-encoded config is rejected: %v\ninput: %q\nre-encoded: %s", err, raw, encoded)
		}
		if !reflect.DeepEqual(cfg, again) {
			t.Fatalf("round trip changed the config:\nfirst  %s\nsecond %s", dump(cfg), dump(again))
		}
	})
}
