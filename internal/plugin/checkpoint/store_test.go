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
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"reflect"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"k8s.io/klog/v2/ktesting"
	testingclock "k8s.io/utils/clock/testing"

	gpuv1alpha1 "github.com/prismgpu/prism/api/gpu/v1alpha1"
	"github.com/prismgpu/prism/internal/atomicfile"
	"github.com/prismgpu/prism/internal/atomicfile/atomicfiletest"
	"github.com/prismgpu/prism/internal/goldentest"
)

const (
	bootA = "6f1c2d9e-0a6e-4b8f-9d4c-1b2a3c4d5e6f"
	bootB = "a0b1c2d3-e4f5-4a6b-8c7d-8e9f0a1b2c3d"
)

var fakeNow = time.Date(2026, 3, 4, 5, 6, 7, 8, time.UTC)

// env is one plugin data directory plus the knobs a test turns.
type env struct {
	dir        string
	bootIDPath string
	fs         fileSystem
}

func newEnv(t testing.TB) *env {
	t.Helper()
	e := &env{dir: t.TempDir(), bootIDPath: filepath.Join(t.TempDir(), "boot_id")}
	e.setBootID(t, bootA)
	return e
}

func (e *env) setBootID(t testing.TB, id string) {
	t.Helper()
	if err := os.WriteFile(e.bootIDPath, []byte(id+"\n"), 0o644); err != nil {
		t.Fatal(err)
	}
}

func (e *env) open(t testing.TB) (*Store, Recovered) {
	t.Helper()
	_, ctx := ktesting.NewTestContext(t)
	s, rec, err := Open(ctx, e.dir, Options{
		BootIDPath: e.bootIDPath,
		Clock:      testingclock.NewFakePassiveClock(fakeNow),
		fs:         e.fs,
	})
	if err != nil {
		t.Fatalf("Open: %v", err)
	}
	return s, rec
}

func (e *env) path() string { return filepath.Join(e.dir, DefaultFileName) }

func (e *env) install(t testing.TB, content []byte) {
	t.Helper()
	if err := os.WriteFile(e.path(), content, 0o600); err != nil {
		t.Fatal(err)
	}
}

func sampleClaim(uid string, state PrepareState) Claim {
	return Claim{
		UID:       uid,
		Namespace: "ml",
		Name:      "claim-" + uid,
		State:     state,
		Devices: []Device{{
			Requests:     []string{"gpu"},
			Pool:         "node-a",
			Name:         "gpu-0",
			CDIDeviceIDs: []string{"k8s.gpu.prism.dev/claim=" + uid + "-gpu-0"},
			Sharing:      &Sharing{Strategy: "TimeSlicing", Share: gpuv1alpha1.Share{MemoryBytes: 8 << 30}},
		}},
		CDISpecFile: "k8s.gpu.prism.dev-claim_" + uid + ".json",
		Profiling:   &Profiling{ReportDir: "/var/lib/prism/reports/" + uid},
	}
}

func put(c Claim) func(*Data) error {
	return func(d *Data) error {
		d.Claims[c.UID] = c
		return nil
	}
}

func mustUpdate(t testing.TB, s *Store, fn func(*Data) error) {
	t.Helper()
	_, ctx := ktesting.NewTestContext(t)
	if err := s.Update(ctx, fn); err != nil {
		t.Fatalf("Update: %v", err)
	}
}

