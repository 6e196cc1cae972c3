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

package main

import (
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
)

func writeRecords(t *testing.T, files map[string]string) string {
	t.Helper()
	dir := t.TempDir()
	for name, text := range files {
		if err := os.WriteFile(filepath.Join(dir, name), []byte(text), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	return dir
}

const aloneRecords = `{"mode":"timesliced","jobs":[{"job":"fmaloop","per_second":1000,"bytes_per_launch":2,"flops_per_launch":8}]}
{"mode":"timesliced","jobs":[{"job":"copy","per_second":10,"bytes_per_launch":4,"flops_per_launch":0}]}
`

// Under a thread limit fmaloop's launches carry half the work: its speed
// is its work per second over its work alone, not its launches.
func TestPairSpeedsAreWorkRates(t *testing.T) {
	dir := writeRecords(t, map[string]string{
		"timesliced.jsonl": aloneRecords,
		"limited.jsonl": `{"mode":"limited","activeThreadPercentage":50,"jobs":[` +
			`{"job":"fmaloop","per_second":500,"bytes_per_launch":1,"flops_per_launch":4},` +
			`{"job":"copy","per_second":5,"bytes_per_launch":4,"flops_per_launch":0}]}` + "\n",
	})
	jobs, pairs, err := gpuCheckRows(gpuCheckRecords{dir, "g", []gpuCheckMode{timeSliced, daemonPerShare}, false})
	if err != nil {
		t.Fatal(err)
	}
	wantJobs := []string{"fmaloop,g,1000,,,,", "copy,g,10,,,,", "fmaloop,g-mps-shares,1000,,,,", "copy,g-mps-shares,10,,,,"}
	if !slices.Equal(jobs, wantJobs) {
		t.Errorf("jobs = %q, want %q", jobs, wantJobs)
	}
	if want := []string{"fmaloop,copy,g-mps-shares,0.2500,0.5000"}; !slices.Equal(pairs, want) {
		t.Errorf("pairs = %q, want %q", pairs, want)
	}
}

func TestBytesAndFlopsMustScaleAlike(t *testing.T) {
	dir := writeRecords(t, map[string]string{
		"timesliced.jsonl": aloneRecords + `{"mode":"timesliced","jobs":[` +
			`{"job":"fmaloop","per_second":500,"bytes_per_launch":1,"flops_per_launch":8},` +
			`{"job":"copy","per_second":5,"bytes_per_launch":4,"flops_per_launch":0}]}` + "\n",
	})
	_, _, err := gpuCheckRows(gpuCheckRecords{dir, "g", []gpuCheckMode{timeSliced}, false})
	if want := "fmaloop's launches moved 0.5 of the bytes of its launches alone but did 1 of the flops"; err == nil || !strings.Contains(err.Error(), want) {
		t.Errorf("err = %v, want one saying %q", err, want)
	}
}
