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
	"maps"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	coordinationv1 "k8s.io/api/coordination/v1"
	corev1 "k8s.io/api/core/v1"
	resourceapi "k8s.io/api/resource/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/util/retry"
	"k8s.io/klog/v2"
	"k8s.io/utils/ptr"

	"github.com/prismgpu/prism/internal/controller/nodelabels"
	"github.com/prismgpu/prism/internal/sim"
	"github.com/prismgpu/prism/pkg/rewrite"
	"github.com/prismgpu/prism/test/testbed"
)

// parallel runs fn(i) for i in [0, n) on workers goroutines and returns the
// first error.
func parallel(n, workers int, fn func(i int) error) error {
	var next atomic.Int64
	var firstErr error
	var once sync.Once
	var wg sync.WaitGroup
	for range workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for {
				i := int(next.Add(1)) - 1
				if i >= n {
					return
				}
				if err := fn(i); err != nil {
					once.Do(func() { firstErr = err })
					return
				}
			}
		}()
	}
	wg.Wait()
	return firstErr
}

// CreateReadyNode creates a Node by hand, with extraLabels, a Ready condition, capacity
// for 110 pods and a Lease, so that neither the scheduler nor the
// node-lifecycle controller keeps pods off it. The apiserver must run with
// TaintNodesByCondition disabled, or the node starts tainted not-ready.
func CreateReadyNode(ctx context.Context, client kubernetes.Interface, name string, extraLabels map[string]string) error {
	labels := map[string]string{"kubernetes.io/hostname": name, "prism.dev/bench": "true"}
	maps.Copy(labels, extraLabels)
	node, err := client.CoreV1().Nodes().Create(ctx, &corev1.Node{
		ObjectMeta: metav1.ObjectMeta{Name: name, Labels: labels},
	}, metav1.CreateOptions{})
	if err != nil {
		return fmt.Errorf("create node %s: %w", name, err)
	}
	now := metav1.Now()
	res := corev1.ResourceList{
		corev1.ResourceCPU:    resource.MustParse("64"),
		corev1.ResourceMemory: resource.MustParse("512Gi"),
		corev1.ResourcePods:   resource.MustParse("110"),
	}
	// Controllers touch a new node at once (labels, pod CIDR): retry.
	err = retry.RetryOnConflict(retry.DefaultRetry, func() error {
		node.Status = corev1.NodeStatus{
			Capacity: res, Allocatable: res,
			Conditions: []corev1.NodeCondition{{
				Type: corev1.NodeReady, Status: corev1.ConditionTrue, Reason: "KubeletReady",
				LastHeartbeatTime: now, LastTransitionTime: now,
			}},
			Addresses: []corev1.NodeAddress{{Type: corev1.NodeHostName, Address: name}},
		}
		_, err := client.CoreV1().Nodes().UpdateStatus(ctx, node, metav1.UpdateOptions{})
		if apierrors.IsConflict(err) {
			if n, gerr := client.CoreV1().Nodes().Get(ctx, name, metav1.GetOptions{}); gerr == nil {
				node = n
			}
		}
		return err
	})
	if err != nil {
		return fmt.Errorf("set status of node %s: %w", name, err)
	}
	_, err = client.CoordinationV1().Leases(corev1.NamespaceNodeLease).Create(ctx, &coordinationv1.Lease{
		ObjectMeta: metav1.ObjectMeta{Name: name},
		Spec: coordinationv1.LeaseSpec{
			HolderIdentity: ptr.To(name), LeaseDurationSeconds: ptr.To[int32](40), RenewTime: &metav1.MicroTime{Time: time.Now()},
		},
	}, metav1.CreateOptions{})
	if err != nil {
		return fmt.Errorf("create lease of node %s: %w", name, err)
	}
	return nil
}

// renewLeases keeps the hand-made nodes' leases fresh, as kubelets would,
// so that the node-lifecycle controller does not taint them unreachable.
func renewLeases(ctx context.Context, client kubernetes.Interface, names []string, every time.Duration) {
	wait.UntilWithContext(ctx, func(context.Context) {
		_ = parallel(len(names), 4, func(i int) error {
			l, err := client.CoordinationV1().Leases(corev1.NamespaceNodeLease).Get(ctx, names[i], metav1.GetOptions{})
			if err != nil {
				return nil
			}
			l.Spec.RenewTime = &metav1.MicroTime{Time: time.Now()}
			_, _ = client.CoordinationV1().Leases(corev1.NamespaceNodeLease).Update(ctx, l, metav1.UpdateOptions{})
			return nil
		})
	}, every)
}

