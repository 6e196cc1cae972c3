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
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	corev1 "k8s.io/api/core/v1"
	resourceapi "k8s.io/api/resource/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	drapb "k8s.io/kubelet/pkg/apis/dra/v1"

	gpuv1alpha1 "github.com/prismgpu/prism/api/gpu/v1alpha1"
	"github.com/prismgpu/prism/internal/plugin"
	"github.com/prismgpu/prism/internal/plugin/residency"
	"github.com/prismgpu/prism/pkg/gpu/nvml"
	"github.com/prismgpu/prism/test/testbed"
)

const (
	// usageWindow is how long both plugins' CPU time is counted: 12
	// sampling cycles of 8 GPUs at the default 5 s interval and two of the
	// 30 s writes of the records. The kernel counts CPU time in ticks of
	// 10 ms, so a figure is good to about 0.02 s a minute.
	usageWindow = 60 * time.Second
	// userHZ is the unit of utime and stime in /proc/<pid>/stat: USER_HZ,
	// which is 100 on every architecture Go builds for Linux (x/sys has no
	// sysconf(_SC_CLK_TCK) to ask).
	userHZ = 100
	// usageGPUs is the fleet's GPU count, each held by a claim of its own.
	usageGPUs = 8
	// dutyCycleMetric has one series per claim and GPU the plugin sampled.
	dutyCycleMetric = "prism_plugin_gpu_duty_cycle_percent"
)

// usageSide is one of the two plugins: sampling on or off.
type usageSide struct {
	name     string
	interval time.Duration
	p        *PluginProc
	conn     *grpc.ClientConn
	claims   []*resourceapi.ResourceClaim
	cpu      float64
}

// Usage measures what sampling NVML costs the kubelet plugin: two plugins
// side by side, each on a node of its own with the 8 GPUs of fleet all
// busy and each GPU held by a one-GPU claim, identical but for
// --usage-interval (the default, and 0: off). It counts their CPU time
// over the same window and reads their memory at its end.
func Usage(ctx context.Context, c *testbed.Cluster, client kubernetes.Interface, bin, fleet, dir string) (rows []Row, err error) {
	const ns = "bench-usage"
	if _, err := client.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}}, metav1.CreateOptions{}); err != nil {
		return nil, err
	}
	fleetRaw, err := os.ReadFile(fleet)
	if err != nil {
		return nil, err
	}
	sides := []*usageSide{{name: "sampling off"}, {name: "sampling on", interval: plugin.DefaultUsageInterval}}
	for _, s := range sides {
		defer s.stop()
		if err := s.start(ctx, c, client, ns, bin, fleetRaw, dir); err != nil {
			return nil, fmt.Errorf("%s: %w", s.name, err)
		}
	}
	// The first cycle starts NVML and writes the records: start-up, not
	// the steady cost.
	if err := sleepCtx(ctx, 2*plugin.DefaultUsageInterval); err != nil {
		return nil, err
	}
	for _, s := range sides {
		if s.cpu, err = cpuSeconds(s.p.Pid()); err != nil {
			return nil, err
		}
	}
	if err := sleepCtx(ctx, usageWindow); err != nil {
		return nil, err
	}
	for _, s := range sides {
		now, err := cpuSeconds(s.p.Pid())
		if err != nil {
			return nil, err
		}
		s.cpu = (now - s.cpu) / usageWindow.Minutes()
	}
	type footprint struct{ rss, file, anon, heap float64 }
	var fp [2]footprint
	var errs []error
	for i, s := range sides {
		m, err := residency.ReadMemory(s.p.Pid())
		if err != nil {
			return nil, err
		}
		fp[i] = footprint{rss: mib(m.Total), file: mib(m.File), anon: mib(m.Anon)}
		if fp[i].heap, err = s.p.heapInUseMiB(); err != nil {
			return nil, err
		}
		// Sampling that read nothing would measure a plugin doing nothing.
		want := 0
		if s.interval > 0 {
			want = usageGPUs
		}
		if n, err := metricSeries(s.p.HTTPAddr, dutyCycleMetric); err != nil || n != want {
			errs = append(errs, fmt.Errorf("%s: %d series of %s, want %d (log %s): %v", s.name, n, dutyCycleMetric, want, s.p.LogPath, err))
		}
		if err := unprepareClaims(ctx, drapb.NewDRAPluginClient(s.conn), s.claims); err != nil {
			errs = append(errs, fmt.Errorf("%s (log %s): %w", s.name, s.p.LogPath, err))
		}
	}

	off, on := sides[0], sides[1]
	cse := fmt.Sprintf("%d GPUs, %d claims", usageGPUs, usageGPUs)
	split := func(f footprint) string { return fmt.Sprintf("file %.1f + anon %.1f", f.file, f.anon) }
	return []Row{
		NewRow("usage sampling", cse, "plugin CPU (utime+stime)", "s per minute", off.name, off.cpu, on.name, on.cpu,
			fmt.Sprintf("both side by side for %s: %d cycles of %d busy simulated GPUs every %s; the difference is %.2f%% of one core",
				usageWindow, int(usageWindow/on.interval), usageGPUs, on.interval, (on.cpu-off.cpu)/60*100)), // s per minute over 60 s
		NewRow("usage sampling", cse, "RSS at the end (VmRSS)", "MiB", off.name, fp[0].rss, on.name, fp[1].rss,
			"off "+split(fp[0])+"; on "+split(fp[1])),
		NewRow("usage sampling", cse, "Go heap in use at the end", "MiB", off.name, fp[0].heap, on.name, fp[1].heap, "go_memstats_heap_inuse_bytes"),
	}, errors.Join(errs...)
}