func TestRoundTrip(t *testing.T) {
	e := newEnv(t)
	s, rec := e.open(t)
	if !reflect.DeepEqual(rec, Recovered{}) {
		t.Errorf("fresh directory reported recovery: %+v", rec)
	}
	if got := s.List(); len(got) != 0 {
		t.Fatalf("fresh store is not empty: %+v", got)
	}

	// Two-phase: record the intent, then the completion.
	a, b := sampleClaim("uid-a", PrepareStarted), sampleClaim("uid-b", PrepareCompleted)
	mustUpdate(t, s, put(a))
	a.State = PrepareCompleted
	mustUpdate(t, s, put(a))
	mustUpdate(t, s, put(b))

	reopened, rec := e.open(t)
	if !reflect.DeepEqual(rec, Recovered{}) {
		t.Errorf("clean reopen reported recovery: %+v", rec)
	}
	if want, got := []Claim{a, b}, reopened.List(); !reflect.DeepEqual(want, got) {
		t.Errorf("reopened store differs:\nwant %+v\ngot  %+v", want, got)
	}
	if got, ok := reopened.Get("uid-b"); !ok || !reflect.DeepEqual(got, b) {
		t.Errorf("Get(uid-b) = %+v, %v", got, ok)
	}
	if _, ok := reopened.Get("uid-missing"); ok {
		t.Error("Get of an unknown UID succeeded")
	}

	// Unprepare removes the entry.
	mustUpdate(t, reopened, func(d *Data) error { delete(d.Claims, "uid-a"); return nil })
	again, _ := e.open(t)
	if got := again.List(); len(got) != 1 || got[0].UID != "uid-b" {
		t.Errorf("after delete: %+v", got)
	}
}

// TestGoldenFile pins the on-disk format: a change here breaks downgrades
// and needs a new version.
func TestGoldenFile(t *testing.T) {
	e := newEnv(t)
	s, _ := e.open(t)
	mustUpdate(t, s, put(sampleClaim("uid-a", PrepareCompleted)))
	got, err := os.ReadFile(e.path())
	if err != nil {
		t.Fatal(err)
	}
	goldentest.Compare(t, filepath.Join("testdata", "v2.json"), got)
}

// sharedClaims are the claims of testdata/v2-sharing.json: a share that
// MPS enforces, snapshotted, and a time-sliced memory share, appended as a
// change.
func sharedClaims() (snapshotted, appended Claim) {
	mps := Claim{UID: "uid-mps", Namespace: "ml", Name: "claim-uid-mps", State: PrepareCompleted,
		Devices: []Device{{
			Requests: []string{"gpu"}, Pool: "node-a", Name: "gpu-0", CDIDeviceIDs: []string{"k8s.gpu.prism.dev/claim=uid-mps-gpu-0"},
			ShareID: "3f2a", Sharing: &Sharing{Share: gpuv1alpha1.Share{ComputePercent: 45, MemoryBytes: 8 << 30}, MPS: true},
		}},
		CDISpecFile: "k8s.gpu.prism.dev-claim_uid-mps.json"}
	timeSliced := Claim{UID: "uid-ts", Namespace: "ml", Name: "claim-uid-ts", State: PrepareCompleted,
		Devices: []Device{{
			Requests: []string{"gpu"}, Pool: "node-a", Name: "gpu-1", CDIDeviceIDs: []string{"k8s.gpu.prism.dev/claim=uid-ts-gpu-1"},
			Sharing: &Sharing{Strategy: "TimeSlicing", TimeSlice: "Long", Share: gpuv1alpha1.Share{MemoryBytes: 20 << 30}},
		}},
		CDISpecFile: "k8s.gpu.prism.dev-claim_uid-ts.json"}
	return mps, timeSliced
}

