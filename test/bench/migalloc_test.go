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

package bench

import (
	"fmt"
	"testing"

	"github.com/google/go-cmp/cmp"
)

// TestMIGAllocCases: every case of the mig-alloc phase allocates what a
// scheduler would give it, so that the phase times allocations that
// succeed where they should: a whole GPU never goes to a partition, the
// light job's ladder gets the 1g.20gb the rewrite sized, and on the busy
// node every claim skips the GPUs that are cut. Each variant of the MIG
// node allocates the same devices as the node as published, so that its
// rows time the same work.
func TestMIGAllocCases(t *testing.T) {
	cases, err := migAllocCases(t.Context(), 8)
	if err != nil {
		t.Fatal(err)
	}
	want := map[string]string{
		"idle: plain claim, plain node":        "gpu → gpu-0",
		"idle: plain claim, MIG node":          "gpu → gpu-0",
		"idle: 1g.10gb partition, MIG node":    "gpu → gpu-0-mig-1g10gb-0",
		"idle: light job's ladder, MIG node":   "gpu/mig-1g20gb → gpu-0-mig-1g20gb-0",
		"idle: light job's ladder, plain node": "gpu/fits → gpu-0",
		"busy: plain claim, MIG node":          "gpu → gpu-4",
		"busy: 1g.10gb partition, MIG node":    "gpu → gpu-4-mig-1g10gb-0",
		"busy: light job's ladder, MIG node":   "gpu/mig-1g20gb → gpu-4-mig-1g20gb-0",
	}
	for _, v := range migVariants {
		for _, state := range []string{migAllocIdle, migAllocBusy} {
			for _, claim := range []string{"plain claim", "light job's ladder"} {
				want[fmt.Sprintf("%s: %s, MIG node: %s", state, claim, v.name)] = want[state+": "+claim+", MIG node"]
			}
		}
	}
	got := map[string]string{}
	for _, c := range cases {
		_, allocated, err := c.allocate(t.Context())
		if err != nil {
			t.Errorf("%s: %s: %v", c.state, c.name, err)
		}
		got[c.state+": "+c.name] = allocated
	}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("allocated (-want +got):\n%s", diff)
	}
}

// TestMIGAllocatorRows: one round gives a row per case but the reference,
// each against the plain claim on the plain node, in the cases the summary
// picks its headlines from.
func TestMIGAllocatorRows(t *testing.T) {
	rows, err := MIGAllocator(t.Context(), MIGAllocOptions{Rounds: 1})
	if err != nil {
		t.Fatal(err)
	}
	type shape struct{ Case, AName, BName string }
	idle, busy := migAllocCaseName(8, migAllocIdle), migAllocCaseName(8, migAllocBusy)
	want := []shape{
		{idle, migAllocReference, "plain claim, MIG node"},
		{idle, migAllocReference, "1g.10gb partition, MIG node"},
		{idle, migAllocReference, "light job's ladder, MIG node"},
		{idle, migAllocReference, "light job's ladder, plain node"},
		{busy, migAllocReference, "plain claim, MIG node"},
		{busy, migAllocReference, "1g.10gb partition, MIG node"},
		{busy, migAllocReference, "light job's ladder, MIG node"},
	}
	for _, v := range migVariants {
		for _, c := range []struct{ cse, claim string }{{idle, "plain claim"}, {idle, "light job's ladder"}, {busy, "plain claim"}, {busy, "light job's ladder"}} {
			want = append(want, shape{c.cse, migAllocReference, fmt.Sprintf("%s, MIG node: %s", c.claim, v.name)})
		}
	}
	var got []shape
	for _, r := range rows {
		got = append(got, shape{r.Case, r.AName, r.BName})
		if r.A <= 0 || r.B <= 0 {
			t.Errorf("%s, %s: %v µs against %v µs, want both timed", r.Case, r.BName, r.B, r.A)
		}
	}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("rows (-want +got):\n%s", diff)
	}
}
