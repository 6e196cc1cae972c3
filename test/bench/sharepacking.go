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
	"cmp"
	"context"
	"fmt"
	"math/rand/v2"
	"path/filepath"
	"slices"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	resourceapi "k8s.io/api/resource/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/util/sets"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/kubernetes"
	"k8s.io/klog/v2"
	"k8s.io/utils/ptr"

	gpuv1alpha1 "github.com/prismgpu/prism/api/gpu/v1alpha1"
	"github.com/prismgpu/prism/pkg/gpu"
	"github.com/prismgpu/prism/pkg/gpu/nvml"
	"github.com/prismgpu/prism/test/testbed"
)

// SharePackingOptions bound the share-packing phase.
type SharePackingOptions struct {
	// Fleet is the demo/fleets file of the one node each stream fills.
	Fleet string
	// Shares are the pods of each stream.
	Shares int
	// Seed picks the shares the churn stream deletes.
	Seed uint64
}

// shareSeries are the share sizes the phase streams: the demo's 20Gi, and
// a light share by memory alone and with compute, where compute is the
// scarcer of the two.
var shareSeries = []struct {
	name  string
	share gpuv1alpha1.Share
}{
	{"20Gi", gpuv1alpha1.Share{MemoryBytes: 20 << 30}},
	{"8Gi", gpuv1alpha1.Share{MemoryBytes: 8 << 30}},
	{"8Gi+20pct", gpuv1alpha1.Share{MemoryBytes: 8 << 30, ComputePercent: 20}},
}

// The streams of shares each series runs, on a node of its own.
const (
	streamSequential = "sequential" // each pod bound before the next is created
	streamPaced      = "paced"      // each pod created once the previous claim is allocated
	streamBurst      = "burst"      // every pod created at once
	streamChurn      = "churn"      // filled one by one, half deleted, as many added
)

var shareStreams = []string{streamSequential, streamPaced, streamBurst, streamChurn}

// SharePacking asks whether the real kube-scheduler packs GPU shares as
// tightly as best fit would, which `prismctl simulate` assumes. It
// publishes one node of shareable GPUs per series and stream, as the
// plugin with --consumable-capacity does, runs the test bed's
// kube-scheduler with its own profile, and counts the GPUs that hold a
// live share against the fewest that first-fit-decreasing needs for the
// same shares.
func SharePacking(ctx context.Context, c *testbed.Cluster, client kubernetes.Interface, o SharePackingOptions) ([]Row, error) {
	logger := klog.FromContext(ctx)
	nf, err := nvml.LoadFleet(o.Fleet)
	if err != nil {
		return nil, err
	}
	var nodes []string
	defer func() { removeShareNodes(context.WithoutCancel(ctx), client, nodes) }()
	gpus := map[string][]shareGPU{}
	for _, s := range shareSeries {
		for _, stream := range shareStreams {
			node := shareNode(s.name, stream)
			nodes = append(nodes, node)
			if gpus[node], err = publishShareNode(ctx, client, nf, node); err != nil {
				return nil, err
			}
		}
	}
	renewCtx, stopRenew := context.WithCancel(ctx)
	defer stopRenew()
	go renewLeases(renewCtx, client, nodes, 15*time.Second)

	// Started after the slices exist, so that its informers hold them when
	// the first pod comes.
	sched, err := startBenchScheduler(ctx, c)
	if err != nil {
		return nil, err
	}
	defer func() { _ = sched.Stop(10 * time.Second) }()
	ns := "bench-share-packing"
	if _, err := client.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}}, metav1.CreateOptions{}); err != nil {
		return nil, err
	}
	if err := waitForServiceAccount(ctx, client, ns); err != nil {
		return nil, err
	}

	var rows []Row
	for _, s := range shareSeries {
		cse := fmt.Sprintf("%d %s (%s), %d shares of %s", len(gpus[shareNode(s.name, streamSequential)]), nf.GPUs[0].Product, filepath.Base(o.Fleet), o.Shares, s.share)
		for _, stream := range shareStreams {
			node := shareNode(s.name, stream)
			st := &shareStream{client: client, ns: ns, node: node, kind: node, spec: shareSpec(s.share)}
			phases, err := st.run(ctx, stream, o.Shares, o.Seed)
			if err != nil {
				return rows, fmt.Errorf("%s, %s: %w", s.name, stream, err)
			}
			for _, p := range phases {
				row, err := packingRow(cse, p, gpus[node])
				if err != nil {
					return rows, fmt.Errorf("%s, %s: %w", s.name, stream, err)
				}
				logger.Info("Share packing", "series", s.name, "stream", p.name, "gpus", row.B, "bestFit", row.A, "note", row.Note)
				rows = append(rows, row)
			}
			if err := release(ctx, client, ns, node); err != nil {
				return rows, err
			}
		}
	}
	return rows, nil
}

