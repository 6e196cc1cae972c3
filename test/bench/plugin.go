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
	"context"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"time"

	"golang.org/x/sys/unix"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	corev1 "k8s.io/api/core/v1"
	resourceapi "k8s.io/api/resource/v1"
	apiresource "k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apimachinery/pkg/util/uuid"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/kubernetes"
	drapb "k8s.io/kubelet/pkg/apis/dra/v1"
	registerapi "k8s.io/kubelet/pkg/apis/pluginregistration/v1"

	gpuv1alpha1 "github.com/prismgpu/prism/api/gpu/v1alpha1"
	"github.com/prismgpu/prism/internal/plugin/residency"
	"github.com/prismgpu/prism/internal/sim"
	"github.com/prismgpu/prism/test/testbed"
)

// RSSMiB reads VmRSS of a process.
func RSSMiB(pid int) (float64, error) {
	m, err := residency.ReadMemory(pid)
	return mib(m.Total), err
}

func mib(bytes uint64) float64 { return float64(bytes) / (1 << 20) }

// FSType names the file system that holds path (ext4, tmpfs, ...).
func FSType(path string) string {
	var st unix.Statfs_t
	if err := unix.Statfs(path, &st); err != nil {
		return "unknown: " + err.Error()
	}
	switch st.Type {
	case unix.TMPFS_MAGIC:
		return "tmpfs"
	case unix.EXT4_SUPER_MAGIC:
		return "ext4"
	case unix.XFS_SUPER_MAGIC:
		return "xfs"
	case unix.BTRFS_SUPER_MAGIC:
		return "btrfs"
	case unix.OVERLAYFS_SUPER_MAGIC:
		return "overlay"
	}
	return fmt.Sprintf("0x%x", st.Type)
}

// DropPageCache writes back and evicts a binary's pages from the page
// cache before it is started. How its pages came to be cached (written by
// the linker, copied, read ahead) changes how many the kernel maps per fault,
// by up to 17 MiB of VmRSS for the same 85 MB binary here; starting every
// plugin of the prepare phase from an uncached file makes their RSS
// comparable.
func DropPageCache(path string) error {
	f, err := os.Open(path)
	if err != nil {
		return err
	}
	defer f.Close()
	if err := unix.Fdatasync(int(f.Fd())); err != nil {
		return fmt.Errorf("sync %s: %w", path, err)
	}
	if err := unix.Fadvise(int(f.Fd()), 0, 0, unix.FADV_DONTNEED); err != nil {
		return fmt.Errorf("evict %s from the page cache: %w", path, err)
	}
	return nil
}

// PluginProc is one prism-kubelet-plugin process with no kubelet: its
// registration socket sits in a directory nobody watches, and WaitReady
// registers it as the kubelet would.
type PluginProc struct {
	*testbed.Process
	Node, Dir, HTTPAddr string
	Started             time.Time
	registered          bool
}

// Socket is the DRA gRPC socket.
func (p *PluginProc) Socket() string {
	return filepath.Join(p.Dir, "plugins", gpuv1alpha1.DriverName, "dra.sock")
}

// StartPlugin runs the plugin for node with a simulated fleet, state under dir.
// Profiling is off: in a real image the preload shim is installed, while
// here it would be compiled with gcc on every fresh state dir.
func StartPlugin(ctx context.Context, c *testbed.Cluster, bin, node, dir, fleet string, extraArgs ...string) (*PluginProc, error) {
	return StartPluginWithEnv(ctx, c, bin, node, dir, fleet, nil, extraArgs...)
}

// StartPluginWithEnv is StartPlugin with env added to the plugin's
// environment.
func StartPluginWithEnv(ctx context.Context, c *testbed.Cluster, bin, node, dir, fleet string, env []string, extraArgs ...string) (*PluginProc, error) {
	port, err := testbed.FreePort()
	if err != nil {
		return nil, err
	}
	p := &PluginProc{Node: node, Dir: dir, HTTPAddr: "127.0.0.1:" + strconv.Itoa(port)}
	if err := os.MkdirAll(filepath.Join(dir, "registry"), 0o755); err != nil {
		return nil, err
	}
	p.Started = time.Now()
	p.Process, err = testbed.StartProcessWithEnv(ctx, "prism-plugin-"+node, dir, filepath.Join(c.WorkDir(), "logs", "prism-plugin-"+filepath.Base(dir)+"-"+node+".log"), env, bin,
		append([]string{"--node-name=" + node,
			"--kubeconfig=" + c.KubeconfigPath,
			"--kubelet-registrar-dir=" + filepath.Join(dir, "registry"),
			"--kubelet-plugin-dir=" + filepath.Join(dir, "plugins", gpuv1alpha1.DriverName),
			"--cdi-root=" + filepath.Join(dir, "cdi"),
			"--state-dir=" + filepath.Join(dir, "state"),
			"--fleet=" + fleet,
			"--http-address=" + p.HTTPAddr,
			"--profiling=false",
		}, extraArgs...)...,
	)
	return p, err
}

