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

package checkpoint

import (
	"context"
	"fmt"
	"os"
	"testing"
)

// BenchmarkUpdate measures one fsynced state change of one claim while the
// node holds many prepared claims, the cost a prepare pays once: rewriting
// the whole file (Update) against appending the change (PutClaims), in the
// same run. The tmpfs variant isolates our own overhead from disk latency.
func BenchmarkUpdate(b *testing.B) {
	dirs := map[string]string{"tempdir": b.TempDir()}
	if st, err := os.Stat("/dev/shm"); err == nil && st.IsDir() {
		shm, err := os.MkdirTemp("/dev/shm", "prism-checkpoint-bench-")
		if err != nil {
			b.Fatal(err)
		}
		b.Cleanup(func() { _ = os.RemoveAll(shm) })
		dirs["tmpfs"] = shm
	}
	for _, where := range []string{"tmpfs", "tempdir"} {
		dir, ok := dirs[where]
		if !ok {
			continue
		}
		for _, claims := range []int{1, 32, 256, 1000} {
			for _, how := range []string{"rewrite", "append"} {
				b.Run(fmt.Sprintf("%s/claims=%d/%s", where, claims, how), func(b *testing.B) {
					benchmarkUpdate(b, fmt.Sprintf("%s/%d-%s", dir, claims, how), claims, how == "append")
				})
			}
		}
	}
}

func benchmarkUpdate(b *testing.B, dir string, claims int, appendChange bool) {
	ctx := context.Background()
	s, _, err := Open(ctx, dir, Options{BootIDPath: "/proc/sys/kernel/random/boot_id"})
	if err != nil {
		b.Fatal(err)
	}
	if err := s.Update(ctx, func(d *Data) error {
		for i := range claims {
			c := sampleClaim(fmt.Sprintf("%08d-0000-4000-8000-000000000000", i), PrepareCompleted)
			d.Claims[c.UID] = c
		}
		return nil
	}); err != nil {
		b.Fatal(err)
	}
	uid := fmt.Sprintf("%08d-0000-4000-8000-000000000000", 0)
	states := [2]PrepareState{PrepareStarted, PrepareCompleted}
	b.ReportAllocs()
	i := 0
	for b.Loop() {
		state := states[i%2]
		i++
		if appendChange {
			err = s.PutClaims(ctx, true, sampleClaim(uid, state))
		} else {
			err = s.Update(ctx, func(d *Data) error {
				c := d.Claims[uid]
				c.State = state
				d.Claims[uid] = c
				return nil
			})
		}
		if err != nil {
			b.Fatal(err)
		}
	}
	if st, err := os.Stat(s.path); err == nil {
		b.ReportMetric(float64(st.Size()), "file-bytes")
	}
}
