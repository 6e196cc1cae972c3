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

package plugin

import (
	"bytes"
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"google.golang.org/grpc"
	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/dynamic-resource-allocation/kubeletplugin"
	"k8s.io/klog/v2"
	"k8s.io/klog/v2/ktesting"

	gpuv1alpha1 "github.com/prismgpu/prism/api/gpu/v1alpha1"
	"github.com/prismgpu/prism/internal/plugin/checkpoint"
)

// A call's claims are recorded with one change per phase: the file holds
// the snapshot the first change wrote (every claim PrepareStarted) and one
// appended change completing them all.
func TestOneCallWritesOneChangePerPhase(t *testing.T) {
	dir := t.TempDir()
	d := newTestDriver(t, "h100-sxm-8.yaml", dir)
	claims := []*resourceapi.ResourceClaim{allocatedClaim("a", []string{"gpu-0"}), allocatedClaim("b", []string{"gpu-1"}), allocatedClaim("c", []string{"gpu-2", "gpu-3"})}
	for uid, r := range prepare(t, d, claims...) {
		if r.Err != nil {
			t.Fatalf("claim %s: %v", uid, r.Err)
		}
	}
	raw, err := os.ReadFile(filepath.Join(dir, checkpoint.DefaultFileName))
	if err != nil {
		t.Fatal(err)
	}
	lines := bytes.Split(bytes.TrimSpace(raw), []byte("\n"))
	if len(lines) != 2 {
		t.Fatalf("want a snapshot and one appended change, file has %d lines:\n%s", len(lines), raw)
	}
	if n := bytes.Count(lines[0], []byte(`"state":"PrepareStarted"`)); n != 3 {
		t.Errorf("snapshot records %d claims as started, want 3:\n%s", n, lines[0])
	}
	if n := bytes.Count(lines[1], []byte(`"state":"PrepareCompleted"`)); n != 3 {
		t.Errorf("appended change completes %d claims, want 3:\n%s", n, lines[1])
	}

	var objs []kubeletplugin.NamespacedObject
	for _, c := range claims {
		objs = append(objs, kubeletplugin.NamespacedObject{UID: c.UID})
	}
	if _, err := d.UnprepareResourceClaims(context.Background(), objs); err != nil {
		t.Fatal(err)
	}
	raw, _ = os.ReadFile(filepath.Join(dir, checkpoint.DefaultFileName))
	if lines := bytes.Split(bytes.TrimSpace(raw), []byte("\n")); len(lines) != 3 {
		t.Errorf("want unprepare to append one change, file has %d lines:\n%s", len(lines), raw)
	}
	if got := d.state.checkpoint.List(); len(got) != 0 {
		t.Errorf("claims left after unprepare: %+v", got)
	}
}

// Two time-sliced shares of one GPU released in one call: neither sees the
// other as a remaining user, so the GPU goes back to the default slice.
// Prepare refuses such shares now; these are the records of a plugin from
// before that, which the upgraded one still releases.
func TestUnprepareInOneCallResetsTheTimeSlice(t *testing.T) {
	d := newTestDriver(t, "h100-sxm-8.yaml", t.TempDir())
	slices := &RecordedTimeSlices{}
	d.state.timeSlices.slicer = slices
	g, _ := d.state.gpus.get("gpu-0")
	ctx := context.Background()
	if err := slices.SetTimeSlice(ctx, g.UUID, gpuv1alpha1.LongTimeSlice); err != nil {
		t.Fatal(err)
	}
	var records []checkpoint.Claim
	for _, uid := range []string{"a", "b"} {
		records = append(records, checkpoint.Claim{UID: uid, Namespace: "ns", Name: "claim-" + uid, State: checkpoint.PrepareCompleted, Devices: []checkpoint.Device{{
			Requests: []string{"gpu"}, Pool: testNode, Name: "gpu-0", ShareID: "share-" + uid,
			Sharing: &checkpoint.Sharing{Strategy: string(gpuv1alpha1.TimeSlicingSharing), TimeSlice: string(gpuv1alpha1.LongTimeSlice), Share: gpuv1alpha1.Share{MemoryBytes: 20 << 30}},
		}}})
	}
	if err := d.state.checkpoint.PutClaims(ctx, true, records...); err != nil {
		t.Fatal(err)
	}
	if _, err := d.UnprepareResourceClaims(ctx, []kubeletplugin.NamespacedObject{{UID: "a"}, {UID: "b"}}); err != nil {
		t.Fatal(err)
	}
	if got := slices.Get(g.UUID); got != gpuv1alpha1.DefaultTimeSlice {
		t.Errorf("time slice after both were released = %q, want Default", got)
	}
}

// At TraceVerbosity a call logs its stages; below it, the driver runs
// without a trace.
func TestTraceInterceptor(t *testing.T) {
	for _, tc := range []struct {
		verbosity int
		want      []string
	}{
		{TraceVerbosity, []string{traceLogMessage, StagePlan, StageCDIWrite, StageCkptFsync, StageHelperOther, stageDriverTotal + "="}},
		{TraceVerbosity - 1, nil},
	} {
		d := newTestDriver(t, "t4-2.yaml", t.TempDir())
		logger := ktesting.NewLogger(t, ktesting.NewConfig(ktesting.Verbosity(tc.verbosity), ktesting.BufferLogs(true)))
		traced := false
		handler := func(ctx context.Context, _ any) (any, error) {
			traced = traceFrom(ctx) != nil
			uid := types.UID("traced")
			res, err := d.PrepareResourceClaims(klog.NewContext(ctx, logger), []*resourceapi.ResourceClaim{allocatedClaim(string(uid), []string{"gpu-0"})})
			if err == nil {
				err = res[uid].Err
			}
			return nil, err
		}
		if _, err := TraceInterceptor(logger)(context.Background(), nil, &grpcInfo, handler); err != nil {
			t.Fatal(err)
		}
		out := logger.GetSink().(ktesting.Underlier).GetBuffer().String()
		if traced != (tc.want != nil) {
			t.Errorf("verbosity %d: driver ran with a trace: %v", tc.verbosity, traced)
		}
		for _, w := range tc.want {
			if !strings.Contains(out, w) {
				t.Errorf("verbosity %d: log lacks %q:\n%s", tc.verbosity, w, out)
			}
		}
		if tc.want == nil && strings.Contains(out, traceLogMessage) {
			t.Errorf("verbosity %d: timing logged:\n%s", tc.verbosity, out)
		}
	}
}

var grpcInfo = grpc.UnaryServerInfo{FullMethod: "/k8s.io.kubelet.pkg.apis.dra.v1.DRAPlugin/NodePrepareResources"}