// WaitReady polls /readyz and returns when it first answered 200.
func (p *PluginProc) WaitReady(ctx context.Context, timeout time.Duration) (time.Time, error) {
	deadline := time.Now().Add(timeout)
	hc := &http.Client{Timeout: time.Second}
	for time.Now().Before(deadline) {
		if exited, err := p.Exited(); exited {
			return time.Time{}, fmt.Errorf("plugin exited: %v (log %s)", err, p.LogPath)
		}
		if !p.registered {
			p.registered = p.register(ctx)
		}
		resp, err := hc.Get("http://" + p.HTTPAddr + "/readyz")
		if err == nil {
			resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				return time.Now(), nil
			}
		}
		select {
		case <-ctx.Done():
			return time.Time{}, ctx.Err()
		case <-time.After(5 * time.Millisecond):
		}
	}
	return time.Time{}, fmt.Errorf("plugin on %s not ready after %s (log %s)", p.Node, timeout, p.LogPath)
}

// register plays the kubelet's plugin watcher: once the registration
// socket exists it asks the plugin for its info and tells it that it is
// registered, which the plugin's readiness waits for. It reports whether
// it did.
func (p *PluginProc) register(ctx context.Context) bool {
	sockets, _ := filepath.Glob(filepath.Join(p.Dir, "registry", "*-reg.sock"))
	if len(sockets) == 0 {
		return false
	}
	conn, err := grpc.NewClient("unix://"+sockets[0], grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		return false
	}
	defer conn.Close()
	ctx, cancel := context.WithTimeout(ctx, time.Second)
	defer cancel()
	reg := registerapi.NewRegistrationClient(conn)
	if _, err := reg.GetInfo(ctx, &registerapi.InfoRequest{}); err != nil {
		return false
	}
	_, err = reg.NotifyRegistrationStatus(ctx, &registerapi.RegistrationStatus{PluginRegistered: true})
	return err == nil
}

// PrepareOptions bound the prepare phase.
type PrepareOptions struct {
	Calls, Warmup int
	PluginBin     string
	Fleet         string
	Dir           string
	// ReferenceBin, when set, is the kubelet plugin of
	// kubernetes-sigs/dra-example-driver, measured by the same loop after
	// Prism so that the comparison comes from one run.
	ReferenceBin string
	// KubeAPIQPS and KubeAPIBurst are given to both plugins' API clients:
	// each prepare waits for one claim GET, so a tighter limit for one
	// plugin would measure the flag rather than the plugin.
	KubeAPIQPS   float64
	KubeAPIBurst int
	// TraceCalls, when positive, runs Prism once more at -v=4 for that many
	// claim pairs and reports the median time per stage of a prepare.
	TraceCalls int
}

func (o PrepareOptions) clientSettings() string {
	return fmt.Sprintf("client %g QPS/%d burst", o.KubeAPIQPS, o.KubeAPIBurst)
}

func (o PrepareOptions) prismArgs() []string {
	return []string{fmt.Sprintf("--kube-api-qps=%g", o.KubeAPIQPS), fmt.Sprintf("--kube-api-burst=%d", o.KubeAPIBurst)}
}

// PrepareResult carries the plugins' RSS for the footprint rows.
type PrepareResult struct {
	Rows               []Row
	IdleRSS, LoadedRSS float64
	StateFS            string
	// Reference is nil unless PrepareOptions.ReferenceBin was set.
	Reference *PrepareLoad
}

// PrepareLoad is what one plugin did under the prepare loop.
type PrepareLoad struct {
	Prep1, Prep4, Unprep1, Unprep4, Gets []time.Duration
	IdleRSS, LoadedRSS                   float64
}

const prepNode = "bench-prep"