// TestShareOfAnEarlierRelease: testdata/v2-sharing.json was written by the
// release before a device's share became a gpuv1alpha1.Share, with every
// field of its sharing set. Its shares load into the share type, and the
// same claims are written byte for byte as that release wrote them, so that
// either release reads the other's file during a rolling update or after a
// rollback. Unlike v2.json, this file is never rewritten.
func TestShareOfAnEarlierRelease(t *testing.T) {
	earlier, err := os.ReadFile(filepath.Join("testdata", "v2-sharing.json"))
	if err != nil {
		t.Fatal(err)
	}
	snapshotted, appended := sharedClaims()

	e := newEnv(t)
	e.install(t, earlier)
	s, rec := e.open(t)
	if rec.Corruption != nil {
		t.Fatalf("the earlier release's file was moved aside: %v", rec.Corruption)
	}
	if diff := cmp.Diff([]Claim{snapshotted, appended}, s.List()); diff != "" {
		t.Errorf("claims loaded (-want +got):\n%s", diff)
	}

	e = newEnv(t)
	s, _ = e.open(t)
	mustUpdate(t, s, put(snapshotted))
	_, ctx := ktesting.NewTestContext(t)
	if err := s.PutClaims(ctx, true, appended); err != nil {
		t.Fatal(err)
	}
	now, err := os.ReadFile(e.path())
	if err != nil {
		t.Fatal(err)
	}
	if diff := cmp.Diff(string(earlier), string(now)); diff != "" {
		t.Errorf("file written (-earlier release +now):\n%s", diff)
	}
}

func TestHandEditedWhitespaceIsAccepted(t *testing.T) {
	e := newEnv(t)
	golden, err := os.ReadFile(filepath.Join("testdata", "v2.json"))
	if err != nil {
		t.Fatal(err)
	}
	var indented bytes.Buffer
	if err := json.Indent(&indented, golden, "", "  "); err != nil {
		t.Fatal(err)
	}
	e.install(t, indented.Bytes())
	s, rec := e.open(t)
	if rec.Corruption != nil {
		t.Fatalf("re-indented file was rejected: %v", rec.Corruption)
	}
	if _, ok := s.Get("uid-a"); !ok {
		t.Error("claim from re-indented file missing")
	}
}

func TestUnusableFileIsMovedAside(t *testing.T) {
	golden, err := os.ReadFile(filepath.Join("testdata", "v2.json"))
	if err != nil {
		t.Fatal(err)
	}
	fixture := func(name string) []byte {
		data, err := os.ReadFile(filepath.Join("testdata", name))
		if err != nil {
			t.Fatal(err)
		}
		return data
	}
	invalidData, err := encode(payload{BootID: bootA, Data: Data{Claims: map[string]Claim{
		"uid-a": sampleClaim("uid-other", PrepareCompleted),
	}}})
	if err != nil {
		t.Fatal(err)
	}
	unknownState, err := encode(payload{BootID: bootA, Data: Data{Claims: map[string]Claim{
		"uid-a": sampleClaim("uid-a", "Prepared"),
	}}})
	if err != nil {
		t.Fatal(err)
	}

	tests := []struct {
		name    string
		content []byte
		reason  CorruptionReason
	}{
		{"garbage", fixture("garbage.json"), ReasonMalformed},
		{"empty file", fixture("empty.json"), ReasonMalformed},
		{"truncated", golden[:len(golden)/2], ReasonMalformed},
		{"checksum mismatch", bytes.Replace(golden, []byte(`"namespace":"ml"`), []byte(`"namespace":"mx"`), 1), ReasonChecksumMismatch},
		{"checksum missing", bytes.Replace(golden, []byte(`"checksum":"sha256:`), []byte(`"checksum":"`), 1), ReasonChecksumMismatch},
		{"v1 checksum mismatch", fixture("v1-bad-checksum.json"), ReasonChecksumMismatch},
		{"unknown future version", fixture("v3-future.json"), ReasonUnknownVersion},
		{"no version", fixture("no-version.json"), ReasonUnknownVersion},
		{"claim under wrong key", invalidData, ReasonInvalidData},
		{"unknown state", unknownState, ReasonInvalidData},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			e := newEnv(t)
			e.install(t, tc.content)
			s, rec := e.open(t)

			c := rec.Corruption
			if c == nil {
				t.Fatalf("no corruption reported, recovered %+v, claims %+v", rec, s.List())
			}
			if c.Reason != tc.reason {
				t.Errorf("reason = %s, want %s (%v)", c.Reason, tc.reason, c)
			}
			wantMoved := e.path() + ".corrupt-20260304T050607.000000008Z"
			if c.MovedTo != wantMoved || c.Path != e.path() {
				t.Errorf("moved %s to %s, want %s to %s", c.Path, c.MovedTo, e.path(), wantMoved)
			}
			var asErr *CorruptionError
			if err := error(c); !errors.As(err, &asErr) || !strings.Contains(err.Error(), string(tc.reason)) {
				t.Errorf("error %q does not carry its reason", err)
			}
			kept, err := os.ReadFile(wantMoved)
			if err != nil || !bytes.Equal(kept, tc.content) {
				t.Errorf("moved-aside file does not hold the original content (err %v)", err)
			}
			if _, err := os.Stat(e.path()); !os.IsNotExist(err) {
				t.Errorf("corrupt checkpoint still in place: %v", err)
			}
			if got := s.List(); len(got) != 0 {
				t.Errorf("store did not start empty: %+v", got)
			}

			// The plugin must be able to carry on, and the next start must
			// be clean.
			mustUpdate(t, s, put(sampleClaim("uid-new", PrepareStarted)))
			_, rec = e.open(t)
			if rec.Corruption != nil {
				t.Errorf("file written after recovery is unusable: %v", rec.Corruption)
			}
		})
	}
}