// shareNode names the node of a series' stream; it is also the label of
// the stream's pods and claims.
func shareNode(series, stream string) string {
	return strings.ToLower("share-" + strings.ReplaceAll(series, "+", "-") + "-" + stream)
}

// shareSpec asks for one share of a GPU of the class gpu.prism.dev, with
// the amounts s names as capacity requests.
func shareSpec(s gpuv1alpha1.Share) *resourceapi.ResourceClaimSpec {
	requests := map[resourceapi.QualifiedName]resource.Quantity{}
	if s.LimitsMemory() {
		requests[gpuv1alpha1.MemoryCapacity.Qualified()] = s.Memory()
	}
	if s.ComputePercent > 0 {
		requests[gpuv1alpha1.ComputeCapacity.Qualified()] = *resource.NewQuantity(int64(s.ComputePercent), resource.DecimalSI)
	}
	return &resourceapi.ResourceClaimSpec{Devices: resourceapi.DeviceClaim{Requests: []resourceapi.DeviceRequest{{
		Name: "gpu",
		Exactly: &resourceapi.ExactDeviceRequest{
			DeviceClassName: gpuv1alpha1.DriverName,
			Capacity:        &resourceapi.CapacityRequirements{Requests: requests},
		},
	}}}}
}

// shareGPU is a published GPU and what it holds of each capacity.
type shareGPU struct {
	name     string
	capacity gpuv1alpha1.Share
}

// publishShareNode creates a ready node with the ResourceSlices the kubelet
// plugin would publish for the fleet with --consumable-capacity, and
// returns its GPUs in slice order, the order the allocator tries them in.
func publishShareNode(ctx context.Context, client kubernetes.Interface, nf *nvml.Fleet, node string) ([]shareGPU, error) {
	fake, err := nvml.NewSimulated(nf, node)
	if err != nil {
		return nil, err
	}
	devices, err := nvml.Discover(ctx, fake, nvml.Options{})
	if err != nil {
		return nil, err
	}
	layout, err := gpu.ResourceSlices(ctx, devices, gpu.PublishOptions{ShareMemory: true})
	if err != nil {
		return nil, err
	}
	if err := CreateReadyNode(ctx, client, node, nil); err != nil {
		return nil, err
	}
	content := make([]*resourceapi.ResourceSlice, len(layout))
	var gpus []shareGPU
	for i, s := range layout {
		content[i] = &resourceapi.ResourceSlice{Spec: resourceapi.ResourceSliceSpec{Devices: s.Devices}}
		for _, d := range s.Devices {
			gpus = append(gpus, shareGPU{name: d.Name, capacity: gpuv1alpha1.ConsumedShare(capacityValues(d.Capacity))})
		}
	}
	for _, s := range poolOf(node, content) {
		if _, err := client.ResourceV1().ResourceSlices().Create(ctx, s, metav1.CreateOptions{}); err != nil {
			return nil, fmt.Errorf("publish slices of %s: %w", node, err)
		}
	}
	return gpus, nil
}

func capacityValues(c map[resourceapi.QualifiedName]resourceapi.DeviceCapacity) map[resourceapi.QualifiedName]resource.Quantity {
	out := make(map[resourceapi.QualifiedName]resource.Quantity, len(c))
	for name, dc := range c {
		out[name] = dc.Value
	}
	return out
}

