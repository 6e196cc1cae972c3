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
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"

	gpuv1alpha1 "github.com/prismgpu/prism/api/gpu/v1alpha1"
	"github.com/prismgpu/prism/internal/plugin/checkpoint"
)

// TimeSlicer applies a GPU's time-slice length. NVML has no public call for
// it on bare metal (only for vGPU schedulers), so real nodes use nvidia-smi,
// as NVIDIA's own tooling does.
type TimeSlicer interface {
	SetTimeSlice(ctx context.Context, uuid string, interval gpuv1alpha1.TimeSliceInterval) error
}

// nvidiaSMITimeSlice maps an interval onto nvidia-smi's --set-timeslice values.
var nvidiaSMITimeSlice = map[gpuv1alpha1.TimeSliceInterval]string{
	gpuv1alpha1.DefaultTimeSlice: "0",
	gpuv1alpha1.ShortTimeSlice:   "1",
	gpuv1alpha1.MediumTimeSlice:  "2",
	gpuv1alpha1.LongTimeSlice:    "3",
}

// NvidiaSMI sets time slices with the nvidia-smi of a driver root.
type NvidiaSMI struct {
	Path string
	// LibraryDirs are searched for libnvidia-ml first: the plugin's image
	// has no driver libraries of its own, and the driver root's are not on
	// its loader's path.
	LibraryDirs []string
}

// driverLibraryDirs are where driver packages and the GPU operator's driver
// container install libnvidia-ml, relative to the driver root.
var driverLibraryDirs = []string{"usr/lib/x86_64-linux-gnu", "usr/lib/aarch64-linux-gnu", "usr/lib64", "lib64", "usr/lib"}

// NewNvidiaSMI uses <driverRoot>/usr/bin/nvidia-smi with the driver root's
// directories that hold libnvidia-ml.so.1.
func NewNvidiaSMI(driverRoot string) NvidiaSMI {
	n := NvidiaSMI{Path: filepath.Join(driverRoot, "usr", "bin", "nvidia-smi")}
	for _, dir := range driverLibraryDirs {
		dir = filepath.Join(driverRoot, dir)
		if _, err := os.Stat(filepath.Join(dir, "libnvidia-ml.so.1")); err == nil {
			n.LibraryDirs = append(n.LibraryDirs, dir)
		}
	}
	return n
}

// SetTimeSlice runs nvidia-smi compute-policy for one GPU.
func (n NvidiaSMI) SetTimeSlice(ctx context.Context, uuid string, interval gpuv1alpha1.TimeSliceInterval) error {
	value, ok := nvidiaSMITimeSlice[interval]
	if !ok {
		return fmt.Errorf("unknown time slice %q", interval)
	}
	cmd := exec.CommandContext(ctx, n.Path, "compute-policy", "-i", uuid, "--set-timeslice="+value)
	if len(n.LibraryDirs) > 0 {
		path := strings.Join(n.LibraryDirs, ":")
		if prev := os.Getenv("LD_LIBRARY_PATH"); prev != "" {
			path += ":" + prev
		}
		cmd.Env = append(os.Environ(), "LD_LIBRARY_PATH="+path)
	}
	out, err := cmd.CombinedOutput()
	if err != nil {
		return fmt.Errorf("set time slice %s on %s: %w: %s", interval, uuid, err, strings.TrimSpace(string(out)))
	}
	return nil
}

// RecordedTimeSlices stands in for the GPUs of a simulated node: it keeps the
// last setting per GPU, for tests and the demo to check.
type RecordedTimeSlices struct {
	mu       sync.Mutex
	settings map[string]gpuv1alpha1.TimeSliceInterval
}

// SetTimeSlice records the setting.
func (r *RecordedTimeSlices) SetTimeSlice(_ context.Context, uuid string, interval gpuv1alpha1.TimeSliceInterval) error {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.settings == nil {
		r.settings = map[string]gpuv1alpha1.TimeSliceInterval{}
	}
	r.settings[uuid] = interval
	return nil
}

// Get returns the last setting of a GPU, "" if none was made.
func (r *RecordedTimeSlices) Get(uuid string) gpuv1alpha1.TimeSliceInterval {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.settings[uuid]
}

// EnvTimeSlice names the time-slice interval the GPU was set to.
const EnvTimeSlice = "PRISM_GPU_TIMESLICE"

// timeSliceEnv tells the containers of a time-sliced device the interval
// its GPU was set to.
func timeSliceEnv(s *checkpoint.Sharing) []string {
	if s == nil || s.Strategy != string(gpuv1alpha1.TimeSlicingSharing) {
		return nil
	}
	slice := s.TimeSlice
	if slice == "" {
		slice = string(gpuv1alpha1.DefaultTimeSlice)
	}
	return []string{EnvTimeSlice + "=" + slice}
}

// timeSlices sets the time slice of the GPUs that claims ask to be
// time-sliced, and resets it once the last such claim of a GPU is gone.
type timeSlices struct {
	// slicer is nil where time-slicing is ignored.
	slicer     TimeSlicer
	gpus       *nodeGPUs
	checkpoint *checkpoint.Store
}

// set applies the settings a claim's devices need (see settings).
func (t *timeSlices) set(ctx context.Context, rec checkpoint.Claim, releasing map[string]bool) error {
	if t.slicer == nil {
		return nil
	}
	for _, dev := range t.settings(rec, releasing) {
		if err := t.slicer.SetTimeSlice(ctx, dev.uuid, dev.interval); err != nil {
			return err
		}
	}
	return nil
}

// settings lists the time-slice settings a claim's devices need. When the
// claim is among those releasing, it lists the resets to Default of the
// devices that no time-sliced claim outside releasing still uses.
func (t *timeSlices) settings(rec checkpoint.Claim, releasing map[string]bool) []deviceSharing {
	var out []deviceSharing
	for _, dev := range rec.Devices {
		if dev.Sharing == nil || dev.Sharing.Strategy != string(gpuv1alpha1.TimeSlicingSharing) {
			continue
		}
		g, ok := t.gpus.get(dev.Name)
		if !ok {
			continue
		}
		interval := gpuv1alpha1.TimeSliceInterval(dev.Sharing.TimeSlice)
		if interval == "" {
			interval = gpuv1alpha1.DefaultTimeSlice
		}
		if releasing[rec.UID] {
			if t.otherUser(releasing, dev.Name) {
				continue
			}
			interval = gpuv1alpha1.DefaultTimeSlice
		}
		out = append(out, deviceSharing{uuid: g.UUID, interval: interval})
	}
	return out
}

func (t *timeSlices) otherUser(releasing map[string]bool, device string) bool {
	found := false
	t.checkpoint.Range(func(c *checkpoint.Claim) bool {
		if releasing[c.UID] {
			return true
		}
		for _, dev := range c.Devices {
			if dev.Name == device && dev.Sharing != nil && dev.Sharing.Strategy == string(gpuv1alpha1.TimeSlicingSharing) {
				found = true
				return false
			}
		}
		return true
	})
	return found
}

// deviceSharing is one device's time-slice request.
type deviceSharing struct {
	uuid     string
	interval gpuv1alpha1.TimeSliceInterval
}
