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

package main

import (
	"fmt"
	"maps"
	"strconv"
	"strings"
)

// limits are a server's, or the daemon's defaults for the next server.
type limits struct {
	ActiveThreadPercentage float64 `json:"activeThreadPercentage"`
	// PinnedMem is the pinned device memory limit in bytes by device
	// index; a device without one has no limit.
	PinnedMem map[int]int64 `json:"pinnedMem,omitempty"`
}

func defaultLimits() limits {
	return limits{ActiveThreadPercentage: 100, PinnedMem: map[int]int64{}}
}

// clone is a copy that changes to l do not reach.
func (l limits) clone() limits {
	l.PinnedMem = maps.Clone(l.PinnedMem)
	if l.PinnedMem == nil {
		l.PinnedMem = map[int]int64{}
	}
	return l
}

// parsePercentage parses an active thread percentage, in (0, 100].
func parsePercentage(s string) (float64, error) {
	p, err := strconv.ParseFloat(s, 64)
	if err != nil || !(p > 0 && p <= 100) {
		return 0, fmt.Errorf("invalid active thread percentage %q: want a number above 0 and at most 100", s)
	}
	return p, nil
}

func formatPercentage(p float64) string {
	return strconv.FormatFloat(p, 'f', 1, 64)
}

// parseDevice parses a device index.
func parseDevice(s string) (int, error) {
	d, err := strconv.Atoi(s)
	if err != nil || d < 0 {
		return 0, fmt.Errorf("invalid device %q: want a device index", s)
	}
	return d, nil
}

// units are the binary suffixes of a memory value, with or without a B.
var units = map[string]int64{"": 1, "K": 1 << 10, "M": 1 << 20, "G": 1 << 30, "T": 1 << 40}

// parseBytes parses a memory value: a count of bytes with an optional
// suffix, such as 8G or 8192M. It must be above 0.
func parseBytes(s string) (int64, error) {
	digits := strings.TrimRight(s, "KMGTB")
	unit, ok := units[strings.TrimSuffix(s[len(digits):], "B")]
	n, err := strconv.ParseInt(digits, 10, 64)
	if !ok || err != nil || n <= 0 || n > (1<<62)/unit {
		return 0, fmt.Errorf("invalid memory value %q: want a positive count with an optional suffix, K, M, G or T, such as 8G", s)
	}
	return n * unit, nil
}

// formatMiB formats a limit as the get_*_pinned_mem_limit commands reply:
// in MiB, 0 for none.
func formatMiB(bytes int64) string {
	if bytes == 0 {
		return "0"
	}
	return fmt.Sprintf("%dM", bytes>>20)
}

// clientLimits are a client's effective limits: the server's, lowered by
// the client's CUDA_MPS_ACTIVE_THREAD_PERCENTAGE and
// CUDA_MPS_PINNED_DEVICE_MEM_LIMIT where they are set, valid and lower.
// Only device 0's pinned memory is returned, in bytes; 0 is no limit.
func clientLimits(server limits, getenv func(string) string) (percentage float64, pinned int64) {
	percentage = server.ActiveThreadPercentage
	if p, err := parsePercentage(getenv("CUDA_MPS_ACTIVE_THREAD_PERCENTAGE")); err == nil {
		percentage = min(percentage, p)
	}
	pinned = server.PinnedMem[0]
	if p, ok := clientPinned(getenv("CUDA_MPS_PINNED_DEVICE_MEM_LIMIT"), 0); ok && (pinned == 0 || p < pinned) {
		pinned = p
	}
	return percentage, pinned
}

// clientPinned is device's limit in a CUDA_MPS_PINNED_DEVICE_MEM_LIMIT
// value, "0=8G,1=4096M".
func clientPinned(v string, device int) (int64, bool) {
	for item := range strings.SplitSeq(v, ",") {
		dev, value, ok := strings.Cut(strings.TrimSpace(item), "=")
		if d, err := parseDevice(dev); !ok || err != nil || d != device {
			continue
		}
		if b, err := parseBytes(value); err == nil {
			return b, true
		}
	}
	return 0, false
}
