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

package mps

import (
	"context"
	"fmt"
	"math"
	"strconv"
	"strings"

	"github.com/prismgpu/prism/internal/plugin/checkpoint"
)

// The daemon's defaults, set with these commands of nvidia-cuda-mps-control
// before any client can connect, are the limits of every MPS server it
// starts. A client's CUDA_MPS_ACTIVE_THREAD_PERCENTAGE or
// CUDA_MPS_PINNED_DEVICE_MEM_LIMIT can only lower them. Device 0 is the
// share's GPU: the daemon sees it alone.
const (
	setThreads = "set_default_active_thread_percentage %d"
	getThreads = "get_default_active_thread_percentage"
	setPinned  = "set_default_device_pinned_mem_limit 0 %dM"
	getPinned  = "get_default_device_pinned_mem_limit 0"
	mibShift   = 20 // limits are given in whole MiB: bytes >> mibShift
)

// limit sets the new daemon's defaults to its share's limits and reads
// them back: a daemon that did not take them would let its share's clients
// use the whole GPU.
func (m *Manager) limit(ctx context.Context, rec checkpoint.MPSDaemon) error {
	if rec.Limits.LimitsCompute() {
		want := float64(rec.Limits.ComputePercent)
		if err := m.setAndCheck(ctx, rec, fmt.Sprintf(setThreads, rec.Limits.ComputePercent), getThreads, want, parsePercent); err != nil {
			return err
		}
	}
	if rec.Limits.LimitsMemory() {
		mib := rec.Limits.MemoryBytes >> mibShift
		if err := m.setAndCheck(ctx, rec, fmt.Sprintf(setPinned, mib), getPinned, float64(mib<<mibShift), parseBytes); err != nil {
			return err
		}
	}
	return nil
}

func (m *Manager) setAndCheck(ctx context.Context, rec checkpoint.MPSDaemon, set, get string, want float64, parse func(string) (float64, error)) error {
	if _, err := m.control(ctx, rec, set); err != nil {
		return err
	}
	out, err := m.control(ctx, rec, get)
	if err != nil {
		return err
	}
	got, err := parse(out)
	if err != nil {
		return fmt.Errorf("%s: %w", get, err)
	}
	if math.Abs(got-want) > 0.5 {
		return fmt.Errorf("the daemon did not take %q: %s says %s", set, get, out)
	}
	return nil
}

// parsePercent reads a thread percentage as the control client prints it
// ("40.0").
func parsePercent(s string) (float64, error) {
	return strconv.ParseFloat(strings.TrimSpace(s), 64)
}

// parseBytes reads a memory limit as the control client prints it: a
// number with a K, M, G or T suffix in powers of 1024 (NVIDIA's examples
// write "2G" and "1024M"), an optional B after it.
func parseBytes(s string) (float64, error) {
	s = strings.TrimSuffix(strings.ToUpper(strings.TrimSpace(s)), "B")
	shift := 0
	if i := strings.IndexAny(s, "KMGT"); i >= 0 && i == len(s)-1 {
		shift = 10 * (1 + strings.IndexByte("KMGT", s[i]))
		s = s[:i]
	}
	v, err := strconv.ParseFloat(s, 64)
	if err != nil {
		return 0, fmt.Errorf("not a memory limit: %q", s)
	}
	return v * float64(uint64(1)<<shift), nil
}