// SchedulingOptions bound the scheduling phase.
type SchedulingOptions struct {
	Nodes, Pods, Warmup int
	Profile             string // name of one of Profiles for the rewritten claims
	// FiguresAsCapacity publishes the slices as a plugin with
	// --figures-as-capacity does (the chart's, ShippedFiguresAsCapacity),
	// for every kind, and adds the ladder in ShippedForm, with its tier
	// bounds as capacity requests, which needs them. Off, the phase
	// measures the CEL form alone, on slices without figure capacities.
	FiguresAsCapacity bool
}

const benchScheduler = "prism-bench-scheduler"

// The scheduling phase's ladders that the summary reads, each compared with
// "plain" on the same slices.
const (
	// schedShippedLadder is the ladder in ShippedForm (with
	// FiguresAsCapacity only): what the controller writes by default.
	schedShippedLadder = "ladder-bounds"
	// schedCELLadder is the ladder in the CEL form (--memory-floor=cel).
	schedCELLadder = "ladder"
)

// Scheduling publishes Nodes and ResourceSlices for a mixed fleet directly,
// runs the test bed's kube-scheduler with its own profile name and a client
// QPS that does not throttle, and measures how fast it binds pods whose
// claims are plain or rewritten.
func Scheduling(ctx context.Context, c *testbed.Cluster, client kubernetes.Interface, o SchedulingOptions) ([]Row, error) {
	logger := klog.FromContext(ctx)
	newFleet := NewMixedFleet
	if o.FiguresAsCapacity {
		newFleet = NewMixedFleetWithFigureCapacities
	}
	f, err := newFleet(ctx, "sched-", o.Nodes, 8)
	if err != nil {
		return nil, err
	}
	start := time.Now()
	names := make([]string, len(f.Nodes))
	nodeModels := map[string][]string{}
	modelOf := map[string]string{}
	for i, n := range f.Nodes {
		names[i] = n.Name
		nodeModels[n.Name] = []string{f.Model[i]}
		modelOf[n.Name] = f.Model[i]
	}
	// The labels prism-controller's labeller would give these nodes.
	fleet := f.Published()
	labels := nodelabels.Desired(nodeModels, fleet)
	if err := parallel(len(f.Nodes), 16, func(i int) error {
		if err := CreateReadyNode(ctx, client, names[i], labels[names[i]]); err != nil {
			return err
		}
		_, err := client.ResourceV1().ResourceSlices().Create(ctx, f.Slices[i], metav1.CreateOptions{})
		return err
	}); err != nil {
		return nil, err
	}
	renewCtx, stopRenew := context.WithCancel(ctx)
	defer stopRenew()
	go renewLeases(renewCtx, client, names, 15*time.Second)
	logger.Info("Published nodes and slices", "nodes", len(names), "elapsed", time.Since(start).Round(time.Millisecond))

	sched, err := startBenchScheduler(ctx, c)
	if err != nil {
		return nil, err
	}
	defer func() { _ = sched.Stop(10 * time.Second) }()

	var profile *rewrite.Profile
	for _, p := range Profiles {
		if p.Name == o.Profile {
			profile = &p.Profile
		}
	}
	if profile == nil {
		return nil, fmt.Errorf("unknown profile %q", o.Profile)
	}
	// What the webhook writes: the ladder cut from the published fleet.
	published := rewrite.WithFleet(fleet)
	ladder, err := RewrittenSpec(ctx, 1, *profile, published)
	if err != nil {
		return nil, err
	}
	capacity, err := RewrittenSpec(ctx, 1, *profile, published, rewrite.MemoryFloorAsCapacity())
	if err != nil {
		return nil, err
	}
	// The affinity design: hard needs in the claim, the pod webhook's
	// preferred node affinity on the pod.
	affinitySpec, err := RewrittenSpec(ctx, 1, *profile, published, rewrite.WithPreference(rewrite.PreferAffinity))
	if err != nil {
		return nil, err
	}
	affinityCapacity, err := RewrittenSpec(ctx, 1, *profile, published, rewrite.WithPreference(rewrite.PreferAffinity), rewrite.MemoryFloorAsCapacity())
	if err != nil {
		return nil, err
	}
	decision, err := rewrite.NodePreference(*profile, published, rewrite.WithPreference(rewrite.PreferAffinity))
	if err != nil {
		return nil, err
	}
	if decision.Mode != rewrite.PreferAffinity {
		return nil, fmt.Errorf("the bench fleet should get the affinity design: %s", decision.Reason)
	}
	preferred := &corev1.Affinity{NodeAffinity: &corev1.NodeAffinity{PreferredDuringSchedulingIgnoredDuringExecution: decision.PreferredTerms()}}
	// The hand-written selective claim is the fair reference: it expresses
	// a preference too, and fits fewer nodes, so the scheduler cannot stop
	// at its quota of feasible nodes as early as for the others.
	type kind struct {
		name     string
		spec     *resourceapi.ResourceClaimSpec
		affinity *corev1.Affinity
	}
	kinds := []kind{
		{"plain", sim.GPUClaim(1), nil},
		{"selective", SelectiveSpec(1), nil},
		{schedCELLadder, ladder, nil},
		{"ladder-capacity", capacity, nil},
		{"affinity", affinitySpec, preferred},
		{"affinity-capacity", affinityCapacity, preferred},
	}
	if o.FiguresAsCapacity {
		bounds, err := RewrittenSpec(ctx, 1, *profile, published, rewrite.MemoryFloorAsCapacity(), rewrite.TierBoundsAsCapacity())
		if err != nil {
			return nil, err
		}
		kinds = append(kinds, kind{schedShippedLadder, bounds, nil})
	}
	// With a memory floor some models cannot hold the workload: the pod
	// webhook's required term keeps the pod off their nodes before the
	// allocator runs there.
	if exclude := decision.ExcludedNodes(); exclude != nil {
		excluding := preferred.DeepCopy()
		excluding.NodeAffinity.RequiredDuringSchedulingIgnoredDuringExecution = &corev1.NodeSelector{
			NodeSelectorTerms: []corev1.NodeSelectorTerm{{MatchExpressions: []corev1.NodeSelectorRequirement{*exclude}}}}
		kinds = append(kinds, kind{"affinity-exclude", affinitySpec, excluding})
		if o.FiguresAsCapacity {
			// What the controller writes by default: the hard needs as
			// capacity requests where they can be.
			affinityForms, err := RewrittenSpec(ctx, 1, *profile, published, rewrite.WithPreference(rewrite.PreferAffinity), rewrite.MemoryFloorAsCapacity(), rewrite.TierBoundsAsCapacity())
			if err != nil {
				return nil, err
			}
			kinds = append(kinds, kind{"affinity-exclude-capacity", affinityForms, excluding})
		}
	}
	// Where the pods land: on the models of the first preferred tier.
	top := map[string]bool{}
	for _, m := range decision.Terms[0].Models {
		top[m] = true
	}
	ns := "bench-sched"
	if _, err := client.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}}, metav1.CreateOptions{}); err != nil {
		return nil, err
	}
	if err := waitForServiceAccount(ctx, client, ns); err != nil {
		return nil, err
	}
	// Warm up: the scheduler's informers, its CEL caches, every claim shape.
	for _, k := range kinds {
		if _, err := schedulePods(ctx, client, ns, "warm-"+k.name, k.spec, k.affinity, o.Warmup); err != nil {
			return nil, fmt.Errorf("warm-up: %w", err)
		}
	}
	// Alternate batches of each kind so that drift on the shared machine
	// hits all of them. Each batch is released before the next, so every
	// one meets an empty fleet.
	results := make([][]schedResult, len(kinds)) // kind, batch
	batches := 2
	per := o.Pods / batches
	for b := range batches {
		for i, k := range kinds {
			r, err := schedulePods(ctx, client, ns, fmt.Sprintf("%s-%d", k.name, b), k.spec, k.affinity, per)
			if err != nil {
				return nil, err
			}
			results[i] = append(results[i], r)
		}
	}
	tainted := 0
	nodes, err := client.CoreV1().Nodes().List(ctx, metav1.ListOptions{LabelSelector: "prism.dev/bench=true"})
	if err == nil {
		for _, n := range nodes.Items {
			if len(n.Spec.Taints) > 0 {
				tainted++
			}
		}
	}
	sums := make([]schedResult, len(kinds))
	walls := make([]string, len(kinds))
	onTop := make([]string, len(kinds))
	for i := range kinds {
		sums[i] = sumSched(results[i])
		walls[i] = fmt.Sprintf("%s %s", kinds[i].name, sums[i].wall.Round(time.Millisecond))
		n := 0
		perModel := map[string]int{}
		for _, node := range sums[i].nodes {
			if top[modelOf[node]] {
				n++
			}
			perModel[modelOf[node]]++
		}
		onTop[i] = fmt.Sprintf("%s %d/%d %v", kinds[i].name, n, len(sums[i].nodes), perModel)
	}
	cse := fmt.Sprintf("%d nodes x 8 GPUs, %s", o.Nodes, o.Profile)
	note := fmt.Sprintf("%d pods each in %d alternating batches; wall %s; %d nodes tainted at end",
		sums[0].pods, batches, strings.Join(walls, ", "), tainted)
	var rows []Row
	compare := func(a, b int, note string) {
		pa, pb := sums[a], sums[b]
		an, bn := kinds[a].name, kinds[b].name
		rows = append(rows,
			NewRow("scheduling", cse, "pods bound per second", "pods/s", an, pa.rate(), bn, pb.rate(), note),
			NewRow("scheduling", cse, "create-to-bound p50", "ms", an, ms(Percentile(pa.latencies, 0.5)), bn, ms(Percentile(pb.latencies, 0.5)), ""),
			NewRow("scheduling", cse, "create-to-bound p99", "ms", an, ms(Percentile(pa.latencies, 0.99)), bn, ms(Percentile(pb.latencies, 0.99)), ""))
	}
	for i := 1; i < len(kinds); i++ {
		compare(0, i, note)
		note = ""
	}
	compare(1, 2, "the fair reference: "+SelectiveSelector+" written by hand")
	compare(1, 3, "")
	for i, k := range kinds {
		if k.name == schedShippedLadder {
			compare(1, i, "")
		}
	}
	compare(2, 4, fmt.Sprintf("affinity: hard needs in the claim, %s on the pod; pods on the first tier's models (%s): %s",
		decision.TermsSummary(), strings.Join(decision.Terms[0].Models, ", "), strings.Join(onTop, ", ")))
	return rows, nil
}