// removeShareNodes deletes the phase's slices, nodes and leases, so that no
// later phase's pod lands there.
func removeShareNodes(ctx context.Context, client kubernetes.Interface, nodes []string) {
	logger := klog.FromContext(ctx)
	for _, node := range nodes {
		sel := metav1.ListOptions{FieldSelector: resourceapi.ResourceSliceSelectorNodeName + "=" + node}
		if err := client.ResourceV1().ResourceSlices().DeleteCollection(ctx, metav1.DeleteOptions{}, sel); err != nil {
			logger.Error(err, "Deleting slices", "node", node)
		}
		if err := client.CoreV1().Nodes().Delete(ctx, node, metav1.DeleteOptions{}); err != nil && !apierrors.IsNotFound(err) {
			logger.Error(err, "Deleting node", "node", node)
		}
		if err := client.CoordinationV1().Leases(corev1.NamespaceNodeLease).Delete(ctx, node, metav1.DeleteOptions{}); err != nil && !apierrors.IsNotFound(err) {
			logger.Error(err, "Deleting lease", "node", node)
		}
	}
}

// shareStream places shares on one node, each a claim and a pod of that
// name labelled with kind.
type shareStream struct {
	client   kubernetes.Interface
	ns, node string
	kind     string
	spec     *resourceapi.ResourceClaimSpec
	next     int // suffix of the next share's name
}

// packingPhase is where a stream's shares lie at one point: the devices
// in the order the scheduler bound the pods, and the live shares.
type packingPhase struct {
	name  string
	order []string
	live  []placedShare
}

// placedShare is a live share as the scheduler allocated it.
type placedShare struct {
	device string
	share  gpuv1alpha1.Share
}

// run places n shares as stream says and measures where they lie.
func (st *shareStream) run(ctx context.Context, stream string, n int, seed uint64) ([]packingPhase, error) {
	var order []string
	var err error
	switch stream {
	case streamSequential:
		order, err = st.placeOneByOne(ctx, st.names(n))
	case streamPaced:
		order, err = st.placePaced(ctx, st.names(n))
	case streamBurst:
		order, err = st.place(ctx, st.names(n), 8)
	case streamChurn:
		return st.churn(ctx, n, seed)
	default:
		return nil, fmt.Errorf("unknown stream %q", stream)
	}
	if err != nil {
		return nil, err
	}
	p, err := st.measure(ctx, stream, order)
	return []packingPhase{p}, err
}

// churn fills the node one share at a time, deletes a seeded random half
// and adds as many again, one at a time: it measures after each step.
func (st *shareStream) churn(ctx context.Context, n int, seed uint64) ([]packingPhase, error) {
	names := st.names(n)
	order, err := st.placeOneByOne(ctx, names)
	if err != nil {
		return nil, err
	}
	filled, err := st.measure(ctx, "churn: filled one by one", order)
	if err != nil {
		return nil, err
	}
	r := rand.New(rand.NewPCG(seed, 0))
	gone := make([]string, 0, n/2)
	for _, i := range r.Perm(n)[:n/2] {
		gone = append(gone, names[i])
	}
	if err := st.remove(ctx, gone); err != nil {
		return nil, err
	}
	halved, err := st.measure(ctx, fmt.Sprintf("churn: %d deleted (seed %d)", len(gone), seed), nil)
	if err != nil {
		return nil, err
	}
	order, err = st.placeOneByOne(ctx, st.names(len(gone)))
	if err != nil {
		return nil, err
	}
	refilled, err := st.measure(ctx, fmt.Sprintf("churn: %d added again", len(gone)), order)
	if err != nil {
		return nil, err
	}
	return []packingPhase{filled, halved, refilled}, nil
}

// names are the next n shares' names.
func (st *shareStream) names(n int) []string {
	out := make([]string, n)
	for i := range out {
		out[i] = fmt.Sprintf("%s-%d", st.kind, st.next)
		st.next++
	}
	return out
}