// Prepare calls NodePrepareResources then NodeUnprepareResources over the
// plugin's real gRPC socket, sequentially, each on a new claim, alternating
// a 1-GPU and a 4-GPU claim.
func Prepare(ctx context.Context, c *testbed.Cluster, client kubernetes.Interface, o PrepareOptions) (*PrepareResult, error) {
	ns := "bench-prep"
	if _, err := client.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}}, metav1.CreateOptions{}); err != nil {
		return nil, err
	}
	if err := CreateReadyNode(ctx, client, prepNode, nil); err != nil {
		return nil, err
	}
	total := o.Calls + o.Warmup
	// Both plugins' claims exist before either runs, so that both loops
	// see an API server holding the same objects.
	claims, err := createAllocatedClaims(ctx, client, ns, "prep", gpuv1alpha1.DriverName, total)
	if err != nil {
		return nil, err
	}
	var refClaims map[int][]*resourceapi.ResourceClaim
	if o.ReferenceBin != "" {
		if refClaims, err = createAllocatedClaims(ctx, client, ns, "ref", ReferenceDriverName, total); err != nil {
			return nil, err
		}
	}

	if err := DropPageCache(o.PluginBin); err != nil {
		return nil, err
	}
	p, err := StartPlugin(ctx, c, o.PluginBin, prepNode, o.Dir, o.Fleet, o.prismArgs()...)
	if err != nil {
		return nil, err
	}
	defer func() { _ = p.Stop(5 * time.Second) }()
	if _, err := p.WaitReady(ctx, time.Minute); err != nil {
		return nil, err
	}
	res := &PrepareResult{StateFS: FSType(filepath.Join(o.Dir, "state"))}
	prism, err := prepareLoad(ctx, client, p.Process, p.Socket(), claims, o.Warmup)
	if err != nil {
		return nil, err
	}
	res.IdleRSS, res.LoadedRSS = prism.IdleRSS, prism.LoadedRSS
	// Alone on the CPUs, as Prism was.
	_ = p.Stop(5 * time.Second)

	cse := fmt.Sprintf("real plugin over gRPC, %d sequential new claims, state on %s, %s", o.Calls, res.StateFS, o.clientSettings())
	res.Rows = []Row{
		NewRow("prepare", cse, "NodePrepareResources p50", "ms", "1 GPU", ms(Percentile(prism.Prep1, 0.5)), "4 GPUs", ms(Percentile(prism.Prep4, 0.5)), ""),
		NewRow("prepare", cse, "NodePrepareResources p99", "ms", "1 GPU", ms(Percentile(prism.Prep1, 0.99)), "4 GPUs", ms(Percentile(prism.Prep4, 0.99)), ""),
		NewRow("prepare", cse, "NodeUnprepareResources p50", "ms", "1 GPU", ms(Percentile(prism.Unprep1, 0.5)), "4 GPUs", ms(Percentile(prism.Unprep4, 0.5)), ""),
		NewRow("prepare", cse, "NodeUnprepareResources p99", "ms", "1 GPU", ms(Percentile(prism.Unprep1, 0.99)), "4 GPUs", ms(Percentile(prism.Unprep4, 0.99)), ""),
		NewRow("prepare", cse, "floor: client GET of the claim vs prepare, p50", "ms", "GET claim", ms(Percentile(prism.Gets, 0.5)), "prepare 1 GPU", ms(Percentile(prism.Prep1, 0.5)), ""),
	}
	if o.TraceCalls > 0 {
		rows, err := prepareBreakdown(ctx, c, client, o, claims)
		if err != nil {
			return nil, fmt.Errorf("breakdown: %w", err)
		}
		res.Rows = append(res.Rows, rows...)
	}
	if o.ReferenceBin == "" {
		return res, nil
	}

	r, err := StartReferencePlugin(ctx, c, o.ReferenceBin, prepNode, filepath.Join(o.Dir, "reference"), o.KubeAPIQPS, o.KubeAPIBurst)
	if err != nil {
		return nil, err
	}
	defer func() { _ = r.Stop(5 * time.Second) }()
	if err := r.WaitSocket(ctx, time.Minute); err != nil {
		return nil, err
	}
	if res.Reference, err = prepareLoad(ctx, client, r.Process, r.Socket(), refClaims, o.Warmup); err != nil {
		return nil, fmt.Errorf("reference plugin (log %s): %w", r.LogPath, err)
	}
	ref := res.Reference
	cse = fmt.Sprintf("same run: example driver vs Prism, %d sequential new claims each, state on %s, both %s", o.Calls, FSType(r.Dir), o.clientSettings())
	for _, m := range []struct {
		name      string
		ref, mine []time.Duration
		q         float64
	}{
		{"NodePrepareResources 1 GPU p50", ref.Prep1, prism.Prep1, 0.5},
		{"NodePrepareResources 1 GPU p99", ref.Prep1, prism.Prep1, 0.99},
		{"NodePrepareResources 4 GPUs p50", ref.Prep4, prism.Prep4, 0.5},
		{"NodePrepareResources 4 GPUs p99", ref.Prep4, prism.Prep4, 0.99},
		{"NodeUnprepareResources 1 GPU p50", ref.Unprep1, prism.Unprep1, 0.5},
		{"NodeUnprepareResources 1 GPU p99", ref.Unprep1, prism.Unprep1, 0.99},
		{"client GET of the claim p50", ref.Gets, prism.Gets, 0.5},
	} {
		res.Rows = append(res.Rows, NewRow("prepare", cse, m.name, "ms", "example driver", ms(Percentile(m.ref, m.q)), "Prism", ms(Percentile(m.mine, m.q)), ""))
	}
	return res, nil
}

// prepareLoad runs the loop on one plugin: its idle RSS, then for each pair
// of claims a GET of the 1-GPU claim (the floor: what the kubelet plugin
// helper does before calling the driver), prepare+unprepare of the 1-GPU
// claim, then of the 4-GPU claim, then its RSS under load. The first warmup
// pairs are not counted.
func prepareLoad(ctx context.Context, client kubernetes.Interface, proc *testbed.Process, socket string, claims map[int][]*resourceapi.ResourceClaim, warmup int) (*PrepareLoad, error) {
	load := &PrepareLoad{}
	time.Sleep(2 * time.Second) // let start-up garbage go
	var err error
	if load.IdleRSS, err = RSSMiB(proc.Pid()); err != nil {
		return nil, err
	}

	conn, err := grpc.NewClient("unix://"+socket, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		return nil, err
	}
	defer conn.Close()
	dra := drapb.NewDRAPluginClient(conn)
	call := func(cl *resourceapi.ResourceClaim) (prep, unprep time.Duration, err error) {
		req := []*drapb.Claim{{Namespace: cl.Namespace, Name: cl.Name, Uid: string(cl.UID)}}
		start := time.Now()
		resp, err := dra.NodePrepareResources(ctx, &drapb.NodePrepareResourcesRequest{Claims: req})
		prep = time.Since(start)
		if err != nil {
			return 0, 0, fmt.Errorf("prepare %s: %w", cl.Name, err)
		}
		if r := resp.Claims[string(cl.UID)]; r == nil || r.Error != "" || len(r.Devices) == 0 {
			return 0, 0, fmt.Errorf("prepare %s: %+v", cl.Name, r)
		}
		start = time.Now()
		uresp, err := dra.NodeUnprepareResources(ctx, &drapb.NodeUnprepareResourcesRequest{Claims: req})
		unprep = time.Since(start)
		if err != nil {
			return 0, 0, fmt.Errorf("unprepare %s: %w", cl.Name, err)
		}
		if r := uresp.Claims[string(cl.UID)]; r == nil || r.Error != "" {
			return 0, 0, fmt.Errorf("unprepare %s: %+v", cl.Name, r)
		}
		return prep, unprep, nil
	}
	for i := range claims[1] {
		start := time.Now()
		if _, err := client.ResourceV1().ResourceClaims(claims[1][i].Namespace).Get(ctx, claims[1][i].Name, metav1.GetOptions{}); err != nil {
			return nil, err
		}
		get := time.Since(start)
		p1, u1, err := call(claims[1][i])
		if err != nil {
			return nil, err
		}
		p4, u4, err := call(claims[4][i])
		if err != nil {
			return nil, err
		}
		if i < warmup {
			continue
		}
		load.Gets, load.Prep1, load.Unprep1, load.Prep4, load.Unprep4 = append(load.Gets, get), append(load.Prep1, p1), append(load.Unprep1, u1), append(load.Prep4, p4), append(load.Unprep4, u4)
	}
	if load.LoadedRSS, err = RSSMiB(proc.Pid()); err != nil {
		return nil, err
	}
	return load, nil
}

