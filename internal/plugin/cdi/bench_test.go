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

package cdi

import (
	"context"
	"testing"
)

// BenchmarkWriteClaimSpec writes and removes one 1-GPU claim's spec on a
// simulated node, the CDI part of a prepare and an unprepare; the CDI root
// is on the file system of the test's temporary directory.
func BenchmarkWriteClaimSpec(b *testing.B) {
	driverRoot := b.TempDir()
	if err := MakeFakeDriverRoot(driverRoot, []int{0}); err != nil {
		b.Fatal(err)
	}
	w := mustWriter(b, Options{Root: b.TempDir() + "/cdi", Source: NewSimulatedSource(Roots{DriverRoot: driverRoot})})
	ctx := context.Background()
	claim := Claim{UID: uidA, Devices: []Device{gpu("gpu-0", 0)}}
	for b.Loop() {
		if _, err := w.WriteClaimSpec(ctx, claim); err != nil {
			b.Fatal(err)
		}
		if err := w.RemoveClaimSpec(ctx, uidA); err != nil {
			b.Fatal(err)
		}
	}
}