// measure reads where the stream's live shares lie once order was placed.
func (st *shareStream) measure(ctx context.Context, name string, order []string) (packingPhase, error) {
	live, err := st.allocations(ctx)
	return packingPhase{name: name, order: order, live: live}, err
}

// placeOneByOne places the shares one at a time, each bound before the
// next is created.
func (st *shareStream) placeOneByOne(ctx context.Context, names []string) ([]string, error) {
	var order []string
	for _, name := range names {
		devices, err := st.place(ctx, []string{name}, 1)
		if err != nil {
			return nil, err
		}
		order = append(order, devices...)
	}
	return order, nil
}

// place creates the claims, then the pods, workers at a time, waits until
// every pod is bound and returns the device of each share in the order
// the scheduler bound their pods.
func (st *shareStream) place(ctx context.Context, names []string, workers int) ([]string, error) {
	if err := st.createClaims(ctx, names, workers); err != nil {
		return nil, err
	}
	w, err := st.client.CoreV1().Pods(st.ns).Watch(ctx, metav1.ListOptions{LabelSelector: "bench=" + st.kind})
	if err != nil {
		return nil, err
	}
	defer w.Stop()
	if err := st.createPods(ctx, names, workers); err != nil {
		return nil, err
	}
	bound, err := waitFor(w, names, podBound)
	if err != nil {
		return nil, err
	}
	return st.devices(ctx, bound)
}

// placePaced creates each share as soon as the scheduler has written the
// previous one's allocation, before it has bound that pod: the scheduler
// then still holds the previous allocation in flight while its claim
// informer may already have it too.
func (st *shareStream) placePaced(ctx context.Context, names []string) ([]string, error) {
	sel := metav1.ListOptions{LabelSelector: "bench=" + st.kind}
	pods, err := st.client.CoreV1().Pods(st.ns).Watch(ctx, sel)
	if err != nil {
		return nil, err
	}
	defer pods.Stop()
	claims, err := st.client.ResourceV1().ResourceClaims(st.ns).Watch(ctx, sel)
	if err != nil {
		return nil, err
	}
	defer claims.Stop()
	for _, name := range names {
		if err := st.createClaims(ctx, []string{name}, 1); err != nil {
			return nil, err
		}
		if err := st.createPods(ctx, []string{name}, 1); err != nil {
			return nil, err
		}
		if _, err := waitFor(claims, []string{name}, claimAllocated); err != nil {
			return nil, err
		}
	}
	if _, err := waitFor(pods, names, podBound); err != nil {
		return nil, err
	}
	return st.devices(ctx, names)
}

func (st *shareStream) createClaims(ctx context.Context, names []string, workers int) error {
	if err := parallel(len(names), workers, func(i int) error {
		_, err := st.client.ResourceV1().ResourceClaims(st.ns).Create(ctx, &resourceapi.ResourceClaim{
			ObjectMeta: metav1.ObjectMeta{Name: names[i], Labels: map[string]string{"bench": st.kind}},
			Spec:       *st.spec,
		}, metav1.CreateOptions{})
		return err
	}); err != nil {
		return fmt.Errorf("create claims: %w", err)
	}
	return nil
}

// createPods creates the shares' pods, held to the stream's node.
func (st *shareStream) createPods(ctx context.Context, names []string, workers int) error {
	if err := parallel(len(names), workers, func(i int) error {
		pod := benchPod(names[i], st.kind)
		pod.Spec.NodeSelector = map[string]string{"kubernetes.io/hostname": st.node}
		_, err := st.client.CoreV1().Pods(st.ns).Create(ctx, pod, metav1.CreateOptions{})
		return err
	}); err != nil {
		return fmt.Errorf("create pods: %w", err)
	}
	return nil
}

func podBound(obj runtime.Object) (string, bool) {
	pod, ok := obj.(*corev1.Pod)
	if !ok {
		return "", false
	}
	return pod.Name, pod.Spec.NodeName != ""
}

