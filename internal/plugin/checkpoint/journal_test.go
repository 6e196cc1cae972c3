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
	"bytes"
	"errors"
	"fmt"
	"os"
	"reflect"
	"testing"

	"k8s.io/klog/v2/ktesting"

	"github.com/prismgpu/prism/internal/atomicfile/atomicfiletest"
)

type op struct {
	put    []Claim
	delete []string
	sync   bool
}

func (o op) run(t *testing.T, s *Store) error {
	t.Helper()
	_, ctx := ktesting.NewTestContext(t)
	if o.put != nil {
		return s.PutClaims(ctx, o.sync, o.put...)
	}
	return s.DeleteClaims(ctx, o.sync, o.delete...)
}

func completed(uid string) Claim { return sampleClaim(uid, PrepareCompleted) }
func started(uid string) Claim   { return sampleClaim(uid, PrepareStarted) }

func TestJournalReplaysEveryChange(t *testing.T) {
	tests := []struct {
		name string
		ops  []op
	}{
		{"prepare and unprepare", []op{
			{put: []Claim{started("a")}},
			{put: []Claim{completed("a")}, sync: true},
			{delete: []string{"a"}, sync: true},
		}},
		{"several claims in one change", []op{
			{put: []Claim{started("a"), started("b"), started("c")}},
			{put: []Claim{completed("a"), completed("b"), completed("c")}, sync: true},
			{delete: []string{"b", "c"}, sync: true},
		}},
		{"deleting an unknown claim", []op{
			{put: []Claim{completed("a")}, sync: true},
			{delete: []string{"zz"}, sync: true},
		}},
		{"unsynced changes between synced ones", []op{
			{put: []Claim{started("a")}},
			{put: []Claim{started("b")}},
			{put: []Claim{completed("b")}, sync: true},
			{delete: []string{"a"}},
		}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			e := newEnv(t)
			s, _ := e.open(t)
			for i, o := range tc.ops {
				if err := o.run(t, s); err != nil {
					t.Fatalf("change %d: %v", i, err)
				}
				reopened, rec := e.open(t)
				if rec.Corruption != nil {
					t.Fatalf("after change %d: %v", i, rec.Corruption)
				}
				if got, want := reopened.List(), s.List(); !reflect.DeepEqual(got, want) {
					t.Errorf("after change %d the file holds\n%+v\nmemory holds\n%+v", i, got, want)
				}
			}
		})
	}
}

// After the first change the file is appended to, not replaced, until the
// journal outgrows the snapshot.
func TestJournalAppendsThenCompacts(t *testing.T) {
	e := newEnv(t)
	s, _ := e.open(t)
	_, ctx := ktesting.NewTestContext(t)
	if err := s.PutClaims(ctx, true, completed("base")); err != nil {
		t.Fatal(err)
	}
	first, err := os.Stat(e.path())
	if err != nil {
		t.Fatal(err)
	}
	rewrites := 0
	prev := first
	for i := range 2000 {
		uid := fmt.Sprintf("c%d", i)
		if err := s.PutClaims(ctx, true, completed(uid)); err != nil {
			t.Fatal(err)
		}
		if err := s.DeleteClaims(ctx, true, uid); err != nil {
			t.Fatal(err)
		}
		now, err := os.Stat(e.path())
		if err != nil {
			t.Fatal(err)
		}
		if !os.SameFile(prev, now) {
			rewrites++
		}
		prev = now
		if now.Size() > 2*compactFloor {
			t.Fatalf("file grew to %d bytes without being rewritten", now.Size())
		}
	}
	if rewrites == 0 || rewrites > 100 {
		t.Errorf("%d rewrites in 4000 changes: want a few, when the journal outgrew %d bytes", rewrites, compactFloor)
	}
	reopened, rec := e.open(t)
	if rec.Corruption != nil {
		t.Fatal(rec.Corruption)
	}
	if got := reopened.List(); len(got) != 1 || got[0].UID != "base" {
		t.Errorf("after the churn the file holds %+v", got)
	}
}