// createAllocatedClaims makes n 1-GPU and n 4-GPU claims, allocated to
// driver's devices gpu-0.. in the pool named after prepNode.
func createAllocatedClaims(ctx context.Context, client kubernetes.Interface, ns, prefix, driver string, n int) (map[int][]*resourceapi.ResourceClaim, error) {
	claims := map[int][]*resourceapi.ResourceClaim{1: make([]*resourceapi.ResourceClaim, n), 4: make([]*resourceapi.ResourceClaim, n)}
	for _, gpus := range []int{1, 4} {
		if err := parallel(n, 8, func(i int) error {
			cl, err := createAllocatedClaim(ctx, client, ns, fmt.Sprintf("%s%d-%d", prefix, gpus, i), driver, gpus)
			claims[gpus][i] = cl
			return err
		}); err != nil {
			return nil, fmt.Errorf("create claims allocated to %s: %w", driver, err)
		}
	}
	return claims, nil
}

func createAllocatedClaim(ctx context.Context, client kubernetes.Interface, ns, name, driver string, gpus int) (*resourceapi.ResourceClaim, error) {
	return createClaimOn(ctx, client, ns, name, driver, prepNode, 0, gpus)
}

// createClaimOn makes a claim allocated driver's devices gpu-<first> to
// gpu-<first+gpus-1> in node's pool.
func createClaimOn(ctx context.Context, client kubernetes.Interface, ns, name, driver, node string, first, gpus int) (*resourceapi.ResourceClaim, error) {
	cl, err := client.ResourceV1().ResourceClaims(ns).Create(ctx, &resourceapi.ResourceClaim{
		ObjectMeta: metav1.ObjectMeta{Name: name},
		Spec:       *sim.GPUClaim(int64(gpus)),
	}, metav1.CreateOptions{})
	if err != nil {
		return nil, err
	}
	alloc := &resourceapi.AllocationResult{}
	for d := range gpus {
		alloc.Devices.Results = append(alloc.Devices.Results, resourceapi.DeviceRequestAllocationResult{
			Request: "gpu", Driver: driver, Pool: node, Device: fmt.Sprintf("gpu-%d", first+d),
		})
	}
	alloc.NodeSelector = &corev1.NodeSelector{NodeSelectorTerms: []corev1.NodeSelectorTerm{{
		MatchFields: []corev1.NodeSelectorRequirement{{Key: "metadata.name", Operator: corev1.NodeSelectorOpIn, Values: []string{node}}},
	}}}
	cl.Status.Allocation = alloc
	return client.ResourceV1().ResourceClaims(ns).UpdateStatus(ctx, cl, metav1.UpdateOptions{})
}

// StartupResult holds the start-up times.
type StartupResult struct {
	Ready, Slice []time.Duration
}

// Startup starts a fresh plugin for a new node n times and measures the
// time from process start to /readyz and to its ResourceSlice being
// visible through a watch on the API server.
func Startup(ctx context.Context, c *testbed.Cluster, client kubernetes.Interface, bin, fleet, dir string, n int) (*StartupResult, error) {
	res := &StartupResult{}
	for i := range n {
		node := fmt.Sprintf("bench-start-%d", i)
		if err := CreateReadyNode(ctx, client, node, nil); err != nil {
			return nil, err
		}
		w, err := client.ResourceV1().ResourceSlices().Watch(ctx, metav1.ListOptions{
			FieldSelector: fields.OneTermEqualSelector(resourceapi.ResourceSliceSelectorNodeName, node).String(),
		})
		if err != nil {
			return nil, err
		}
		p, err := StartPlugin(ctx, c, bin, node, filepath.Join(dir, strconv.Itoa(i)), fleet)
		if err != nil {
			w.Stop()
			return nil, err
		}
		readyCh := make(chan error, 1)
		var readyAt time.Time
		go func() {
			t, err := p.WaitReady(ctx, time.Minute)
			readyAt = t
			readyCh <- err
		}()
		var sliceAt time.Time
		timeout := time.After(time.Minute)
	wait:
		for {
			select {
			case ev := <-w.ResultChan():
				if ev.Type == watch.Added || ev.Type == watch.Modified {
					sliceAt = time.Now()
					break wait
				}
			case <-timeout:
				w.Stop()
				_ = p.Stop(5 * time.Second)
				return nil, fmt.Errorf("no ResourceSlice for %s after 1m (log %s)", node, p.LogPath)
			}
		}
		w.Stop()
		if err := <-readyCh; err != nil {
			_ = p.Stop(5 * time.Second)
			return nil, err
		}
		res.Ready = append(res.Ready, readyAt.Sub(p.Started))
		res.Slice = append(res.Slice, sliceAt.Sub(p.Started))
		_ = p.Stop(5 * time.Second)
	}
	return res, nil
}

