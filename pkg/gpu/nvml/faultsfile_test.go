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

package nvml

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/google/go-cmp/cmp/cmpopts"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/klog/v2/ktesting"
	"k8s.io/utils/ptr"
)

// faultsNode is a watched simulated node of two GPUs, both registered for
// events, and their UUIDs in index order.
func faultsNode(t *testing.T) (*Faults, <-chan HealthEvent, []string) {
	t.Helper()
	_, ctx := ktesting.NewTestContext(t)
	ctx, cancel := context.WithCancel(ctx)
	t.Cleanup(cancel)
	sim := simulate(t, &Fleet{DriverVersion: "550.54.15", CUDADriverVersion: 12040, GPUs: []GPUGroup{{Product: "Tesla T4", Count: 2}}}, "node-a")
	lib, faults := SimulateFaults(sim)
	events := make(chan HealthEvent)
	go func() { _ = WatchHealth(ctx, lib, events, wait.Backoff{}) }()
	var uuids []string
	for _, d := range sim.Devices() {
		uuid, _ := d.GetUUID()
		select {
		case <-faults.Registered(uuid):
		case <-time.After(hangTimeout):
			t.Fatalf("GPU %s never registered for events", uuid)
		}
		uuids = append(uuids, uuid)
	}
	return faults, events, uuids
}

func nextEvent(t *testing.T, events <-chan HealthEvent) HealthEvent {
	t.Helper()
	select {
	case ev := <-events:
		return ev
	case <-time.After(hangTimeout):
		t.Fatal("no health event")
	}
	return HealthEvent{}
}

// A faults file's line raises its Xid on the GPU at that index, in the MIG
// GPU instance it names; a line that is not what the file holds is
// refused, with what it should be.
func TestInjectLine(t *testing.T) {
	faults, events, uuids := faultsNode(t)
	for _, tc := range []struct {
		line    string
		want    HealthEvent
		wantErr string
	}{
		{line: `{"gpu":1,"xid":48}` + "\n", want: HealthEvent{UUID: uuids[1], XID: 48}},
		{line: `{"gpu":0,"xid":94,"gpuInstance":3}` + "\n", want: HealthEvent{UUID: uuids[0], XID: 94, GPUInstance: ptr.To[uint32](3)}},
		{line: `{"gpu":0,"xid":94,"gpuInstance":0}`, want: HealthEvent{UUID: uuids[0], XID: 94, GPUInstance: ptr.To[uint32](0)}},
		{line: `{"gpu":0,"xid":94,"gpu_instance":3}`, wantErr: `unknown field "gpu_instance"`},
		{line: `{"gpu":0,"xid":94,"gpuInstance":-1}`, wantErr: "gpuInstance"},
		{line: `gpu 0 xid 48`, wantErr: "want a JSON object"},
		{line: `{"gpu":2,"xid":48}`, wantErr: "no GPU 2: the node has 2"},
		{line: `{"gpu":-1,"xid":48}`, wantErr: "no GPU -1"},
	} {
		t.Run(tc.line, func(t *testing.T) {
			err := faults.injectLine([]byte(tc.line))
			if tc.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
					t.Fatalf("error %v, want one containing %q", err, tc.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if diff := cmp.Diff(tc.want, nextEvent(t, events), cmpopts.EquateErrors()); diff != "" {
				t.Errorf("health event (-want +got):\n%s", diff)
			}
		})
	}
}

// FollowFile raises what is appended to the file, a line once it is
// complete, and nothing twice.
func TestFollowFile(t *testing.T) {
	faults, events, uuids := faultsNode(t)
	_, ctx := ktesting.NewTestContext(t)
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	path := filepath.Join(t.TempDir(), "faults.jsonl")
	go faults.FollowFile(ctx, path)

	appendLine := func(s string) {
		t.Helper()
		f, err := os.OpenFile(path, os.O_CREATE|os.O_APPEND|os.O_WRONLY, 0o644)
		if err != nil {
			t.Fatal(err)
		}
		defer f.Close()
		if _, err := f.WriteString(s); err != nil {
			t.Fatal(err)
		}
	}
	appendLine(`{"gpu":0,"xid":48}` + "\n" + `{"gpu":1,`)
	if diff := cmp.Diff(HealthEvent{UUID: uuids[0], XID: 48}, nextEvent(t, events), cmpopts.EquateErrors()); diff != "" {
		t.Errorf("first line's event (-want +got):\n%s", diff)
	}
	appendLine(`"xid":94}` + "\n")
	if diff := cmp.Diff(HealthEvent{UUID: uuids[1], XID: 94}, nextEvent(t, events), cmpopts.EquateErrors()); diff != "" {
		t.Errorf("completed line's event (-want +got):\n%s", diff)
	}
	select {
	case ev := <-events:
		t.Errorf("a line raised twice: %+v", ev)
	case <-time.After(time.Second):
	}
}