// start runs the side's plugin on a node of its own, from a copy of bin
// of its own evicted from the page cache, so that the second plugin does
// not start with the pages the first faulted in (see DropPageCache), and on
// a copy of fleetRaw whose GPUs all show use. It prepares one claim per
// GPU, one call each, as the kubelet would for eight pods.
func (s *usageSide) start(ctx context.Context, c *testbed.Cluster, client kubernetes.Interface, ns, bin string, fleetRaw []byte, parent string) error {
	short := strings.TrimPrefix(s.name, "sampling ")
	node, dir := "bench-usage-"+short, filepath.Join(parent, short)
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return err
	}
	busy := nvml.Usage{}
	for i := range usageGPUs {
		busy.GPUs = append(busy.GPUs, nvml.GPUUsage{Index: i, UtilizationPercent: 40, MemoryUsedBytes: 10 << 30, SMActivityPercent: 35, DRAMActivityPercent: 20})
	}
	usageFile := filepath.Join(dir, "usage.json")
	if err := nvml.WriteUsage(usageFile, busy); err != nil {
		return err
	}
	fleet := filepath.Join(dir, "fleet.yaml")
	if err := os.WriteFile(fleet, fmt.Appendf(bytes.Clone(fleetRaw), "\nusageFile: %s\n", strconv.Quote(usageFile)), 0o644); err != nil {
		return err
	}
	own := filepath.Join(dir, filepath.Base(bin))
	if err := copyExecutable(bin, own); err != nil {
		return err
	}
	if err := DropPageCache(own); err != nil {
		return err
	}
	if err := CreateReadyNode(ctx, client, node, nil); err != nil {
		return err
	}
	s.claims = make([]*resourceapi.ResourceClaim, usageGPUs)
	if err := parallel(usageGPUs, usageGPUs, func(i int) error {
		cl, err := createClaimOn(ctx, client, ns, fmt.Sprintf("%s-%d", node, i), gpuv1alpha1.DriverName, node, i, 1)
		s.claims[i] = cl
		return err
	}); err != nil {
		return err
	}
	var err error
	if s.p, err = StartPlugin(ctx, c, own, node, dir, fleet, "--usage-interval="+s.interval.String()); err != nil {
		return err
	}
	if _, err := s.p.WaitReady(ctx, time.Minute); err != nil {
		return err
	}
	if s.conn, err = grpc.NewClient("unix://"+s.p.Socket(), grpc.WithTransportCredentials(insecure.NewCredentials())); err != nil {
		return err
	}
	dra := drapb.NewDRAPluginClient(s.conn)
	for _, cl := range s.claims {
		if err := prepareClaims(ctx, dra, []*resourceapi.ResourceClaim{cl}); err != nil {
			return fmt.Errorf("log %s: %w", s.p.LogPath, err)
		}
	}
	return nil
}

func (s *usageSide) stop() {
	if s.conn != nil {
		_ = s.conn.Close()
	}
	if s.p != nil {
		_ = s.p.Stop(5 * time.Second)
	}
}

// cpuSeconds is the user and system CPU time process pid has used so far,
// all its threads together.
func cpuSeconds(pid int) (float64, error) {
	path := fmt.Sprintf("/proc/%d/stat", pid)
	raw, err := os.ReadFile(path)
	if err != nil {
		return 0, err
	}
	// The command name, field 2, is in parentheses and may hold spaces or
	// parentheses itself: the fields after it follow the last ")".
	i := bytes.LastIndexByte(raw, ')')
	if i < 0 {
		return 0, fmt.Errorf("malformed %s", path)
	}
	// fields[0] is field 3 (state); utime and stime are fields 14 and 15.
	fields := strings.Fields(string(raw[i+1:]))
	if len(fields) < 13 {
		return 0, fmt.Errorf("malformed %s: %d fields", path, len(fields)+2)
	}
	var ticks uint64
	for _, f := range fields[11:13] {
		n, err := strconv.ParseUint(f, 10, 64)
		if err != nil {
			return 0, fmt.Errorf("malformed CPU time in %s: %w", path, err)
		}
		ticks += n
	}
	return float64(ticks) / userHZ, nil
}

// metricSeries counts the series of metric that a Prism binary serves at
// addr (host:port).
func metricSeries(addr, metric string) (int, error) {
	resp, err := http.Get("http://" + addr + "/metrics")
	if err != nil {
		return 0, err
	}
	defer resp.Body.Close()
	n := 0
	s := bufio.NewScanner(resp.Body)
	for s.Scan() {
		if strings.HasPrefix(s.Text(), metric+"{") {
			n++
		}
	}
	return n, s.Err()
}

// copyExecutable copies the binary at from to to.
func copyExecutable(from, to string) error {
	in, err := os.Open(from)
	if err != nil {
		return err
	}
	defer in.Close()
	out, err := os.OpenFile(to, os.O_CREATE|os.O_TRUNC|os.O_WRONLY, 0o755)
	if err != nil {
		return err
	}
	if _, err := io.Copy(out, in); err != nil {
		out.Close()
		return fmt.Errorf("copy %s: %w", from, err)
	}
	return out.Close()
}

func sleepCtx(ctx context.Context, d time.Duration) error {
	select {
	case <-ctx.Done():
		return ctx.Err()
	case <-time.After(d):
		return nil
	}
}