// prepareBreakdown runs a fresh Prism at -v=4, where each kubelet call logs
// the time it spent per stage, over the first claims of the loop again, and
// reports the median per stage of the 1-GPU and the 4-GPU prepares. It is a
// pass of its own so that the log lines do not weigh on the timed loop.
func prepareBreakdown(ctx context.Context, c *testbed.Cluster, client kubernetes.Interface, o PrepareOptions, claims map[int][]*resourceapi.ResourceClaim) ([]Row, error) {
	n := min(o.TraceCalls+o.Warmup, len(claims[1]))
	subset := map[int][]*resourceapi.ResourceClaim{1: claims[1][:n], 4: claims[4][:n]}
	p, err := StartPlugin(ctx, c, o.PluginBin, prepNode, filepath.Join(o.Dir, "trace"), o.Fleet, append(o.prismArgs(), "--v=4")...)
	if err != nil {
		return nil, err
	}
	defer func() { _ = p.Stop(5 * time.Second) }()
	if _, err := p.WaitReady(ctx, time.Minute); err != nil {
		return nil, err
	}
	if _, err := prepareLoad(ctx, client, p.Process, p.Socket(), subset, o.Warmup); err != nil {
		return nil, err
	}
	_ = p.Stop(5 * time.Second)
	calls, err := ParseCallTimings(p.LogPath, "NodePrepareResources")
	if err != nil {
		return nil, err
	}
	if len(calls) != 2*n {
		return nil, fmt.Errorf("%d prepare timings in %s, want %d", len(calls), p.LogPath, 2*n)
	}
	calls = calls[2*o.Warmup:]
	var order []string
	seen := map[string]bool{}
	for _, call := range calls {
		for _, st := range call.Order {
			if !seen[st] {
				seen[st] = true
				order = append(order, st)
			}
		}
	}
	cse := fmt.Sprintf("one prepare, median per stage of %d calls, Prism at -v=4 (separate pass), %s", len(calls)/2, o.clientSettings())
	median := func(size int, stage string) float64 {
		var ds []time.Duration
		for i := size; i < len(calls); i += 2 {
			ds = append(ds, calls[i].Micros[stage])
		}
		return us(Median(ds))
	}
	var rows []Row
	for _, st := range append(order, "total") {
		rows = append(rows, NewRow("prepare breakdown", cse, st, "µs", "1 GPU", median(0, st), "4 GPUs", median(1, st), ""))
	}
	return rows, nil
}

// CallTiming is one "Call timing" line of the plugin's log.
type CallTiming struct {
	Order  []string
	Micros map[string]time.Duration
}

var stagesRE = regexp.MustCompile(`totalMicros=(\d+) stages="([^"]*)"`)

// ParseCallTimings reads the stage timings of one gRPC method, in call order.
func ParseCallTimings(logPath, method string) ([]CallTiming, error) {
	raw, err := os.ReadFile(logPath)
	if err != nil {
		return nil, err
	}
	var out []CallTiming
	for _, line := range strings.Split(string(raw), "\n") {
		if !strings.Contains(line, `"Call timing"`) || !strings.Contains(line, `method="`+method+`"`) {
			continue
		}
		m := stagesRE.FindStringSubmatch(line)
		if m == nil {
			return nil, fmt.Errorf("unparsable timing line: %s", line)
		}
		total, _ := strconv.ParseInt(m[1], 10, 64)
		ct := CallTiming{Micros: map[string]time.Duration{"total": time.Duration(total) * time.Microsecond}}
		for _, kv := range strings.Split(m[2], ",") {
			k, v, ok := strings.Cut(kv, "=")
			if !ok {
				continue
			}
			n, err := strconv.ParseInt(v, 10, 64)
			if err != nil {
				return nil, fmt.Errorf("stage %q in %s: %w", k, line, err)
			}
			ct.Order = append(ct.Order, k)
			ct.Micros[k] = time.Duration(n) * time.Microsecond
		}
		out = append(out, ct)
	}
	return out, nil
}

