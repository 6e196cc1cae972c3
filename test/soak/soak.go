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

// Package soak churns pods with Prism claims on the test bed while it injects
// faults into every component, and checks after each fault, and at the end,
// that nothing was lost: no device is allocated beyond its capacity, nothing
// prepared outlives its claim, every pod is running or says why not, every
// finished profiled run reaches its WorkloadProfile, and the kubelet plugin
// stays under the chart's memory limit. `make soak` runs it.
package soak

import (
	"context"
	"fmt"
	"io"
	"math/rand/v2"
	"os"
	"path/filepath"
	"slices"
	"sort"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	corev1 "k8s.io/api/core/v1"
	resourceapi "k8s.io/api/resource/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/kubernetes"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/yaml"

	prismv1alpha1 "github.com/prismgpu/prism/api/prism/v1alpha1"
	"github.com/prismgpu/prism/demo/bed"
	"github.com/prismgpu/prism/test/testbed"
)

// Options configure a soak.
type Options struct {
	// RepoRoot holds deployments/ and demo/fleets.
	RepoRoot string
	// PluginBin and ControllerBin are the Prism binaries under test; NCUDir
	// holds the stand-in ncu, MPSControl is the stand-in
	// nvidia-cuda-mps-control, so that shares run under MPS.
	PluginBin, ControllerBin, NCUDir, MPSControl string
	// WorkDir receives the test bed's state and logs.
	WorkDir string
	// Duration is how long pods churn and faults are injected.
	Duration time.Duration
	// Seed fixes the churn's choices and the fault schedule.
	Seed uint64
	// Workers each keep one pod going at a time.
	Workers int
	// FaultEvery is the mean gap between two faults.
	FaultEvery time.Duration
	// Faults are the kinds injected, in turn; empty means all of FaultKinds.
	Faults []string
	// Log receives progress lines.
	Log io.Writer
}

// Namespace holds every pod and claim the soak makes.
const Namespace = "soak"

// nodes are the soak's GPU nodes: 16 GPUs that allow sharing.
var nodes = []bed.NodeSpec{
	{Name: "gpu-h100", Fleet: "h100-sxm-8.yaml"},
	{Name: "gpu-a100", Fleet: "a100-40gb-8.yaml"},
}

// Result is what a soak saw.
type Result struct {
	Seed    uint64  `json:"seed"`
	Minutes float64 `json:"minutes"`
	Faults  []Fault `json:"faults"`
	Pods    Counts  `json:"pods"`
	// Violations of the invariants; the goal is none.
	Violations []Violation `json:"violations"`
	// PluginPeakRSSMiB is each plugin's largest resident set seen, against
	// PluginLimitMiB, the chart's memory limit for it.
	PluginPeakRSSMiB map[string]float64 `json:"pluginPeakRSSMiB"`
	PluginLimitMiB   float64            `json:"pluginLimitMiB"`
	// ProfiledRuns finished with a report, and how many of their
	// WorkloadProfiles carry it.
	ProfiledRuns      int `json:"profiledRuns"`
	ProfilesPublished int `json:"profilesPublished"`
}

// Counts are pods by what became of them.
type Counts struct {
	Created int `json:"created"`
	Ran     int `json:"ran"`
	// Waited are pods that never ran before their time was up; each had to
	// say why (a violation otherwise).
	Waited  int `json:"waited"`
	Deleted int `json:"deleted"`
}

// Fault is one injected fault, how long its component took to come back,
// and how long until a new pod ran on the node it hit.
type Fault struct {
	Kind     string        `json:"kind"`
	Target   string        `json:"target,omitempty"`
	At       time.Duration `json:"at"`
	Restored time.Duration `json:"restored"`
	Recovery time.Duration `json:"recovery"`
	Err      string        `json:"error,omitempty"`
}

// Violation is an invariant that did not hold.
type Violation struct {
	At     time.Duration `json:"at"`
	After  string        `json:"after"`
	Check  string        `json:"check"`
	Detail string        `json:"detail"`
}

// soak is one run's shared state.
type soak struct {
	opts    Options
	cluster *testbed.Cluster
	bed     *bed.Bed
	client  kubernetes.Interface
	prism   client.Client
	start   time.Time
	seq     atomic.Int64

	mu         sync.Mutex
	res        Result
	finished   []finishedRun
	reported   map[string]bool
	limitBytes int64
}

// finishedRun is a profiled run whose report was written and whose pod is
// gone: its WorkloadProfile must come to carry the report's digest.
type finishedRun struct {
	profile, digest string
	at              time.Time
}