type schedResult struct {
	pods      int
	wall      time.Duration // first pod created to last pod bound
	latencies []time.Duration
	nodes     []string // where each pod was bound
}

func (s schedResult) rate() float64 { return float64(s.pods) / s.wall.Seconds() }

func sumSched(rs []schedResult) schedResult {
	var out schedResult
	for _, r := range rs {
		out.pods += r.pods
		out.wall += r.wall
		out.latencies = append(out.latencies, r.latencies...)
		out.nodes = append(out.nodes, r.nodes...)
	}
	return out
}

func waitForServiceAccount(ctx context.Context, client kubernetes.Interface, ns string) error {
	deadline := time.Now().Add(time.Minute)
	for time.Now().Before(deadline) {
		if _, err := client.CoreV1().ServiceAccounts(ns).Get(ctx, "default", metav1.GetOptions{}); err == nil {
			return nil
		}
		time.Sleep(100 * time.Millisecond)
	}
	return fmt.Errorf("no default ServiceAccount in %s", ns)
}

// schedulePods creates n claims with spec, then n pods using them, and
// waits until every pod has a node. Claims are created first so that only
// pod creation overlaps with scheduling.
func schedulePods(ctx context.Context, client kubernetes.Interface, ns, kind string, spec *resourceapi.ResourceClaimSpec, affinity *corev1.Affinity, n int) (schedResult, error) {
	if err := parallel(n, 8, func(i int) error {
		_, err := client.ResourceV1().ResourceClaims(ns).Create(ctx, &resourceapi.ResourceClaim{
			ObjectMeta: metav1.ObjectMeta{Name: fmt.Sprintf("%s-%d", kind, i), Labels: map[string]string{"bench": kind}},
			Spec:       *spec,
		}, metav1.CreateOptions{})
		return err
	}); err != nil {
		return schedResult{}, fmt.Errorf("create claims: %w", err)
	}
	w, err := client.CoreV1().Pods(ns).Watch(ctx, metav1.ListOptions{LabelSelector: "bench=" + kind})
	if err != nil {
		return schedResult{}, err
	}
	defer w.Stop()
	created := make([]time.Time, n)
	start := time.Now()
	createErr := make(chan error, 1)
	go func() {
		createErr <- parallel(n, 8, func(i int) error {
			pod := benchPod(fmt.Sprintf("%s-%d", kind, i), kind)
			pod.Spec.Affinity = affinity
			created[i] = time.Now()
			_, err := client.CoreV1().Pods(ns).Create(ctx, pod, metav1.CreateOptions{})
			return err
		})
	}()
	bound := map[string]time.Time{}
	boundOn := map[string]string{}
	timeout := time.After(3 * time.Minute)
	for len(bound) < n {
		select {
		case err := <-createErr:
			if err != nil {
				return schedResult{}, fmt.Errorf("create pods: %w", err)
			}
			createErr = nil
		case ev, ok := <-w.ResultChan():
			if !ok {
				return schedResult{}, fmt.Errorf("pod watch closed after %d of %d bound", len(bound), n)
			}
			if ev.Type != watch.Added && ev.Type != watch.Modified {
				continue
			}
			pod, ok := ev.Object.(*corev1.Pod)
			if !ok || pod.Spec.NodeName == "" {
				continue
			}
			if _, seen := bound[pod.Name]; !seen {
				bound[pod.Name] = time.Now()
				boundOn[pod.Name] = pod.Spec.NodeName
			}
		case <-timeout:
			return schedResult{}, fmt.Errorf("%s: only %d of %d pods bound after 3m", kind, len(bound), n)
		}
	}
	if createErr != nil {
		if err := <-createErr; err != nil {
			return schedResult{}, err
		}
	}
	var last time.Time
	res := schedResult{pods: n}
	for i := range n {
		t := bound[fmt.Sprintf("%s-%d", kind, i)]
		if t.After(last) {
			last = t
		}
		res.latencies = append(res.latencies, t.Sub(created[i]))
		res.nodes = append(res.nodes, boundOn[fmt.Sprintf("%s-%d", kind, i)])
	}
	res.wall = last.Sub(start)
	return res, release(ctx, client, ns, kind)
}

