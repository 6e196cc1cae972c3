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

// Package scenario runs the demo scenarios in demo/specs against a cluster
// with Prism installed and checks each against the expectation written into
// its spec file.
//
// A spec file is plain YAML a user could kubectl apply. Its comment header
// starts with "# <title>". The runner reads these from the objects:
//
//   - label demo.prism.dev/step: objects are applied step by step, in
//     ascending order (no label: step 1); the pods of a step must run before
//     the next step starts.
//   - pod annotations demo.prism.dev/expect-*: what the pod must get
//     (expect-product, expect-class, expect-gpus, expect-node,
//     expect-same-gpu-as, expect-different-gpu-from,
//     expect-same-nvlink-domain, expect-config, expect-why,
//     expect-memory-share: the gpu.prism.dev/memory its allocation consumes,
//     expect-not-device: a device name, or pool/device, it must not get,
//     expect-mig-profile: the MIG profile of the partition it gets; empty
//     for a whole GPU).
//   - pod annotation demo.prism.dev/make-room: "<node>=<n>": before the
//     pod's step, pods of earlier scenarios on that node are deleted, newest
//     first, until n of its GPUs are free (earlier scenarios may have taken
//     them; the scheduler chooses).
//   - pod annotation demo.prism.dev/raise-xid: "<node>/<gpu index>/<xid>":
//     before the pod's step the runner plays a failing GPU: it appends the
//     Xid to the node's --simulated-faults file and waits until the plugin
//     has tainted the device in its ResourceSlice. After the step it waits,
//     bounded, for the taint to go again (the plugin's
//     --health-recover-after).
//   - pod annotation demo.prism.dev/stand-in-report: a recorded ncu report
//     (path from the repository root). No container runs in the test bed,
//     so the runner plays the profiled container: it drops the report where
//     the plugin collects it, deletes the pod and waits for the
//     WorkloadProfile the plugin creates at unprepare.
//
// Files without pods (the namespace, profiles.yaml) are set-up: they are
// applied first, and objects carrying a status (WorkloadProfiles) get it
// written through the status subresource.
package scenario

import (
	"context"
	"fmt"
	"io"
	"slices"
	"strconv"
	"strings"
	"time"

	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/client-go/discovery"
	"k8s.io/client-go/discovery/cached/memory"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/restmapper"
)

// Namespace is where every scenario lives.
const Namespace = "prism-demo"

const (
	prefix          = "demo.prism.dev/"
	stepLabel       = prefix + "step"
	standInReport   = prefix + "stand-in-report"
	makeRoomAnnot   = prefix + "make-room"
	raiseXIDAnnot   = prefix + "raise-xid"
	taintTimeout    = 30 * time.Second
	recoverTimeout  = 2 * time.Minute
	roomTimeout     = time.Minute
	profileAnnot    = "prism.dev/profile"
	podTimeout      = 2 * time.Minute
	profileTimeout  = 2 * time.Minute
	fieldManager    = "prism-demo"
	expectPrefixLen = len(prefix + "expect-")
)

// Env is what the runner needs of a cluster.
type Env struct {
	Config *rest.Config
	// StateDirs maps node name to the --state-dir of its
	// prism-kubelet-plugin; the stand-in for a profiled container writes
	// there.
	StateDirs map[string]string
	// FaultsFiles maps node name to the --simulated-faults file of its
	// prism-kubelet-plugin; raise-xid appends there. A node missing here
	// uses bed.FaultsFile of its state directory.
	FaultsFiles map[string]string
	// RepoRoot resolves stand-in report paths.
	RepoRoot string
	// Log receives progress lines; nil discards them.
	Log io.Writer
}

// Row is one pod of a scenario.
type Row struct {
	Pod, Node, GPU, Class, Why string
	// Note is shown after the result, for example "deleted after profiling".
	Note string
	// Problems are unmet expectations; empty means the pod passed.
	Problems []string
}

// Result is one scenario.
type Result struct {
	File, Title string
	Rows        []Row
	// Err is a failure outside any one pod's expectation.
	Err      error
	Duration time.Duration
}

// Passed reports whether every expectation held.
func (r Result) Passed() bool {
	if r.Err != nil || len(r.Rows) == 0 {
		return false
	}
	for _, row := range r.Rows {
		if len(row.Problems) > 0 {
			return false
		}
	}
	return true
}

// Results are all scenarios, in the order they ran.
type Results struct {
	Scenarios []Result
	Duration  time.Duration
}

// Failed lists the scenarios that missed their expectation.
func (rs Results) Failed() []string {
	var out []string
	for _, r := range rs.Scenarios {
		if !r.Passed() {
			out = append(out, r.File)
		}
	}
	return out
}

type runner struct {
	env    Env
	client kubernetes.Interface
	dyn    dynamic.Interface
	mapper *restmapper.DeferredDiscoveryRESTMapper
	slices map[string]resourceapi.Device // pool/device
}

func (r *runner) logf(format string, args ...any) {
	if r.env.Log != nil {
		fmt.Fprintf(r.env.Log, "[prism-demo] "+format+"\n", args...)
	}
}

