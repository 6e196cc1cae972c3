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
	"k8s.io/klog/v2"
	cdispec "tags.cncf.io/container-device-interface/specs-go"
)

// NVMLOptions configure the edit source for real NVIDIA nodes.
type NVMLOptions struct {
	// DriverRoot is where the driver is installed as seen by this process:
	// "/" for a host-installed driver, /run/nvidia/driver for the GPU
	// operator's driver container. Defaults to "/".
	DriverRoot string
	// DevRoot is where /dev of the driver is. Defaults to DriverRoot.
	DevRoot string
	// NVIDIACDIHookPath is the host path of nvidia-cdi-hook, which the
	// runtime executes for library symlinks and ldcache updates.
	// Defaults to nvcdi's default.
	NVIDIACDIHookPath string
	// NVMLLibraryPath is libnvidia-ml.so.1 to use. Empty lets nvcdi find it
	// in DriverRoot.
	NVMLLibraryPath string
}

// nvmlSource gets edits from NVIDIA's own generator, which knows the
// driver's libraries, binaries, firmware and hooks per driver version.
type nvmlSource struct {
	// mu serialises calls into nvcdi, which initialises and shuts down
	// NVML around each lookup.
	mu     sync.Mutex
	lib    nvcdi.Interface
	common *cdispec.ContainerEdits
}

// NewNVMLSource returns an EditSource for a node with an NVIDIA driver.
// It discovers the common edits (libraries, control devices) once, so a
// node without a usable driver fails here rather than on the first
// prepare.
func NewNVMLSource(ctx context.Context, opts NVMLOptions) (EditSource, error) {
	logger := klog.FromContext(ctx)
	if opts.DriverRoot == "" {
		opts.DriverRoot = "/"
	}
	if opts.DevRoot == "" {
		opts.DevRoot = opts.DriverRoot
	}
	nvcdiOpts := []nvcdi.Option{
		nvcdi.WithMode(nvcdi.ModeNvml),
		nvcdi.WithDriverRoot(opts.DriverRoot),
		nvcdi.WithDevRoot(opts.DevRoot),
		nvcdi.WithLogger(nvcdiLogger{logger.WithName("nvcdi")}),
		nvcdi.WithVendor(Vendor),
		nvcdi.WithClass(Class),
	}
	if opts.NVIDIACDIHookPath != "" {
		nvcdiOpts = append(nvcdiOpts, nvcdi.WithNVIDIACDIHookPath(opts.NVIDIACDIHookPath))
	}
	if opts.NVMLLibraryPath != "" {
		nvcdiOpts = append(nvcdiOpts, nvcdi.WithNvmlLib(nvml.New(nvml.WithLibraryPath(opts.NVMLLibraryPath))))
	}
	lib, err := nvcdi.New(nvcdiOpts...)
	if err != nil {
		return nil, fmt.Errorf("creating NVIDIA CDI generator for driver root %s: %w", opts.DriverRoot, err)
	}
	common, err := lib.GetCommonEdits()
	if err != nil {
		return nil, fmt.Errorf("discovering NVIDIA driver files in %s: %w", opts.DriverRoot, err)
	}
	if common == nil || common.ContainerEdits == nil {
		return nil, fmt.Errorf("discovering NVIDIA driver files in %s: no edits", opts.DriverRoot)
	}
	return &nvmlSource{lib: lib, common: common.ContainerEdits}, nil
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
	return &specs[0].ContainerEdits, nil
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