// release deletes a measured batch's pods and claims and waits until the
// claims are gone, so that their GPUs are free for the next batch: every
// batch then meets the same fleet, whichever kinds ran before it. (Kept,
// the batches of the kinds that prefer the fastest model filled its GPUs,
// and the later ones were measured on a fleet where it was full.)
func release(ctx context.Context, client kubernetes.Interface, ns, kind string) error {
	sel := metav1.ListOptions{LabelSelector: "bench=" + kind}
	if err := client.CoreV1().Pods(ns).DeleteCollection(ctx, metav1.DeleteOptions{GracePeriodSeconds: ptr.To[int64](0)}, sel); err != nil {
		return fmt.Errorf("release batch %s: delete pods: %w", kind, err)
	}
	if err := client.ResourceV1().ResourceClaims(ns).DeleteCollection(ctx, metav1.DeleteOptions{}, sel); err != nil {
		return fmt.Errorf("release batch %s: delete claims: %w", kind, err)
	}
	// The resourceclaim controller deallocates a deleted claim once no pod
	// reserves it, and removes its finalizer.
	deadline := time.Now().Add(2 * time.Minute)
	for {
		claims, err := client.ResourceV1().ResourceClaims(ns).List(ctx, sel)
		if err != nil {
			return fmt.Errorf("release batch %s: list claims: %w", kind, err)
		}
		if len(claims.Items) == 0 {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("release batch %s: %d claims still there after 2m", kind, len(claims.Items))
		}
		time.Sleep(200 * time.Millisecond)
	}
}