// Run applies every spec in specsDir and checks the scenarios. The error is
// for failures that stop the run (unreadable specs, an API server that does
// not answer); missed expectations are in the Results.
func Run(ctx context.Context, env Env, specsDir string) (Results, error) {
	start := time.Now()
	var res Results
	client, err := kubernetes.NewForConfig(env.Config)
	if err != nil {
		return res, err
	}
	dyn, err := dynamic.NewForConfig(env.Config)
	if err != nil {
		return res, err
	}
	dc, err := discovery.NewDiscoveryClientForConfig(env.Config)
	if err != nil {
		return res, err
	}
	r := &runner{env: env, client: client, dyn: dyn, mapper: restmapper.NewDeferredDiscoveryRESTMapper(memory.NewMemCacheClient(dc))}
	files, err := loadSpecs(specsDir)
	if err != nil {
		return res, err
	}
	if err := r.resetNamespace(ctx); err != nil {
		return res, err
	}
	for _, f := range files {
		if f.hasPods {
			continue
		}
		if err := r.setUp(ctx, f); err != nil {
			return res, fmt.Errorf("%s: %w", f.name, err)
		}
	}
	for _, f := range files {
		if !f.hasPods {
			continue
		}
		s := time.Now()
		r.logf("scenario %s: %s", f.name, f.title)
		result := r.runScenario(ctx, f)
		result.Duration = time.Since(s)
		verdict := "PASS"
		if !result.Passed() {
			verdict = "FAIL"
		}
		r.logf("  %s in %s", verdict, result.Duration.Round(100*time.Millisecond))
		res.Scenarios = append(res.Scenarios, result)
		if ctx.Err() != nil {
			return res, ctx.Err()
		}
	}
	res.Duration = time.Since(start)
	return res, nil
}

func (r *runner) runScenario(ctx context.Context, f specFile) Result {
	res := Result{File: f.name, Title: f.title}
	steps := map[int][]*unstructured.Unstructured{}
	for _, obj := range f.objs {
		step := 1
		if s, ok := obj.GetLabels()[stepLabel]; ok {
			n, err := strconv.Atoi(s)
			if err != nil {
				res.Err = fmt.Errorf("%s %s: label %s=%q is not a number", obj.GetKind(), obj.GetName(), stepLabel, s)
				return res
			}
			step = n
		}
		steps[step] = append(steps[step], obj)
	}
	order := make([]int, 0, len(steps))
	for s := range steps {
		order = append(order, s)
	}
	slices.Sort(order)
	mine := map[string]bool{} // this scenario's pods
	for _, obj := range f.objs {
		if obj.GetKind() == "Pod" {
			mine[obj.GetName()] = true
		}
	}
	got := map[string][]string{} // pod → allocated device IDs
	for _, step := range order {
		var notes []string
		faults := map[string]*fault{} // pod → the fault raised before its step
		for _, obj := range steps[step] {
			if obj.GetKind() != "Pod" {
				continue
			}
			if spec, ok := obj.GetAnnotations()[makeRoomAnnot]; ok {
				note, err := r.makeRoom(ctx, spec, mine)
				if err != nil {
					res.Err = fmt.Errorf("pod %s: %s: %w", obj.GetName(), makeRoomAnnot, err)
					return res
				}
				if note != "" {
					notes = append(notes, note)
				}
			}
			if spec, ok := obj.GetAnnotations()[raiseXIDAnnot]; ok {
				ft, err := r.raiseXID(ctx, spec)
				if err != nil {
					res.Err = fmt.Errorf("pod %s: %s: %w", obj.GetName(), raiseXIDAnnot, err)
					return res
				}
				faults[obj.GetName()] = ft
			}
		}
		var pods []*unstructured.Unstructured
		for _, obj := range steps[step] {
			if err := r.apply(ctx, obj); err != nil {
				res.Err = err
				return res
			}
			if obj.GetKind() == "Pod" {
				pods = append(pods, obj)
			}
		}
		var rows []Row
		for _, p := range pods {
			row, devices, pod := r.observe(ctx, p.GetName())
			got[p.GetName()] = devices
			if pod != nil {
				row.Problems = append(row.Problems, r.check(pod, devices)...)
			}
			rows = append(rows, row)
		}
		if len(rows) > 0 && len(notes) > 0 {
			rows[0].Note = strings.Join(notes, "; ")
		}
		for i, p := range pods {
			rows[i].Problems = append(rows[i].Problems, checkPair(p.GetName(), p.GetAnnotations(), got)...)
		}
		for i, p := range pods {
			ft := faults[p.GetName()]
			if ft == nil {
				continue
			}
			if slices.Contains(got[p.GetName()], ft.id()) {
				rows[i].Problems = append(rows[i].Problems, fmt.Sprintf("got the tainted GPU %s", ft.id()))
			} else if len(got[p.GetName()]) > 0 {
				rows[i].Why = joinNonEmpty(rows[i].Why, fmt.Sprintf("GPU %s tainted %s: avoided", ft.device, ft.taint.Value))
			}
			note, err := r.waitRecovered(ctx, ft)
			if err != nil {
				rows[i].Problems = append(rows[i].Problems, err.Error())
			} else {
				rows[i].Note = joinNonEmpty(rows[i].Note, note)
			}
		}
		for i, p := range pods {
			if report, ok := p.GetAnnotations()[standInReport]; ok && len(rows[i].Problems) == 0 {
				note, err := r.standIn(ctx, p.GetName(), report)
				if err != nil {
					rows[i].Problems = append(rows[i].Problems, err.Error())
				} else {
					rows[i].Note = note
				}
			}
		}
		res.Rows = append(res.Rows, rows...)
		for _, row := range rows {
			if len(row.Problems) > 0 {
				return res // a later step builds on this one
			}
		}
	}
	return res
}

func joinNonEmpty(a, b string) string {
	switch {
	case a == "" || a == "-":
		return b
	case b == "":
		return a
	}
	return a + "; " + b
}