// PrepareScale fills one node per case of spec ("GPUS:CLAIMS,...") with
// claims that each hold a 1Gi memory share, many per GPU, in calls of
// scaleBatch claims, and at a quarter, half and all of CLAIMS measures
// sequential prepare+unprepare of one more share: latency, the checkpoint's
// size and time per prepare, and the plugin's RSS. The plugin runs at -v=4
// for the checkpoint's share of each call, in every level alike.
func PrepareScale(ctx context.Context, c *testbed.Cluster, client kubernetes.Interface, o PrepareOptions, spec string) ([]Row, error) {
	if spec == "" {
		return nil, nil
	}
	const (
		ns         = "bench-scale"
		probes     = 100
		warmup     = 5
		scaleBatch = 20
	)
	if _, err := client.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}}, metav1.CreateOptions{}); err != nil {
		return nil, err
	}
	fleetRaw, err := os.ReadFile(o.Fleet)
	if err != nil {
		return nil, err
	}
	var rows []Row
	for _, cs := range strings.Split(spec, ",") {
		gs, ns2, ok := strings.Cut(strings.TrimSpace(cs), ":")
		gpus, err1 := strconv.Atoi(gs)
		total, err2 := strconv.Atoi(ns2)
		if !ok || err1 != nil || err2 != nil || gpus < 1 || total < 4 {
			return rows, fmt.Errorf("--prepare-scale case %q: want GPUS:CLAIMS", cs)
		}
		node := fmt.Sprintf("bench-scale-%d", gpus)
		dir := filepath.Join(o.Dir, fmt.Sprintf("scale-%d", gpus))
		if err := os.MkdirAll(dir, 0o755); err != nil {
			return rows, err
		}
		fleet := filepath.Join(dir, "fleet.yaml")
		if err := os.WriteFile(fleet, []byte(strings.Replace(string(fleetRaw), "count: 8", fmt.Sprintf("count: %d", gpus), 1)), 0o644); err != nil {
			return rows, err
		}
		if err := CreateReadyNode(ctx, client, node, nil); err != nil {
			return rows, err
		}
		held := make([]*resourceapi.ResourceClaim, total)
		probe := make([]*resourceapi.ResourceClaim, probes+warmup)
		if err := parallel(total+probes+warmup, 8, func(i int) error {
			if i < total {
				cl, err := createShareClaim(ctx, client, ns, fmt.Sprintf("s%d-held-%d", gpus, i), node, i%gpus)
				held[i] = cl
				return err
			}
			cl, err := createShareClaim(ctx, client, ns, fmt.Sprintf("s%d-probe-%d", gpus, i-total), node, 0)
			probe[i-total] = cl
			return err
		}); err != nil {
			return rows, fmt.Errorf("create share claims: %w", err)
		}

		if err := DropPageCache(o.PluginBin); err != nil {
			return rows, err
		}
		p, err := StartPlugin(ctx, c, o.PluginBin, node, dir, fleet, append(o.prismArgs(), "--consumable-capacity", "--v=4")...)
		if err != nil {
			return rows, err
		}
		rs, err := scaleLevels(ctx, client, p, held, probe, warmup, scaleBatch, gpus, o)
		_ = p.Stop(5 * time.Second)
		rows = append(rows, rs...)
		if err != nil {
			return rows, fmt.Errorf("%d GPUs (log %s): %w", gpus, p.LogPath, err)
		}
	}
	return rows, nil
}