func claimAllocated(obj runtime.Object) (string, bool) {
	claim, ok := obj.(*resourceapi.ResourceClaim)
	if !ok {
		return "", false
	}
	return claim.Name, claim.Status.Allocation != nil
}

// waitFor reads w until done holds for every one of names and returns them
// in the order it came to hold.
func waitFor(w watch.Interface, names []string, done func(runtime.Object) (string, bool)) ([]string, error) {
	waiting := sets.New(names...)
	var order []string
	timeout := time.After(2 * time.Minute)
	for waiting.Len() > 0 {
		select {
		case ev, ok := <-w.ResultChan():
			if !ok {
				return nil, fmt.Errorf("watch closed while waiting for %d of %d", waiting.Len(), len(names))
			}
			name, isDone := done(ev.Object)
			if ev.Type == watch.Deleted || !isDone || !waiting.Has(name) {
				continue
			}
			waiting.Delete(name)
			order = append(order, name)
		case <-timeout:
			return nil, fmt.Errorf("%d of %d not done after 2m: %v", waiting.Len(), len(names), sets.List(waiting))
		}
	}
	return order, nil
}

// devices are the devices the named shares were allocated, in order.
func (st *shareStream) devices(ctx context.Context, names []string) ([]string, error) {
	out := make([]string, len(names))
	for i, name := range names {
		claim, err := st.client.ResourceV1().ResourceClaims(st.ns).Get(ctx, name, metav1.GetOptions{})
		if err != nil {
			return nil, err
		}
		p, err := placed(claim)
		if err != nil {
			return nil, err
		}
		out[i] = p.device
	}
	return out, nil
}

// allocations are the stream's live shares.
func (st *shareStream) allocations(ctx context.Context) ([]placedShare, error) {
	claims, err := st.client.ResourceV1().ResourceClaims(st.ns).List(ctx, metav1.ListOptions{LabelSelector: "bench=" + st.kind})
	if err != nil {
		return nil, err
	}
	var out []placedShare
	for i := range claims.Items {
		p, err := placed(&claims.Items[i])
		if err != nil {
			return nil, err
		}
		out = append(out, p)
	}
	return out, nil
}

// placed reads the one device a share's claim was allocated and what it
// consumes there.
func placed(claim *resourceapi.ResourceClaim) (placedShare, error) {
	if claim.Status.Allocation == nil || len(claim.Status.Allocation.Devices.Results) != 1 {
		return placedShare{}, fmt.Errorf("claim %s: want one allocated device, got allocation %v", claim.Name, claim.Status.Allocation)
	}
	r := claim.Status.Allocation.Devices.Results[0]
	return placedShare{device: r.Device, share: gpuv1alpha1.ConsumedShare(r.ConsumedCapacity)}, nil
}

// remove deletes the shares' pods and claims and waits until the claims are
// gone, that is, deallocated.
func (st *shareStream) remove(ctx context.Context, names []string) error {
	for _, name := range names {
		if err := st.client.CoreV1().Pods(st.ns).Delete(ctx, name, metav1.DeleteOptions{GracePeriodSeconds: ptr.To[int64](0)}); err != nil {
			return fmt.Errorf("delete pod %s: %w", name, err)
		}
		if err := st.client.ResourceV1().ResourceClaims(st.ns).Delete(ctx, name, metav1.DeleteOptions{}); err != nil {
			return fmt.Errorf("delete claim %s: %w", name, err)
		}
	}
	return wait.PollUntilContextTimeout(ctx, 200*time.Millisecond, 2*time.Minute, true, func(ctx context.Context) (bool, error) {
		for _, name := range names {
			_, err := st.client.ResourceV1().ResourceClaims(st.ns).Get(ctx, name, metav1.GetOptions{})
			if !apierrors.IsNotFound(err) {
				return false, nil
			}
		}
		return true, nil
	})
}