// Run sets up the test bed, churns and injects faults for opts.Duration,
// and returns what it saw. An error means the soak itself could not run;
// invariant violations are in the Result.
func Run(ctx context.Context, opts Options) (*Result, error) {
	limit, err := pluginMemoryLimit(opts.RepoRoot)
	if err != nil {
		return nil, err
	}
	cluster, err := testbed.Start(ctx, testbed.Options{WorkDir: opts.WorkDir, CRDDirs: bed.CRDDirs(opts.RepoRoot)})
	if err != nil {
		return nil, err
	}
	defer cluster.Stop(context.WithoutCancel(ctx))
	b, err := bed.Setup(ctx, cluster, bed.Options{
		RepoRoot: opts.RepoRoot, PluginBin: opts.PluginBin, ControllerBin: opts.ControllerBin, NCUDir: opts.NCUDir,
		MPSControl: opts.MPSControl, Nodes: nodes, ControllerReplicas: 2, Log: opts.Log,
	})
	if err != nil {
		return nil, err
	}
	defer b.Stop()
	scheme := runtime.NewScheme()
	if err := prismv1alpha1.AddToScheme(scheme); err != nil {
		return nil, err
	}
	prism, err := client.New(cluster.Config, client.Options{Scheme: scheme})
	if err != nil {
		return nil, err
	}
	s := &soak{opts: opts, cluster: cluster, bed: b, client: cluster.Client, prism: prism,
		reported: map[string]bool{}, limitBytes: limit.Value()}
	s.res = Result{Seed: opts.Seed, Violations: []Violation{}, PluginPeakRSSMiB: map[string]float64{}, PluginLimitMiB: float64(limit.Value()) / (1 << 20)}
	if err := s.setup(ctx); err != nil {
		return nil, err
	}

	s.start = time.Now()
	s.logf("soak started: %s, seed %d, %d workers, a fault every %s on average", opts.Duration, opts.Seed, opts.Workers, opts.FaultEvery)
	runCtx, stop := context.WithTimeout(ctx, opts.Duration)
	defer stop()
	var wg sync.WaitGroup
	wg.Go(func() { s.sampleRSS(runCtx) })
	wg.Go(func() { s.progress(runCtx) })
	for i := range opts.Workers {
		rng := rand.New(rand.NewPCG(opts.Seed, uint64(i)+1))
		wg.Go(func() { s.churn(runCtx, ctx, rng) })
	}
	wg.Go(func() { s.inject(runCtx, ctx, rand.New(rand.NewPCG(opts.Seed, 0))) })
	wg.Wait()
	if ctx.Err() != nil {
		return nil, ctx.Err()
	}
	s.logf("churn stopped after %s; settling and checking", time.Since(s.start).Round(time.Second))
	s.checkAll(ctx, "end", true)

	s.mu.Lock()
	defer s.mu.Unlock()
	s.res.Minutes = time.Since(s.start).Minutes()
	s.res.ProfiledRuns = len(s.finished)
	return &s.res, nil
}

func (s *soak) logf(format string, args ...any) {
	if s.opts.Log != nil {
		fmt.Fprintf(s.opts.Log, "[soak %6s] %s\n", s.since().Round(time.Second), fmt.Sprintf(format, args...))
	}
}

func (s *soak) since() time.Duration {
	if s.start.IsZero() {
		return 0
	}
	return time.Since(s.start)
}

func (s *soak) violate(after, check, format string, args ...any) {
	v := Violation{At: s.since().Round(time.Second), After: after, Check: check, Detail: fmt.Sprintf(format, args...)}
	s.mu.Lock()
	s.res.Violations = append(s.res.Violations, v)
	s.mu.Unlock()
	s.logf("VIOLATION %s after %s: %s", check, after, v.Detail)
}

func (s *soak) count(f func(*Counts)) {
	s.mu.Lock()
	f(&s.res.Pods)
	s.mu.Unlock()
}

func (s *soak) progress(ctx context.Context) {
	wait.UntilWithContext(ctx, func(context.Context) {
		s.mu.Lock()
		p, f, v := s.res.Pods, len(s.res.Faults), len(s.res.Violations)
		s.mu.Unlock()
		s.logf("pods created %d, ran %d, deleted %d; faults %d; violations %d", p.Created, p.Ran, p.Deleted, f, v)
	}, time.Minute)
}

// setup creates the namespace and the two templates that plain runs use.
func (s *soak) setup(ctx context.Context) error {
	if _, err := s.client.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: Namespace}}, metav1.CreateOptions{}); err != nil {
		return err
	}
	for name, spec := range map[string]resourceapi.ResourceClaimSpec{"exclusive": gpuSpec(""), "shared": gpuSpec(shareMemory), "canary": gpuSpec(canaryMemory)} {
		if _, err := s.client.ResourceV1().ResourceClaimTemplates(Namespace).Create(ctx, &resourceapi.ResourceClaimTemplate{
			ObjectMeta: metav1.ObjectMeta{Name: name},
			Spec:       resourceapi.ResourceClaimTemplateSpec{Spec: spec},
		}, metav1.CreateOptions{}); err != nil {
			return err
		}
	}
	// The default ServiceAccount of a new namespace comes from
	// kube-controller-manager, and pods wait for it.
	return retry(ctx, time.Minute, func() error {
		_, err := s.client.CoreV1().ServiceAccounts(Namespace).Get(ctx, "default", metav1.GetOptions{})
		return err
	})
}

