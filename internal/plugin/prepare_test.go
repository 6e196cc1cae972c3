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
	"os"
	"path/filepath"
	"strings"
	"testing"

	resourceapi "k8s.io/api/resource/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/resource"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/client-go/kubernetes/fake"
	k8stesting "k8s.io/client-go/testing"
	"k8s.io/klog/v2/ktesting"

	"github.com/prismgpu/prism/pkg/gpu"
)

// profilingDriver is a test driver that can profile: an ncu install and a
// shim exist, and the driver restricts counters to admins.
func profilingDriver(t *testing.T, dir string) *Driver {
	t.Helper()
	host := fakeProfilingHost(t, dir)
	return newTestDriverWith(t, "h100-sxm-8.yaml", dir, func(c *Config) {
		c.Profiling = &ProfilingConfig{
			Options:  host,
			ProcRoot: filepath.Join("profiling", "testdata", "proc", "restricted-nocap"),
		}
	})
}

const profilingConfig = `{"apiVersion":"gpu.prism.dev/v1alpha1","kind":"GpuConfig","profiling":{"enabled":true}}`

// TestProfilingIsRefusedOnASharedGPU: ncu on a GPU other workloads use
// would slow them and measure their work, so such a claim runs unprofiled,
// and says why.
func TestProfilingIsRefusedOnASharedGPU(t *testing.T) {
	for _, tc := range []struct {
		name  string
		claim *resourceapi.ResourceClaim
		how   string
	}{
		{"time-slicing", allocatedClaim("p", []string{"gpu-0"}, opaque(`{"apiVersion":"gpu.prism.dev/v1alpha1","kind":"GpuConfig","sharing":{"strategy":"TimeSlicing"},"profiling":{"enabled":true}}`)), "time-slicing"},
		{"memory share", func() *resourceapi.ResourceClaim {
			c := sharedClaim("p", "20Gi")
			c.Status.Allocation.Devices.Config = []resourceapi.DeviceAllocationConfiguration{opaque(profilingConfig)}
			return c
		}(), "a memory share"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			d := profilingDriver(t, t.TempDir())
			if r := prepare(t, d, tc.claim)["p"]; r.Err != nil {
				t.Fatalf("a claim refused profiling must still prepare: %v", r.Err)
			}
			if rec, _ := d.state.checkpoint.Get("p"); rec.Profiling != nil {
				t.Errorf("claim on a shared GPU prepared for profiling: %+v", rec.Profiling)
			}
			ev := waitForEvent(t, d.cfg.KubeClient, "ProfilingRefusedSharedGPU")
			if !strings.Contains(ev.Message, tc.how) || ev.Type != "Warning" {
				t.Errorf("event %s %q does not say the GPU is shared by %s", ev.Type, ev.Message, tc.how)
			}
		})
	}
	t.Run("exclusive GPU is profiled", func(t *testing.T) {
		d := profilingDriver(t, t.TempDir())
		if r := prepare(t, d, allocatedClaim("p", []string{"gpu-0"}, opaque(profilingConfig)))["p"]; r.Err != nil {
			t.Fatal(r.Err)
		}
		if rec, _ := d.state.checkpoint.Get("p"); rec.Profiling == nil {
			t.Error("a claim with a whole GPU was not prepared for profiling")
		}
	})
	// Where GPUs are published shareable, a claim that names no amount
	// takes the whole GPU's memory as its share: nobody can join it.
	t.Run("share of the whole GPU is profiled", func(t *testing.T) {
		d := profilingDriver(t, t.TempDir())
		g, _ := d.state.gpus.get("gpu-0")
		step := gpu.MemoryShareStep.Value()
		c := sharedClaim("p", resource.NewQuantity(int64(g.MemoryBytes)/step*step, resource.BinarySI).String())
		c.Status.Allocation.Devices.Config = []resourceapi.DeviceAllocationConfiguration{opaque(profilingConfig)}
		if r := prepare(t, d, c)["p"]; r.Err != nil {
			t.Fatal(r.Err)
		}
		if rec, _ := d.state.checkpoint.Get("p"); rec.Profiling == nil {
			t.Error("a claim whose share is the whole GPU was not prepared for profiling")
		}
	})
}

// TestProfilingPermissionCheckFailureIsReported: a pod the plugin may not
// read (a chart without "pods get") is reported, not silently skipped.
func TestProfilingPermissionCheckFailureIsReported(t *testing.T) {
	d := profilingDriver(t, t.TempDir())
	d.cfg.KubeClient.(*fake.Clientset).PrependReactor("get", "pods", func(k8stesting.Action) (bool, runtime.Object, error) {
		return true, nil, apierrors.NewForbidden(schema.GroupResource{Resource: "pods"}, "trainer", nil)
	})
	claim := allocatedClaim("p1", []string{"gpu-0"}, opaque(profilingConfig))
	claim.Status.ReservedFor = []resourceapi.ResourceClaimConsumerReference{{Resource: "pods", Name: "trainer", UID: "pod-uid"}}
	if r := prepare(t, d, claim)["p1"]; r.Err != nil {
		t.Fatal(r.Err)
	}
	ev := waitForEvent(t, d.cfg.KubeClient, "ProfilingPermissionUnknown")
	if !strings.Contains(ev.Message, "forbidden") {
		t.Errorf("event %q does not carry the API error", ev.Message)
	}
}

// TestNvidiaSMIFindsTheDriversLibraries: the plugin's image has no
// libnvidia-ml, so nvidia-smi from the driver root must be pointed at the
// driver root's.
func TestNvidiaSMIFindsTheDriversLibraries(t *testing.T) {
	_, ctx := ktesting.NewTestContext(t)
	root := t.TempDir()
	libDir := filepath.Join(root, "usr", "lib", "x86_64-linux-gnu")
	record := filepath.Join(t.TempDir(), "env")
	for path, content := range map[string]string{
		filepath.Join(libDir, "libnvidia-ml.so.1"):      "",
		filepath.Join(root, "usr", "bin", "nvidia-smi"): "#!/bin/sh\necho \"$LD_LIBRARY_PATH\" > " + record + "\n",
	} {
		if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(path, []byte(content), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	t.Setenv("LD_LIBRARY_PATH", "/opt/own")
	if err := NewNvidiaSMI(root).SetTimeSlice(ctx, "GPU-1234", "Long"); err != nil {
		t.Fatal(err)
	}
	got, err := os.ReadFile(record)
	if err != nil {
		t.Fatal(err)
	}
	if want := libDir + ":/opt/own\n"; string(got) != want {
		t.Errorf("nvidia-smi ran with LD_LIBRARY_PATH=%q, want %q", got, want)
	}
}