// packingRow compares the GPUs that hold a live share with the fewest that
// first-fit-decreasing needs for the same shares on the node's GPUs.
func packingRow(cse string, p packingPhase, gpus []shareGPU) (Row, error) {
	shares := make([]gpuv1alpha1.Share, len(p.live))
	for i, s := range p.live {
		shares[i] = s.share
	}
	capacities := make([]gpuv1alpha1.Share, len(gpus))
	for i, g := range gpus {
		capacities[i] = g.capacity
	}
	best, ok := bestFitGPUs(shares, capacities)
	if !ok {
		return Row{}, fmt.Errorf("%d live shares do not fit the node's %d GPUs, yet the scheduler placed them", len(shares), len(gpus))
	}
	held := heldPerGPU(p.live)
	var over []string
	for _, g := range gpus {
		if h, ok := held[g.name]; ok && !fits(h, g.capacity) {
			over = append(over, fmt.Sprintf("%s holds %s of %s", g.name, h, g.capacity))
		}
	}
	note := fmt.Sprintf("%d live; held per GPU: %s", len(p.live), heldSummary(held, gpus))
	if p.order != nil {
		note += "; bound in order: " + runs(p.order)
	}
	if len(over) > 0 {
		note += "; OVER CAPACITY: " + strings.Join(over, ", ")
	}
	return NewRow("share-packing", cse, "GPUs holding a share, "+p.name, "GPUs",
		"best fit (FFD)", float64(best), "kube-scheduler", float64(len(held)), note), nil
}

// bestFitGPUs is how many GPUs first-fit-decreasing fills with shares:
// each share, largest memory first, goes to the first GPU (in the order
// of capacities) that still has room for it in every capacity. For shares
// of one size that is the fewest GPUs that can hold them. It says false
// when some share fits nowhere.
func bestFitGPUs(shares, capacities []gpuv1alpha1.Share) (int, bool) {
	sorted := slices.Clone(shares)
	slices.SortStableFunc(sorted, func(a, b gpuv1alpha1.Share) int {
		return cmp.Or(cmp.Compare(b.MemoryBytes, a.MemoryBytes), cmp.Compare(b.ComputePercent, a.ComputePercent))
	})
	held := make([]gpuv1alpha1.Share, len(capacities))
	used := 0
	for _, s := range sorted {
		i := -1
		for j := range capacities {
			if fits(add(held[j], s), capacities[j]) {
				i = j
				break
			}
		}
		if i < 0 {
			return 0, false
		}
		if held[i] == (gpuv1alpha1.Share{}) {
			used++
		}
		held[i] = add(held[i], s)
	}
	return used, true
}

func add(a, b gpuv1alpha1.Share) gpuv1alpha1.Share {
	return gpuv1alpha1.Share{MemoryBytes: a.MemoryBytes + b.MemoryBytes, ComputePercent: a.ComputePercent + b.ComputePercent}
}

// fits says whether held is within capacity in both amounts.
func fits(held, capacity gpuv1alpha1.Share) bool {
	return held.MemoryBytes <= capacity.MemoryBytes && held.ComputePercent <= capacity.ComputePercent
}

// heldPerGPU sums the live shares per device.
func heldPerGPU(live []placedShare) map[string]gpuv1alpha1.Share {
	out := map[string]gpuv1alpha1.Share{}
	for _, p := range live {
		out[p.device] = add(out[p.device], p.share)
	}
	return out
}

// heldSummary is "gpu-0 72Gi, gpu-1 40Gi" in slice order, with compute
// where the shares hold some.
func heldSummary(held map[string]gpuv1alpha1.Share, gpus []shareGPU) string {
	var parts []string
	for _, g := range gpus {
		if h, ok := held[g.name]; ok {
			parts = append(parts, g.name+" "+h.String())
		}
	}
	return strings.Join(parts, ", ")
}

// runs writes a sequence of devices as runs: "gpu-0 x3, gpu-1 x2, gpu-0 x1".
func runs(order []string) string {
	var parts []string
	for i := 0; i < len(order); {
		j := i
		for j < len(order) && order[j] == order[i] {
			j++
		}
		parts = append(parts, fmt.Sprintf("%s x%d", order[i], j-i))
		i = j
	}
	return strings.Join(parts, ", ")
}