// pluginMemoryLimit reads the kubelet plugin's memory limit from the chart's
// values, the limit the plugin runs under when installed.
func pluginMemoryLimit(repoRoot string) (resource.Quantity, error) {
	raw, err := os.ReadFile(filepath.Join(repoRoot, "deployments", "helm", "prism", "values.yaml"))
	if err != nil {
		return resource.Quantity{}, err
	}
	var values struct {
		KubeletPlugin struct {
			Resources corev1.ResourceRequirements `json:"resources"`
		} `json:"kubeletPlugin"`
	}
	if err := yaml.Unmarshal(raw, &values); err != nil {
		return resource.Quantity{}, fmt.Errorf("chart values: %w", err)
	}
	limit, ok := values.KubeletPlugin.Resources.Limits[corev1.ResourceMemory]
	if !ok {
		return resource.Quantity{}, fmt.Errorf("chart values set no kubeletPlugin.resources.limits.memory")
	}
	return limit, nil
}

// retry calls f until it succeeds or timeout passes: the API server and
// etcd restart under the soak, and a call that fails then is tried again,
// as every controller would.
func retry(ctx context.Context, timeout time.Duration, f func() error) error {
	deadline := time.Now().Add(timeout)
	for {
		err := f()
		if err == nil || ctx.Err() != nil || time.Now().After(deadline) {
			return err
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(500 * time.Millisecond):
		}
	}
}

// ignoreExists treats an object that already exists as made: by an earlier
// try whose answer a restarting API server lost.
func ignoreExists(err error) error {
	if apierrors.IsAlreadyExists(err) {
		return nil
	}
	return err
}

// sleep waits d or until ctx ends, and says whether it waited it all.
func sleep(ctx context.Context, d time.Duration) bool {
	select {
	case <-ctx.Done():
		return false
	case <-time.After(d):
		return true
	}
}

// Print writes the summary a reader wants first: faults by kind with their
// recovery times, pods churned, and every violation.
func (r *Result) Print(w io.Writer) {
	byKind := map[string][]time.Duration{}
	var all []time.Duration
	failed := map[string]int{}
	for _, f := range r.Faults {
		byKind[f.Kind] = append(byKind[f.Kind], f.Recovery)
		all = append(all, f.Recovery)
		if f.Err != "" {
			failed[f.Kind]++
		}
	}
	fmt.Fprintf(w, "soak: %.1f minutes, seed %d\n\n", r.Minutes, r.Seed)
	fmt.Fprintf(w, "%-20s %6s %9s %9s %9s\n", "fault", "count", "failed", "p50", "max")
	kinds := make([]string, 0, len(byKind))
	for k := range byKind {
		kinds = append(kinds, k)
	}
	sort.Strings(kinds)
	row := func(name string, d []time.Duration, failed int) {
		fmt.Fprintf(w, "%-20s %6d %9d %9s %9s\n", name, len(d), failed, quantile(d, 0.5), quantile(d, 1))
	}
	total := 0
	for _, k := range kinds {
		row(k, byKind[k], failed[k])
		total += failed[k]
	}
	row("all", all, total)
	fmt.Fprintf(w, "\npods: created %d, ran %d, never ran in time %d, deleted %d\n", r.Pods.Created, r.Pods.Ran, r.Pods.Waited, r.Pods.Deleted)
	fmt.Fprintf(w, "profiled runs finished: %d, WorkloadProfiles carrying their report: %d\n", r.ProfiledRuns, r.ProfilesPublished)
	var peaks []string
	for n, v := range r.PluginPeakRSSMiB {
		peaks = append(peaks, fmt.Sprintf("%s %.0f MiB", n, v))
	}
	sort.Strings(peaks)
	fmt.Fprintf(w, "plugin peak RSS: %s (limit %.0f MiB)\n", strings.Join(peaks, ", "), r.PluginLimitMiB)
	fmt.Fprintf(w, "invariant violations: %d\n", len(r.Violations))
	for _, v := range r.Violations {
		fmt.Fprintf(w, "  %6s after %-18s %-12s %s\n", v.At, v.After, v.Check, v.Detail)
	}
}

// quantile is the q-quantile of d by the nearest-rank method, rounded for
// reading.
func quantile(d []time.Duration, q float64) time.Duration {
	if len(d) == 0 {
		return 0
	}
	s := slices.Clone(d)
	slices.Sort(s)
	i := int(q*float64(len(s))+0.5) - 1
	i = min(max(i, 0), len(s)-1)
	return s[i].Round(100 * time.Millisecond)
}