func scaleLevels(ctx context.Context, client kubernetes.Interface, p *PluginProc, held, probe []*resourceapi.ResourceClaim, warmup, batch, gpus int, o PrepareOptions) ([]Row, error) {
	if _, err := p.WaitReady(ctx, time.Minute); err != nil {
		return nil, err
	}
	conn, err := grpc.NewClient("unix://"+p.Socket(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		return nil, err
	}
	defer conn.Close()
	dra := drapb.NewDRAPluginClient(conn)
	prepare := func(cls []*resourceapi.ResourceClaim) error { return prepareClaims(ctx, dra, cls) }
	time.Sleep(2 * time.Second)
	idle, err := RSSMiB(p.Pid())
	if err != nil {
		return nil, err
	}
	idleHeap, err := p.heapInUseMiB()
	if err != nil {
		return nil, err
	}
	ckpt := filepath.Join(p.Dir, "state", "checkpoint.json")
	var rows []Row
	prepared := 0
	for _, level := range []int{len(held) / 4, len(held) / 2, len(held)} {
		for prepared < level {
			n := min(batch, level-prepared)
			if err := prepare(held[prepared : prepared+n]); err != nil {
				return rows, err
			}
			prepared += n
		}
		before, err := ParseCallTimings(p.LogPath, "NodePrepareResources")
		if err != nil {
			return rows, err
		}
		var lat []time.Duration
		for i, cl := range probe {
			start := time.Now()
			if err := prepare([]*resourceapi.ResourceClaim{cl}); err != nil {
				return rows, err
			}
			d := time.Since(start)
			if _, err := dra.NodeUnprepareResources(ctx, &drapb.NodeUnprepareResourcesRequest{Claims: []*drapb.Claim{{Namespace: cl.Namespace, Name: cl.Name, Uid: string(cl.UID)}}}); err != nil {
				return rows, err
			}
			if i >= warmup {
				lat = append(lat, d)
			}
		}
		rss, err := RSSMiB(p.Pid())
		if err != nil {
			return rows, err
		}
		heap, err := p.heapInUseMiB()
		if err != nil {
			return rows, err
		}
		st, err := os.Stat(ckpt)
		if err != nil {
			return rows, err
		}
		// The log is flushed asynchronously; wait for the probes' lines.
		var calls []CallTiming
		for range 50 {
			if calls, err = ParseCallTimings(p.LogPath, "NodePrepareResources"); err != nil || len(calls) >= len(before)+len(probe) {
				break
			}
			time.Sleep(100 * time.Millisecond)
		}
		if len(calls) < len(before)+len(probe) {
			return rows, fmt.Errorf("%d prepare timings in %s, want %d", len(calls), p.LogPath, len(before)+len(probe))
		}
		var ck []time.Duration
		for _, call := range calls[len(before)+warmup : len(before)+len(probe)] {
			var sum time.Duration
			for stage, d := range call.Micros {
				if strings.HasPrefix(stage, "checkpoint-") {
					sum += d
				}
			}
			ck = append(ck, sum)
		}
		cse := fmt.Sprintf("%d GPUs, %d memory-share claims held (~%d per GPU), 1-share prepare+unprepare x%d, %s, -v=4", gpus, level, (level+gpus-1)/gpus, len(lat), o.clientSettings())
		rows = append(rows,
			NewRow("prepare at scale", cse, "NodePrepareResources", "ms", "p50", ms(Percentile(lat, 0.5)), "p99", ms(Percentile(lat, 0.99)), ""),
			NewRow("prepare at scale", cse, "checkpoint time per prepare", "µs", "p50", us(Percentile(ck, 0.5)), "p99", us(Percentile(ck, 0.99)), fmt.Sprintf("file %.0f KiB after the probes", float64(st.Size())/1024)),
			NewRow("prepare at scale", cse, "RSS (VmRSS)", "MiB", "idle, no claims", idle, "with the claims", rss, ""),
			NewRow("prepare at scale", cse, "Go heap in use", "MiB", "idle, no claims", idleHeap, "with the claims", heap, "go_memstats_heap_inuse_bytes"),
		)
	}
	return rows, nil
}

// prepareClaims prepares cls in one NodePrepareResources call, as the
// kubelet does for a pod's claims, and fails unless every claim got devices.
func prepareClaims(ctx context.Context, dra drapb.DRAPluginClient, cls []*resourceapi.ResourceClaim) error {
	resp, err := dra.NodePrepareResources(ctx, &drapb.NodePrepareResourcesRequest{Claims: claimRefs(cls)})
	if err != nil {
		return err
	}
	for _, cl := range cls {
		if r := resp.Claims[string(cl.UID)]; r == nil || r.Error != "" || len(r.Devices) == 0 {
			return fmt.Errorf("prepare %s: %+v", cl.Name, r)
		}
	}
	return nil
}

// unprepareClaims unprepares cls in one NodeUnprepareResources call.
func unprepareClaims(ctx context.Context, dra drapb.DRAPluginClient, cls []*resourceapi.ResourceClaim) error {
	resp, err := dra.NodeUnprepareResources(ctx, &drapb.NodeUnprepareResourcesRequest{Claims: claimRefs(cls)})
	if err != nil {
		return err
	}
	for _, cl := range cls {
		if r := resp.Claims[string(cl.UID)]; r == nil || r.Error != "" {
			return fmt.Errorf("unprepare %s: %+v", cl.Name, r)
		}
	}
	return nil
}

func claimRefs(cls []*resourceapi.ResourceClaim) []*drapb.Claim {
	out := make([]*drapb.Claim, 0, len(cls))
	for _, cl := range cls {
		out = append(out, &drapb.Claim{Namespace: cl.Namespace, Name: cl.Name, Uid: string(cl.UID)})
	}
	return out
}

// heapInUseMiB reads the Go heap in use from the plugin's metrics.
func (p *PluginProc) heapInUseMiB() (float64, error) { return heapInUseMiB(p.HTTPAddr) }

// heapInUseMiB reads the Go heap in use from the metrics that a Prism
// binary serves at addr (host:port).
func heapInUseMiB(addr string) (float64, error) {
	resp, err := http.Get("http://" + addr + "/metrics")
	if err != nil {
		return 0, err
	}
	defer resp.Body.Close()
	s := bufio.NewScanner(resp.Body)
	for s.Scan() {
		if v, ok := strings.CutPrefix(s.Text(), "go_memstats_heap_inuse_bytes "); ok {
			b, err := strconv.ParseFloat(v, 64)
			return b / (1 << 20), err
		}
	}
	return 0, fmt.Errorf("no go_memstats_heap_inuse_bytes at %s", addr)
}

// createShareClaim makes a claim allocated a 1Gi memory share of device
// gpu-<gpu> in node's pool.
func createShareClaim(ctx context.Context, client kubernetes.Interface, ns, name, node string, gpu int) (*resourceapi.ResourceClaim, error) {
	cl, err := client.ResourceV1().ResourceClaims(ns).Create(ctx, &resourceapi.ResourceClaim{
		ObjectMeta: metav1.ObjectMeta{Name: name},
		Spec:       *sim.GPUClaim(1),
	}, metav1.CreateOptions{})
	if err != nil {
		return nil, err
	}
	share := uuid.NewUUID()
	cl.Status.Allocation = &resourceapi.AllocationResult{
		Devices: resourceapi.DeviceAllocationResult{Results: []resourceapi.DeviceRequestAllocationResult{{
			Request: "gpu", Driver: gpuv1alpha1.DriverName, Pool: node, Device: fmt.Sprintf("gpu-%d", gpu),
			ShareID:          &share,
			ConsumedCapacity: map[resourceapi.QualifiedName]apiresource.Quantity{gpuv1alpha1.MemoryCapacity.Qualified(): apiresource.MustParse("1Gi")},
		}}},
		NodeSelector: &corev1.NodeSelector{NodeSelectorTerms: []corev1.NodeSelectorTerm{{
			MatchFields: []corev1.NodeSelectorRequirement{{Key: "metadata.name", Operator: corev1.NodeSelectorOpIn, Values: []string{node}}},
		}}},
	}
	return client.ResourceV1().ResourceClaims(ns).UpdateStatus(ctx, cl, metav1.UpdateOptions{})
}

// PrepareFloor measures the memory of Prism and of floorBin, a plugin that
// does nothing but run the same API client and kubelet plugin helper
// (cmd/prism-floor-plugin), in one loop: each alone on an 8-GPU node of
// its own, started from an evicted binary with the scale cases' flags,
// idle, then with claims memory-share claims prepared in calls of 20 and
// 100 sequential prepare+unprepare probes.
func PrepareFloor(ctx context.Context, c *testbed.Cluster, client kubernetes.Interface, o PrepareOptions, floorBin string, claims int) ([]Row, error) {
	const (
		ns     = "bench-floor"
		gpus   = 8
		probes = 100
		batch  = 20
	)
	if _, err := client.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}}, metav1.CreateOptions{}); err != nil {
		return nil, err
	}
	type footprint struct{ idle, loaded, loadedFile, loadedAnon float64 }
	measure := func(name, bin string) (footprint, error) {
		var f footprint
		node := "bench-floor-" + name
		if err := CreateReadyNode(ctx, client, node, nil); err != nil {
			return f, err
		}
		all := make([]*resourceapi.ResourceClaim, claims+probes)
		if err := parallel(len(all), 8, func(i int) error {
			cl, err := createShareClaim(ctx, client, ns, fmt.Sprintf("%s-%d", node, i), node, i%gpus)
			all[i] = cl
			return err
		}); err != nil {
			return f, fmt.Errorf("create share claims: %w", err)
		}
		if err := DropPageCache(bin); err != nil {
			return f, err
		}
		dir := filepath.Join(o.Dir, "floor-"+name)
		if err := os.MkdirAll(dir, 0o755); err != nil {
			return f, err
		}
		p, err := StartPlugin(ctx, c, bin, node, dir, o.Fleet, append(o.prismArgs(), "--consumable-capacity", "--v=4")...)
		if err != nil {
			return f, err
		}
		defer func() { _ = p.Stop(5 * time.Second) }()
		if _, err := p.WaitReady(ctx, time.Minute); err != nil {
			return f, err
		}
		time.Sleep(2 * time.Second)
		if f.idle, err = RSSMiB(p.Pid()); err != nil {
			return f, err
		}
		conn, err := grpc.NewClient("unix://"+p.Socket(), grpc.WithTransportCredentials(insecure.NewCredentials()))
		if err != nil {
			return f, err
		}
		defer conn.Close()
		dra := drapb.NewDRAPluginClient(conn)
		refs := func(cls []*resourceapi.ResourceClaim) []*drapb.Claim {
			var out []*drapb.Claim
			for _, cl := range cls {
				out = append(out, &drapb.Claim{Namespace: cl.Namespace, Name: cl.Name, Uid: string(cl.UID)})
			}
			return out
		}
		for i := 0; i < len(all); {
			n := batch
			if i >= claims {
				n = 1
			}
			n = min(n, len(all)-i)
			resp, err := dra.NodePrepareResources(ctx, &drapb.NodePrepareResourcesRequest{Claims: refs(all[i : i+n])})
			if err != nil {
				return f, fmt.Errorf("%s (log %s): %w", name, p.LogPath, err)
			}
			for _, cl := range all[i : i+n] {
				if r := resp.Claims[string(cl.UID)]; r == nil || r.Error != "" || len(r.Devices) == 0 {
					return f, fmt.Errorf("%s (log %s): prepare %s: %+v", name, p.LogPath, cl.Name, r)
				}
			}
			if i >= claims {
				if _, err := dra.NodeUnprepareResources(ctx, &drapb.NodeUnprepareResourcesRequest{Claims: refs(all[i : i+n])}); err != nil {
					return f, fmt.Errorf("%s (log %s): %w", name, p.LogPath, err)
				}
			}
			i += n
		}
		m, err := residency.ReadMemory(p.Pid())
		f.loaded, f.loadedFile, f.loadedAnon = mib(m.Total), mib(m.File), mib(m.Anon)
		return f, err
	}
	floor, err := measure("floor", floorBin)
	if err != nil {
		return nil, err
	}
	prism, err := measure("prism", o.PluginBin)
	if err != nil {
		return nil, err
	}
	cse := fmt.Sprintf("same loop: do-nothing plugin on the same client and helper vs Prism, %d GPUs, -v=4", gpus)
	split := func(f footprint) string { return fmt.Sprintf("file %.1f + anon %.1f", f.loadedFile, f.loadedAnon) }
	return []Row{
		NewRow("footprint", cse, "RSS idle (VmRSS)", "MiB", "floor", floor.idle, "Prism", prism.idle, ""),
		NewRow("footprint", cse, fmt.Sprintf("RSS with %d claims + %d probes (VmRSS)", claims, probes), "MiB", "floor", floor.loaded, "Prism", prism.loaded,
			"floor "+split(floor)+"; Prism "+split(prism)),
	}, nil
}