func TestMigrateV1(t *testing.T) {
	e := newEnv(t)
	v1, err := os.ReadFile(filepath.Join("testdata", "v1.json"))
	if err != nil {
		t.Fatal(err)
	}
	e.install(t, v1)
	s, rec := e.open(t)
	if rec.MigratedFrom != "v1" || rec.Corruption != nil || rec.BootIDChanged {
		t.Fatalf("unexpected recovery: %+v", rec)
	}
	want := []Claim{
		{
			UID: "0b6c7f35-54a9-4d0f-9a53-6f3f4bb2a1c1", Namespace: "ml", Name: "trainer-gpu", State: PrepareCompleted,
			Devices: []Device{
				{Pool: "node-a", Name: "gpu-0", CDIDeviceIDs: []string{"k8s.gpu.prism.dev/claim=0b6c7f35-54a9-4d0f-9a53-6f3f4bb2a1c1-gpu-0"}},
				{Pool: "node-a", Name: "gpu-1", CDIDeviceIDs: []string{"k8s.gpu.prism.dev/claim=0b6c7f35-54a9-4d0f-9a53-6f3f4bb2a1c1-gpu-1"}},
			},
		},
		{
			UID: "5e1d2c3b-0000-4000-8000-000000000002", Namespace: "default", Name: "notebook", State: PrepareCompleted,
			Devices: []Device{
				{Pool: "node-a", Name: "gpu-2", CDIDeviceIDs: []string{"k8s.gpu.prism.dev/claim=5e1d2c3b-0000-4000-8000-000000000002-gpu-2"}},
			},
		},
	}
	if got := s.List(); !reflect.DeepEqual(want, got) {
		t.Errorf("migrated claims differ:\nwant %+v\ngot  %+v", want, got)
	}

	// The migration is persisted, so the next start reads v2.
	onDisk, err := os.ReadFile(e.path())
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.HasPrefix(onDisk, []byte(`{"version":"v2",`)) {
		t.Errorf("migrated file was not rewritten as v2: %s", onDisk)
	}
	s2, rec := e.open(t)
	if rec.MigratedFrom != "" || rec.Corruption != nil {
		t.Errorf("second start still migrates: %+v", rec)
	}
	if got := s2.List(); !reflect.DeepEqual(want, got) {
		t.Errorf("claims changed after rewrite: %+v", got)
	}
}

