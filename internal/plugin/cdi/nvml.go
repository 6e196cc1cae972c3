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
	"errors"
	"fmt"
	"sync"

	"github.com/NVIDIA/go-nvml/pkg/nvml"
	"github.com/NVIDIA/nvidia-container-toolkit/pkg/nvcdi"
	"github.com/NVIDIA/nvidia-container-toolkit/pkg/nvcdi/transform"
	"github.com/NVIDIA/nvidia-container-toolkit/pkg/nvcdi/transform/root"
	"k8s.io/klog/v2"
	cdispec "tags.cncf.io/container-device-interface/specs-go"
)

// DefaultNVIDIACDIHookPath is where the plugin's image copies
// nvidia-cdi-hook on the host: the runtime runs the hook from the host, and
// a node's driver install does not always ship one.
const DefaultNVIDIACDIHookPath = "/var/lib/prism/bin/nvidia-cdi-hook"

// NVMLOptions configure the edit source for real NVIDIA nodes.
type NVMLOptions struct {
	// Roots say where the driver is on the host and where this process
	// sees it.
	Roots Roots
	// NVIDIACDIHookPath is the host path of nvidia-cdi-hook, which the
	// runtime executes for library symlinks and ldcache updates. Defaults
	// to DefaultNVIDIACDIHookPath.
	NVIDIACDIHookPath string
	// NVMLLibraryPath is libnvidia-ml.so.1 to use. Empty lets nvcdi find it
	// in the driver root.
	NVMLLibraryPath string
}

// nvmlSource gets edits from NVIDIA's own generator, which knows the
// driver's libraries, binaries, firmware and hooks per driver version.
type nvmlSource struct {
	// mu serialises calls into nvcdi, which initialises and shuts down
	// NVML around each lookup.
	mu     sync.Mutex
	lib    nvcdi.Interface
	toHost transform.Transformer
	common *cdispec.ContainerEdits
}

// NewNVMLSource returns an EditSource for a node with an NVIDIA driver.
// It discovers the common edits (libraries, control devices) once, so a
// node without a usable driver fails here rather than on the first
// prepare.
func NewNVMLSource(ctx context.Context, opts NVMLOptions) (EditSource, error) {
	logger := klog.FromContext(ctx)
	roots := opts.Roots.resolve()
	if opts.NVIDIACDIHookPath == "" {
		opts.NVIDIACDIHookPath = DefaultNVIDIACDIHookPath
	}
	// nvcdi looks for the driver's files where this process sees them and
	// names them so; the transformer then rewrites those paths to the host's.
	nvcdiOpts := []nvcdi.Option{
		nvcdi.WithMode(nvcdi.ModeNvml),
		nvcdi.WithDriverRoot(roots.ContainerDriverRoot),
		nvcdi.WithDevRoot(roots.ContainerDevRoot),
		nvcdi.WithNVIDIACDIHookPath(opts.NVIDIACDIHookPath),
		nvcdi.WithLogger(nvcdiLogger{logger.WithName("nvcdi")}),
		nvcdi.WithVendor(Vendor),
		nvcdi.WithClass(Class),
	}
	if opts.NVMLLibraryPath != "" {
		nvcdiOpts = append(nvcdiOpts, nvcdi.WithNvmlLib(nvml.New(nvml.WithLibraryPath(opts.NVMLLibraryPath))))
	}
	lib, err := nvcdi.New(nvcdiOpts...)
	if err != nil {
		return nil, fmt.Errorf("creating NVIDIA CDI generator for driver root %s: %w", roots.ContainerDriverRoot, err)
	}
	s := &nvmlSource{lib: lib, toHost: root.NewDriverTransformer(
		root.WithDriverRoot(roots.ContainerDriverRoot),
		root.WithTargetDriverRoot(roots.DriverRoot),
		root.WithDevRoot(roots.ContainerDevRoot),
		root.WithTargetDevRoot(roots.DevRoot),
	)}
	common, err := lib.GetCommonEdits()
	if err != nil {
		return nil, fmt.Errorf("discovering NVIDIA driver files in %s: %w", roots.ContainerDriverRoot, err)
	}
	if common == nil || common.ContainerEdits == nil {
		return nil, fmt.Errorf("discovering NVIDIA driver files in %s: no edits", roots.ContainerDriverRoot)
	}
	if s.common, err = s.hostPaths(*common.ContainerEdits); err != nil {
		return nil, err
	}
	logger.V(2).Info("NVIDIA driver found", "driverRoot", roots.DriverRoot, "seenAt", roots.ContainerDriverRoot,
		"devRoot", roots.DevRoot, "devSeenAt", roots.ContainerDevRoot, "nvidiaCDIHook", opts.NVIDIACDIHookPath)
	return s, nil
}

// hostPaths rewrites the paths nvcdi found into the host paths the runtime
// needs.
func (s *nvmlSource) hostPaths(edits cdispec.ContainerEdits) (*cdispec.ContainerEdits, error) {
	spec := &cdispec.Spec{ContainerEdits: edits}
	if err := s.toHost.Transform(spec); err != nil {
		return nil, fmt.Errorf("mapping driver paths to host paths: %w", err)
	}
	return &spec.ContainerEdits, nil
}

func (s *nvmlSource) CommonEdits(_ context.Context) (*cdispec.ContainerEdits, error) {
	return s.common, nil
}

func (s *nvmlSource) DeviceEdits(_ context.Context, d Device) (*cdispec.ContainerEdits, error) {
	if d.UUID == "" {
		return nil, errors.New("device has no UUID")
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	specs, err := s.lib.GetDeviceSpecsByID(d.UUID)
	if err != nil {
		return nil, fmt.Errorf("generating edits for GPU %s: %w", d.UUID, err)
	}
	if len(specs) != 1 {
		return nil, fmt.Errorf("generating edits for GPU %s: got %d device specs, want 1", d.UUID, len(specs))
	}
	return s.hostPaths(specs[0].ContainerEdits)
}

// nvcdiLogger routes nvcdi's printf-style logging into klog. nvcdi logs
// every file it looks for, and warns about every optional library that a
// driver flavour does not ship, so only errors are logged unconditionally.
type nvcdiLogger struct {
	logger klog.Logger
}

func (l nvcdiLogger) Debugf(format string, args ...any) {
	l.logger.V(5).Info(fmt.Sprintf(format, args...))
}

func (l nvcdiLogger) Errorf(format string, args ...any) {
	l.logger.Error(nil, fmt.Sprintf(format, args...))
}

func (l nvcdiLogger) Infof(format string, args ...any) {
	l.logger.V(4).Info(fmt.Sprintf(format, args...))
}

func (l nvcdiLogger) Warningf(format string, args ...any) {
	l.logger.V(2).Info("Warning: " + fmt.Sprintf(format, args...))
}

func (l nvcdiLogger) Tracef(format string, args ...any) {
	l.logger.V(6).Info(fmt.Sprintf(format, args...))
}
