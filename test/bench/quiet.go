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

package bench

import (
	"context"
	"fmt"
	"os"
	"strconv"
	"strings"
	"time"
)

// waitQuiet waits until the machine's CPUs were busy less than busyBelow
// (a fraction) over one second, or until limit has passed, and returns the
// busy fraction of the last second. The test bed's control plane shares
// the machine with what a phase measures: after tens of thousands of
// objects are created, kube-controller-manager, kube-scheduler and etcd
// keep working through them for a while, and a latency measured then is
// theirs as much as the component's.
func waitQuiet(ctx context.Context, busyBelow float64, limit time.Duration) (float64, error) {
	deadline := time.Now().Add(limit)
	for {
		busy, err := cpuBusy(ctx, time.Second)
		if err != nil || busy < busyBelow || time.Now().After(deadline) {
			return busy, err
		}
	}
}

// cpuBusy is the fraction of all CPUs' time spent other than idle or in
// I/O wait over the interval, from /proc/stat.
func cpuBusy(ctx context.Context, interval time.Duration) (float64, error) {
	idle0, total0, err := cpuTimes()
	if err != nil {
		return 0, err
	}
	select {
	case <-ctx.Done():
		return 0, ctx.Err()
	case <-time.After(interval):
	}
	idle1, total1, err := cpuTimes()
	if err != nil {
		return 0, err
	}
	if total1 == total0 {
		return 0, nil
	}
	return 1 - float64(idle1-idle0)/float64(total1-total0), nil
}

// cpuTimes sums the first line of /proc/stat: the idle and I/O-wait
// jiffies, and all of them.
func cpuTimes() (idle, total uint64, err error) {
	data, err := os.ReadFile("/proc/stat")
	if err != nil {
		return 0, 0, err
	}
	line, _, _ := strings.Cut(string(data), "\n")
	f := strings.Fields(line)
	if len(f) < 6 || f[0] != "cpu" {
		return 0, 0, fmt.Errorf("/proc/stat: unexpected first line %q", line)
	}
	for i, s := range f[1:] {
		v, err := strconv.ParseUint(s, 10, 64)
		if err != nil {
			return 0, 0, fmt.Errorf("/proc/stat: %q: %w", line, err)
		}
		total += v
		if i == 3 || i == 4 { // idle, iowait
			idle += v
		}
	}
	return idle, total, nil
}