func TestBootIDChange(t *testing.T) {
	tests := []struct {
		name            string
		writtenBoot     string // "" means unreadable
		openBoot        string
		wantChanged     bool
		wantInvalidated []string
	}{
		{name: "same boot", writtenBoot: bootA, openBoot: bootA},
		{name: "reboot", writtenBoot: bootA, openBoot: bootB, wantChanged: true, wantInvalidated: []string{"uid-a", "uid-c"}},
		{name: "boot ID unreadable now", writtenBoot: bootA, openBoot: ""},
		{name: "boot ID unreadable before", writtenBoot: "", openBoot: bootB},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			e := newEnv(t)
			setBoot := func(id string) {
				if id == "" {
					if err := os.Remove(e.bootIDPath); err != nil && !os.IsNotExist(err) {
						t.Fatal(err)
					}
					return
				}
				e.setBootID(t, id)
			}
			setBoot(tc.writtenBoot)
			s, _ := e.open(t)
			mustUpdate(t, s, func(d *Data) error {
				for _, c := range []Claim{
					sampleClaim("uid-a", PrepareCompleted),
					sampleClaim("uid-b", PrepareStarted),
					sampleClaim("uid-c", PrepareCompleted),
				} {
					d.Claims[c.UID] = c
				}
				return nil
			})

			setBoot(tc.openBoot)
			s, rec := e.open(t)
			if rec.BootIDChanged != tc.wantChanged || !slices.Equal(rec.Invalidated, tc.wantInvalidated) {
				t.Fatalf("recovered %+v, want changed=%v invalidated=%v", rec, tc.wantChanged, tc.wantInvalidated)
			}
			for _, c := range s.List() {
				wantState := sampleStateAfter(c.UID, tc.wantInvalidated)
				if c.State != wantState {
					t.Errorf("claim %s: state %s, want %s", c.UID, c.State, wantState)
				}
				if c.CDISpecFile == "" || len(c.Devices) != 1 {
					t.Errorf("claim %s lost the data needed to undo it: %+v", c.UID, c)
				}
			}

			// The downgrade is persisted and not reported twice.
			_, rec = e.open(t)
			if rec.BootIDChanged {
				t.Errorf("second start in the same boot reported a reboot again: %+v", rec)
			}
		})
	}
}

func sampleStateAfter(uid string, invalidated []string) PrepareState {
	if uid == "uid-b" || slices.Contains(invalidated, uid) {
		return PrepareStarted
	}
	return PrepareCompleted
}

func TestUpdateFailureLeavesStateUnchanged(t *testing.T) {
	tests := []struct {
		failAt string
		// diskUnchanged is false where the rename already happened.
		diskUnchanged bool
	}{
		{failAt: "create", diskUnchanged: true},
		{failAt: "write", diskUnchanged: true},
		{failAt: "chmod", diskUnchanged: true},
		{failAt: "sync", diskUnchanged: true},
		{failAt: "close", diskUnchanged: true},
		{failAt: "rename", diskUnchanged: true},
		{failAt: "syncdir", diskUnchanged: false},
	}
	for _, tc := range tests {
		t.Run(tc.failAt, func(t *testing.T) {
			e := newEnv(t)
			ffs := &faultyFS{}
			e.fs = ffs
			s, _ := e.open(t)
			before := sampleClaim("uid-a", PrepareStarted)
			mustUpdate(t, s, put(before))
			diskBefore, err := os.ReadFile(e.path())
			if err != nil {
				t.Fatal(err)
			}

			ffs.FailAt(tc.failAt)
			after := before
			after.State = PrepareCompleted
			_, ctx := ktesting.NewTestContext(t)
			err = s.Update(ctx, func(d *Data) error {
				d.Claims["uid-a"] = after
				d.Claims["uid-b"] = sampleClaim("uid-b", PrepareStarted)
				return nil
			})
			if !errors.Is(err, atomicfiletest.ErrInjected) {
				t.Fatalf("Update error = %v, want the injected failure", err)
			}
			if got := s.List(); !reflect.DeepEqual(got, []Claim{before}) {
				t.Errorf("in-memory state changed by a failed update: %+v", got)
			}
			diskNow, err := os.ReadFile(e.path())
			if err != nil {
				t.Fatal(err)
			}
			if tc.diskUnchanged && !bytes.Equal(diskBefore, diskNow) {
				t.Errorf("file changed by a failed update:\nbefore %s\nnow    %s", diskBefore, diskNow)
			}
			if tmp, _ := filepath.Glob(e.path() + ".tmp-*"); len(tmp) != 0 {
				t.Errorf("temporary files left behind: %v", tmp)
			}

			ffs.FailAt("")
			mustUpdate(t, s, put(after))
			reopened, _ := e.open(t)
			if got := reopened.List(); !reflect.DeepEqual(got, []Claim{after}) {
				t.Errorf("state after recovery from the failure: %+v", got)
			}
		})
	}
}