func TestDamagedJournalIsMovedAside(t *testing.T) {
	build := func(t *testing.T) []byte {
		e := newEnv(t)
		s, _ := e.open(t)
		for _, o := range []op{{put: []Claim{started("a")}}, {put: []Claim{completed("a")}, sync: true}, {put: []Claim{completed("b")}, sync: true}} {
			if err := o.run(t, s); err != nil {
				t.Fatal(err)
			}
		}
		raw, err := os.ReadFile(e.path())
		if err != nil {
			t.Fatal(err)
		}
		return raw
	}
	lines := func(raw []byte) [][]byte { return bytes.SplitAfter(bytes.TrimSuffix(raw, []byte("\n")), []byte("\n")) }
	tests := []struct {
		name   string
		damage func([]byte) []byte
		want   CorruptionReason
	}{
		{"entry edited", func(raw []byte) []byte {
			return bytes.Replace(raw, []byte(`"state":"PrepareCompleted"`), []byte(`"state":"PrepareStarted"`), 1)
		}, ReasonChecksumMismatch},
		{"middle entry cut short", func(raw []byte) []byte {
			l := lines(raw)
			return bytes.Join([][]byte{l[0], l[1][:len(l[1])-40], []byte("\n"), l[2]}, nil)
		}, ReasonMalformed},
		{"entry lost", func(raw []byte) []byte {
			l := lines(raw)
			return bytes.Join([][]byte{l[0], l[2]}, nil)
		}, ReasonInvalidData},
		{"entry repeated", func(raw []byte) []byte {
			l := lines(raw)
			return bytes.Join([][]byte{l[0], l[1], l[1], l[2]}, nil)
		}, ReasonInvalidData},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			raw := build(t)
			if n := len(lines(raw)); n != 3 {
				t.Fatalf("want a snapshot and two appended entries, file has %d lines:\n%s", n, raw)
			}
			e := newEnv(t)
			e.install(t, tc.damage(raw))
			s, rec := e.open(t)
			if rec.Corruption == nil || rec.Corruption.Reason != tc.want {
				t.Fatalf("Recovered = %+v, want corruption %s", rec, tc.want)
			}
			if got := s.List(); len(got) != 0 {
				t.Errorf("store should start empty, has %+v", got)
			}
		})
	}
}

// A power loss during an append can leave the last entry cut short. Its
// fsync never returned, so the change was never acknowledged: the entry is
// dropped, everything before it is kept, and the file is rewritten so that
// the next append does not follow the torn bytes.
func TestTornLastEntryIsDropped(t *testing.T) {
	tests := []struct {
		name   string
		damage func(last []byte) []byte
	}{
		{"cut short", func(last []byte) []byte { return last[:len(last)-40] }},
		{"only its first byte written", func(last []byte) []byte { return last[:1] }},
		{"zero-filled", func(last []byte) []byte { return make([]byte, len(last)) }},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			e := newEnv(t)
			s, _ := e.open(t)
			for _, o := range []op{{put: []Claim{completed("a")}, sync: true}, {put: []Claim{completed("b")}, sync: true}} {
				if err := o.run(t, s); err != nil {
					t.Fatal(err)
				}
			}
			s.Close()
			raw, err := os.ReadFile(e.path())
			if err != nil {
				t.Fatal(err)
			}
			cut := bytes.LastIndexByte(raw[:len(raw)-1], '\n') + 1
			damaged := append(append([]byte(nil), raw[:cut]...), tc.damage(raw[cut:])...)
			e.install(t, damaged)

			s, rec := e.open(t)
			if rec.Corruption != nil {
				t.Fatalf("a torn last entry is not corruption: %v", rec.Corruption)
			}
			if rec.TornEntryBytes != len(damaged)-cut {
				t.Errorf("TornEntryBytes = %d, want %d", rec.TornEntryBytes, len(damaged)-cut)
			}
			if _, ok := s.Get("a"); !ok {
				t.Error("claim a, acknowledged before the torn entry, was lost")
			}
			if _, ok := s.Get("b"); ok {
				t.Error("claim b, whose entry was torn, was loaded")
			}
			if err := (op{put: []Claim{completed("c")}, sync: true}).run(t, s); err != nil {
				t.Fatal(err)
			}
			s.Close()
			s, rec = e.open(t)
			if rec.Corruption != nil || rec.TornEntryBytes != 0 {
				t.Fatalf("after the repair and one more change, Recovered = %+v", rec)
			}
			for _, uid := range []string{"a", "c"} {
				if _, ok := s.Get(uid); !ok {
					t.Errorf("claim %s lost after the repair", uid)
				}
			}
		})
	}
}

// A failed append leaves memory as it was, and the next change rewrites the
// file whole, so that the part of the failed entry that reached the file is
// gone.
func TestFailedAppendIsRepairedByARewrite(t *testing.T) {
	for _, failAt := range []string{"write", "sync"} {
		t.Run(failAt, func(t *testing.T) {
			e := newEnv(t)
			ffs := &faultyFS{}
			e.fs = ffs
			s, _ := e.open(t)
			_, ctx := ktesting.NewTestContext(t)
			if err := s.PutClaims(ctx, true, started("a")); err != nil {
				t.Fatal(err)
			}
			ffs.FailAt(failAt)
			if err := s.PutClaims(ctx, true, completed("a")); !errors.Is(err, atomicfiletest.ErrInjected) {
				t.Fatalf("PutClaims = %v, want the injected failure", err)
			}
			if got := s.List(); !reflect.DeepEqual(got, []Claim{started("a")}) {
				t.Errorf("memory changed by a failed append: %+v", got)
			}
			ffs.FailAt("")
			before, _ := os.Stat(e.path())
			if err := s.PutClaims(ctx, true, completed("b")); err != nil {
				t.Fatal(err)
			}
			if after, _ := os.Stat(e.path()); os.SameFile(before, after) {
				t.Error("the change after a failed append was appended to the damaged file")
			}
			reopened, rec := e.open(t)
			if rec.Corruption != nil {
				t.Fatal(rec.Corruption)
			}
			if got := reopened.List(); !reflect.DeepEqual(got, []Claim{started("a"), completed("b")}) {
				t.Errorf("file after the repair holds %+v", got)
			}
		})
	}
}