func benchPod(name, kind string) *corev1.Pod {
	return &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: name, Labels: map[string]string{"bench": kind}},
		Spec: corev1.PodSpec{
			SchedulerName:                 benchScheduler,
			TerminationGracePeriodSeconds: ptr.To[int64](0),
			ResourceClaims:                []corev1.PodResourceClaim{{Name: "gpu", ResourceClaimName: ptr.To(name)}},
			Containers: []corev1.Container{{
				Name: "cuda", Image: "registry.k8s.io/pause:3.10",
				Resources: corev1.ResourceRequirements{Claims: []corev1.ResourceClaim{{Name: "gpu"}}},
			}},
		},
	}
}

// startBenchScheduler runs the test bed's kube-scheduler a second time,
// beside the test bed's own scheduler, for pods with schedulerName
// benchScheduler only. Its client QPS is raised from the default 50 so that the numbers show the
// scheduler's work, not client-side throttling (each pod costs a claim
// status update, a binding and an event).
func startBenchScheduler(ctx context.Context, c *testbed.Cluster) (*testbed.Process, error) {
	name := benchScheduler
	dir := filepath.Join(c.WorkDir(), "run", name)
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return nil, err
	}
	cfg := filepath.Join(dir, "config.yaml")
	if err := os.WriteFile(cfg, []byte(fmt.Sprintf(`apiVersion: kubescheduler.config.k8s.io/v1
kind: KubeSchedulerConfiguration
clientConnection:
  kubeconfig: %s
  qps: 1000
  burst: 2000
leaderElection:
  leaderElect: false
profiles:
- schedulerName: %s
`, c.KubeconfigPath, name)), 0o644); err != nil {
		return nil, err
	}
	return testbed.StartProcess(ctx, name, dir, filepath.Join(c.WorkDir(), "logs", name+".log"),
		c.BinPath("kube-scheduler"), "--config="+cfg, "--secure-port=0", "--v=1")
}