func TestUpdateRejectsBadChanges(t *testing.T) {
	callbackErr := errors.New("device busy")
	tests := []struct {
		name    string
		fn      func(*Data) error
		wantErr string
	}{
		{
			name: "callback error after mutating",
			fn: func(d *Data) error {
				c := d.Claims["uid-a"]
				c.Devices[0].CDIDeviceIDs[0] = "mutated"
				d.Claims["uid-a"] = c
				delete(d.Claims, "uid-a")
				return callbackErr
			},
			wantErr: "device busy",
		},
		{
			name:    "UID mismatch",
			fn:      func(d *Data) error { d.Claims["uid-x"] = sampleClaim("uid-y", PrepareStarted); return nil },
			wantErr: `claim uid-y is stored under UID "uid-x"`,
		},
		{
			name:    "empty state",
			fn:      func(d *Data) error { d.Claims["uid-x"] = sampleClaim("uid-x", ""); return nil },
			wantErr: `unknown state ""`,
		},
		{
			name:    "taint without an effect",
			fn:      func(d *Data) error { d.Taints = map[string]Taint{"gpu-0": {UUID: "GPU-0", Key: "k"}}; return nil },
			wantErr: `taint of device "gpu-0" lacks a device name, key or effect`,
		},
		{
			name: "MPS daemon without a pipe directory",
			fn: func(d *Data) error {
				d.MPSDaemons = map[string]MPSDaemon{"GPU-1": {UUID: "GPU-1", LogDir: "/log"}}
				return nil
			},
			wantErr: `MPS daemon "GPU-1" lacks a key, a GPU UUID, a pipe or a log directory, or has limits out of range`,
		},
		{
			name: "in-place mutation of shared slices then error",
			fn: func(d *Data) error {
				d.Claims["uid-a"].Devices[0].Requests[0] = "changed"
				return callbackErr
			},
			wantErr: "device busy",
		},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			e := newEnv(t)
			s, _ := e.open(t)
			orig := sampleClaim("uid-a", PrepareCompleted)
			mustUpdate(t, s, put(orig))
			_, ctx := ktesting.NewTestContext(t)
			err := s.Update(ctx, tc.fn)
			if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
				t.Fatalf("Update error = %v, want %q", err, tc.wantErr)
			}
			if got := s.List(); !reflect.DeepEqual(got, []Claim{orig}) {
				t.Errorf("state changed: %+v", got)
			}
			if got := s.Taints(); len(got) != 0 {
				t.Errorf("taints after the refused update: %+v", got)
			}
			if got := s.MPSDaemons(); len(got) != 0 {
				t.Errorf("MPS daemons after the refused update: %+v", got)
			}
		})
	}
}

func TestGetReturnsCopies(t *testing.T) {
	e := newEnv(t)
	s, _ := e.open(t)
	mustUpdate(t, s, put(sampleClaim("uid-a", PrepareCompleted)))
	c, _ := s.Get("uid-a")
	c.Devices[0].CDIDeviceIDs[0] = "mutated"
	c.Profiling.ReportDir = "mutated"
	l := s.List()
	l[0].Devices[0].Sharing.Share.MemoryBytes = 1
	if got, _ := s.Get("uid-a"); !reflect.DeepEqual(got, sampleClaim("uid-a", PrepareCompleted)) {
		t.Errorf("store content changed through a returned value: %+v", got)
	}
}

func TestLeftoverTempFilesAreRemoved(t *testing.T) {
	e := newEnv(t)
	leftover := e.path() + ".tmp-123456"
	if err := os.WriteFile(leftover, []byte(`{"version":"v2"`), 0o600); err != nil {
		t.Fatal(err)
	}
	e.open(t)
	if _, err := os.Stat(leftover); !os.IsNotExist(err) {
		t.Errorf("leftover temporary file not removed: %v", err)
	}
}

func TestCanceledContext(t *testing.T) {
	e := newEnv(t)
	s, _ := e.open(t)
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	called := false
	err := s.Update(ctx, func(*Data) error { called = true; return nil })
	if !errors.Is(err, context.Canceled) || called {
		t.Errorf("Update with canceled context: err %v, callback called %v", err, called)
	}
}

func TestConcurrentUpdates(t *testing.T) {
	const writers, perWriter = 4, 10
	e := newEnv(t)
	s, _ := e.open(t)
	_, ctx := ktesting.NewTestContext(t)

	var wg sync.WaitGroup
	stop := make(chan struct{})
	// Readers run throughout to let the race detector see reads racing
	// with the pointer swap.
	for range 2 {
		wg.Go(func() {
			for {
				select {
				case <-stop:
					return
				default:
					for _, c := range s.List() {
						if _, ok := s.Get(c.UID); !ok {
							t.Errorf("listed claim %s vanished", c.UID)
						}
					}
					// Spinning would starve the writers on a small machine.
					time.Sleep(100 * time.Microsecond)
				}
			}
		})
	}
	var writersWG sync.WaitGroup
	for w := range writers {
		writersWG.Go(func() {
			for i := range perWriter {
				uid := fmt.Sprintf("uid-%d-%d", w, i)
				if err := s.Update(ctx, put(sampleClaim(uid, PrepareStarted))); err != nil {
					t.Errorf("Update: %v", err)
				}
				// Read-modify-write: lost updates would show up as claims
				// stuck in PrepareStarted.
				if err := s.Update(ctx, func(d *Data) error {
					c := d.Claims[uid]
					c.State = PrepareCompleted
					d.Claims[uid] = c
					return nil
				}); err != nil {
					t.Errorf("Update: %v", err)
				}
			}
		})
	}
	writersWG.Wait()
	close(stop)
	wg.Wait()

	for _, store := range []*Store{s, func() *Store { r, _ := e.open(t); return r }()} {
		claims := store.List()
		if len(claims) != writers*perWriter {
			t.Fatalf("%d claims, want %d", len(claims), writers*perWriter)
		}
		for _, c := range claims {
			if c.State != PrepareCompleted {
				t.Errorf("claim %s lost an update: %s", c.UID, c.State)
			}
		}
	}
}

// faultyFS fails one step of the atomic write or of an append.
type faultyFS struct{ atomicfiletest.FS }

func (f *faultyFS) OpenAppend(name string) (atomicfile.File, error) {
	real, err := osFS{}.OpenAppend(name)
	if err != nil {
		return nil, err
	}
	return f.File(real), nil
}

// An unsynced change must still be readable by the next Open: only its
// durability across power loss differs.
func TestUnsyncedChangePersists(t *testing.T) {
	e := newEnv(t)
	s, _ := e.open(t)
	_, ctx := ktesting.NewTestContext(t)
	// The first change rewrites the file, the second is appended.
	for _, state := range []PrepareState{PrepareStarted, PrepareCompleted} {
		if err := s.PutClaims(ctx, false, sampleClaim("u1", state)); err != nil {
			t.Fatal(err)
		}
	}
	reopened, rec := e.open(t)
	if rec.Corruption != nil {
		t.Fatalf("reopen: %v", rec.Corruption)
	}
	if c, ok := reopened.Get("u1"); !ok || c.State != PrepareCompleted {
		t.Errorf("unsynced change not persisted: %+v %v", c, ok)
	}
}
