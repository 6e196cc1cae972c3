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
//     expect-not-device: a device name, or pool/device, it must not get).
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
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"slices"
	"sort"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"

	corev1 "k8s.io/api/core/v1"
	resourceapi "k8s.io/api/resource/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/discovery"
	"k8s.io/client-go/discovery/cached/memory"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/restmapper"
	"sigs.k8s.io/yaml"

	gpuv1alpha1 "github.com/prismgpu/prism/api/gpu/v1alpha1"
	"github.com/prismgpu/prism/pkg/profiling"
	"github.com/prismgpu/prism/pkg/rewrite"
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

var workloadProfiles = schema.GroupVersionResource{Group: "prism.dev", Version: "v1alpha1", Resource: "workloadprofiles"}

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

type specFile struct {
	name, title string
	objs        []*unstructured.Unstructured
	hasPods     bool
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

func loadSpecs(dir string) ([]specFile, error) {
	paths, err := filepath.Glob(filepath.Join(dir, "*.yaml"))
	if err != nil {
		return nil, err
	}
	sort.Strings(paths)
	if len(paths) == 0 {
		return nil, fmt.Errorf("no spec files in %s", dir)
	}
	var files []specFile
	for _, p := range paths {
		data, err := os.ReadFile(p)
		if err != nil {
			return nil, err
		}
		f := specFile{name: strings.TrimSuffix(filepath.Base(p), ".yaml"), title: title(data)}
		for _, doc := range splitDocs(data) {
			obj := &unstructured.Unstructured{}
			if err := yaml.Unmarshal(doc, &obj.Object); err != nil {
				return nil, fmt.Errorf("%s: %w", p, err)
			}
			if len(obj.Object) == 0 {
				continue
			}
			if obj.GetKind() == "Pod" {
				f.hasPods = true
			}
			f.objs = append(f.objs, obj)
		}
		files = append(files, f)
	}
	return files, nil
}

func splitDocs(data []byte) [][]byte {
	var docs [][]byte
	var cur []string
	for _, line := range strings.Split(string(data), "\n") {
		if strings.TrimRight(line, " ") == "---" {
			docs = append(docs, []byte(strings.Join(cur, "\n")))
			cur = nil
			continue
		}
		cur = append(cur, line)
	}
	return append(docs, []byte(strings.Join(cur, "\n")))
}

// title is the first comment line of the file.
func title(data []byte) string {
	for _, line := range strings.Split(string(data), "\n") {
		if t, ok := strings.CutPrefix(line, "# "); ok {
			return strings.TrimSpace(t)
		}
	}
	return ""
}

func (r *runner) resetNamespace(ctx context.Context) error {
	_, err := r.client.CoreV1().Namespaces().Get(ctx, Namespace, metav1.GetOptions{})
	if apierrors.IsNotFound(err) {
		return nil
	}
	if err != nil {
		return err
	}
	r.logf("namespace %s exists from an earlier run: deleting it", Namespace)
	zero := int64(0)
	_ = r.client.CoreV1().Pods(Namespace).DeleteCollection(ctx, metav1.DeleteOptions{GracePeriodSeconds: &zero}, metav1.ListOptions{})
	if err := r.client.CoreV1().Namespaces().Delete(ctx, Namespace, metav1.DeleteOptions{}); err != nil && !apierrors.IsNotFound(err) {
		return err
	}
	return wait.PollUntilContextTimeout(ctx, 250*time.Millisecond, 3*time.Minute, true, func(ctx context.Context) (bool, error) {
		_, err := r.client.CoreV1().Namespaces().Get(ctx, Namespace, metav1.GetOptions{})
		return apierrors.IsNotFound(err), nil
	})
}

// apply server-side applies one object, then its status if it has one.
func (r *runner) apply(ctx context.Context, obj *unstructured.Unstructured) error {
	gvk := obj.GroupVersionKind()
	m, err := r.mapper.RESTMapping(gvk.GroupKind(), gvk.Version)
	if err != nil {
		r.mapper.Reset()
		if m, err = r.mapper.RESTMapping(gvk.GroupKind(), gvk.Version); err != nil {
			return fmt.Errorf("%s %s: %w", gvk.Kind, obj.GetName(), err)
		}
	}
	var ri dynamic.ResourceInterface = r.dyn.Resource(m.Resource)
	if m.Scope.Name() == "namespace" {
		ns := obj.GetNamespace()
		if ns == "" {
			ns = Namespace
		}
		ri = r.dyn.Resource(m.Resource).Namespace(ns)
	}
	status, hasStatus := obj.Object["status"]
	body := obj.DeepCopy()
	delete(body.Object, "status")
	opts := metav1.ApplyOptions{FieldManager: fieldManager, Force: true}
	if _, err := ri.Apply(ctx, obj.GetName(), body, opts); err != nil {
		return fmt.Errorf("apply %s %s: %w", gvk.Kind, obj.GetName(), err)
	}
	if hasStatus {
		st := &unstructured.Unstructured{Object: map[string]any{
			"apiVersion": obj.GetAPIVersion(), "kind": obj.GetKind(),
			"metadata": map[string]any{"name": obj.GetName(), "namespace": body.GetNamespace()},
			"status":   status,
		}}
		if st.GetNamespace() == "" && m.Scope.Name() == "namespace" {
			st.SetNamespace(Namespace)
		}
		if _, err := ri.ApplyStatus(ctx, obj.GetName(), st, opts); err != nil {
			return fmt.Errorf("apply status of %s %s: %w", gvk.Kind, obj.GetName(), err)
		}
	}
	return nil
}

func (r *runner) setUp(ctx context.Context, f specFile) error {
	for _, obj := range f.objs {
		if err := r.apply(ctx, obj); err != nil {
			return err
		}
		if obj.GetKind() == "WorkloadProfile" {
			if bt, _, _ := unstructured.NestedString(obj.Object, "status", "boundType"); bt != "" {
				if err := r.waitControllerSees(ctx, obj.GetName()); err != nil {
					return err
				}
			}
		}
	}
	r.logf("set-up %s applied (%d objects)", f.name, len(f.objs))
	return nil
}

// waitControllerSees waits until the controller's informer has the
// measured profile: a dry-run claim naming it gets a rewrite plan.
func (r *runner) waitControllerSees(ctx context.Context, profile string) error {
	claim := &resourceapi.ResourceClaim{
		ObjectMeta: metav1.ObjectMeta{Name: "probe-" + profile, Namespace: Namespace, Annotations: map[string]string{profileAnnot: profile}},
		Spec: resourceapi.ResourceClaimSpec{Devices: resourceapi.DeviceClaim{Requests: []resourceapi.DeviceRequest{{
			Name: "gpu", Exactly: &resourceapi.ExactDeviceRequest{DeviceClassName: rewrite.DeviceClassName, AllocationMode: resourceapi.DeviceAllocationModeExactCount, Count: 1},
		}}}},
	}
	err := wait.PollUntilContextTimeout(ctx, 200*time.Millisecond, time.Minute, true, func(ctx context.Context) (bool, error) {
		out, err := r.client.ResourceV1().ResourceClaims(Namespace).Create(ctx, claim, metav1.CreateOptions{DryRun: []string{metav1.DryRunAll}})
		if err != nil {
			return false, nil
		}
		var plan struct {
			BoundType string `json:"boundType"`
		}
		_ = json.Unmarshal([]byte(out.Annotations[rewrite.AnnotationKey]), &plan)
		return plan.BoundType != "" && plan.BoundType != "Unknown", nil
	})
	if err != nil {
		return fmt.Errorf("prism-controller does not rewrite for profile %s: %w", profile, err)
	}
	return nil
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
	sort.Ints(order)
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
			if other, ok := p.GetAnnotations()[prefix+"expect-same-gpu-as"]; ok {
				if len(got[p.GetName()]) == 0 || !slices.Equal(got[p.GetName()], got[other]) {
					rows[i].Problems = append(rows[i].Problems, fmt.Sprintf("got %v, want the same GPU as %s %v", got[p.GetName()], other, got[other]))
				}
			}
			if other, ok := p.GetAnnotations()[prefix+"expect-different-gpu-from"]; ok {
				switch {
				case len(got[p.GetName()]) == 0 || len(got[other]) == 0:
					rows[i].Problems = append(rows[i].Problems, fmt.Sprintf("got %v, want a GPU other than %s's %v", got[p.GetName()], other, got[other]))
				default:
					for _, id := range got[p.GetName()] {
						if slices.Contains(got[other], id) {
							rows[i].Problems = append(rows[i].Problems, fmt.Sprintf("got %s, which %s has too; want a different GPU", id, other))
						}
					}
				}
			}
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

// observe waits for the pod to run and describes what it got.
func (r *runner) observe(ctx context.Context, name string) (Row, []string, *corev1.Pod) {
	row := Row{Pod: name, Node: "-", GPU: "-", Class: "-", Why: "-"}
	var pod *corev1.Pod
	var last string
	err := wait.PollUntilContextTimeout(ctx, 200*time.Millisecond, podTimeout, true, func(ctx context.Context) (bool, error) {
		p, err := r.client.CoreV1().Pods(Namespace).Get(ctx, name, metav1.GetOptions{})
		if err != nil {
			return false, nil
		}
		pod = p
		last = describePod(p)
		if p.Status.Phase == corev1.PodFailed || p.Status.Phase == corev1.PodSucceeded {
			return false, fmt.Errorf("pod ended in phase %s", p.Status.Phase)
		}
		return p.Status.Phase == corev1.PodRunning, nil
	})
	if err != nil {
		row.Problems = append(row.Problems, fmt.Sprintf("not Running (%s): %v", last, err))
		return row, nil, nil
	}
	row.Node = pod.Spec.NodeName
	claims, err := r.podClaims(ctx, pod)
	if err != nil {
		row.Problems = append(row.Problems, err.Error())
		return row, nil, pod
	}
	if err := r.loadSlices(ctx); err != nil {
		row.Problems = append(row.Problems, err.Error())
		return row, nil, pod
	}
	var ids, products, classes, whys []string
	for _, c := range claims {
		if c.Status.Allocation == nil {
			row.Problems = append(row.Problems, "claim "+c.Name+" is not allocated")
			continue
		}
		for _, res := range c.Status.Allocation.Devices.Results {
			if res.Driver != gpuv1alpha1.DriverName {
				continue
			}
			id := res.Pool + "/" + res.Device
			if slices.Contains(ids, id) {
				continue
			}
			ids = append(ids, id)
			d := r.slices[id]
			products = append(products, attr(d, gpuv1alpha1.ProductNameAttribute))
			classes = append(classes, attr(d, gpuv1alpha1.BandwidthClassAttribute))
		}
		whys = append(whys, why(pod, c))
	}
	sort.Strings(ids)
	row.GPU = summarise(products)
	if len(ids) > 0 {
		var names []string
		for _, id := range ids {
			names = append(names, id[strings.Index(id, "/")+1:])
		}
		row.GPU += " [" + strings.Join(names, ",") + "]"
	}
	row.Class = strings.Join(uniq(classes), ",")
	row.Why = strings.Join(uniq(whys), "; ")
	return row, ids, pod
}

func describePod(p *corev1.Pod) string {
	s := "phase " + string(p.Status.Phase)
	for _, c := range p.Status.Conditions {
		if c.Status != corev1.ConditionTrue && c.Message != "" {
			s += fmt.Sprintf(", %s: %s", c.Type, c.Message)
		}
	}
	return s
}

func (r *runner) podClaims(ctx context.Context, pod *corev1.Pod) ([]*resourceapi.ResourceClaim, error) {
	var out []*resourceapi.ResourceClaim
	for _, prc := range pod.Spec.ResourceClaims {
		name := ""
		if prc.ResourceClaimName != nil {
			name = *prc.ResourceClaimName
		}
		for _, st := range pod.Status.ResourceClaimStatuses {
			if st.Name == prc.Name && st.ResourceClaimName != nil {
				name = *st.ResourceClaimName
			}
		}
		if name == "" {
			return nil, fmt.Errorf("pod claim %s has no ResourceClaim", prc.Name)
		}
		c, err := r.client.ResourceV1().ResourceClaims(pod.Namespace).Get(ctx, name, metav1.GetOptions{})
		if err != nil {
			return nil, err
		}
		out = append(out, c)
	}
	return out, nil
}

func (r *runner) loadSlices(ctx context.Context) error {
	list, err := r.client.ResourceV1().ResourceSlices().List(ctx, metav1.ListOptions{
		FieldSelector: resourceapi.ResourceSliceSelectorDriver + "=" + gpuv1alpha1.DriverName,
	})
	if err != nil {
		return err
	}
	r.slices = map[string]resourceapi.Device{}
	for _, s := range list.Items {
		for _, d := range s.Spec.Devices {
			r.slices[s.Spec.Pool.Name+"/"+d.Name] = d
		}
	}
	return nil
}

func attr(d resourceapi.Device, name gpuv1alpha1.AttributeName) string {
	a, ok := d.Attributes[name.Qualified()]
	switch {
	case !ok:
		return ""
	case a.StringValue != nil:
		return *a.StringValue
	case a.IntValue != nil:
		return strconv.FormatInt(*a.IntValue, 10)
	case a.VersionValue != nil:
		return *a.VersionValue
	case a.BoolValue != nil:
		return strconv.FormatBool(*a.BoolValue)
	}
	return ""
}

func uniq(s []string) []string {
	var out []string
	for _, v := range s {
		if v != "" && !slices.Contains(out, v) {
			out = append(out, v)
		}
	}
	return out
}

// summarise writes "2× NVIDIA H100 80GB HBM3" for repeated products.
func summarise(products []string) string {
	if len(products) == 0 {
		return "-"
	}
	var parts []string
	for _, p := range uniq(products) {
		n := 0
		for _, q := range products {
			if q == p {
				n++
			}
		}
		if n > 1 {
			p = fmt.Sprintf("%d× %s", n, p)
		}
		parts = append(parts, p)
	}
	return strings.Join(parts, " + ")
}

// why explains how the claim got its devices.
func why(pod *corev1.Pod, c *resourceapi.ResourceClaim) string {
	var parts []string
	if raw, ok := c.Annotations[rewrite.AnnotationKey]; ok {
		var plan struct {
			rewrite.Plan
			// Action is "profile" in the note on a claim sent to be
			// profiled instead.
			Action string `json:"action"`
		}
		_ = json.Unmarshal([]byte(raw), &plan)
		tiers := strings.Join(uniq(subrequests(c)), ",")
		switch share := plan.Share; {
		case plan.Action == "profile":
			parts = append(parts, fmt.Sprintf("profile %q not measured yet: profiling run", plan.Profile))
		case share != nil && share.Verdict == rewrite.ShareSized.String() && share.Memory != nil:
			parts = append(parts, fmt.Sprintf("profile %q usage -> share %d%% %s first -> tier %s", plan.Profile, share.ComputePercent, share.Memory, tiers))
		case share != nil && plan.BoundType != "":
			parts = append(parts, fmt.Sprintf("profile %q %s/%s, no share (%s) -> tier %s", plan.Profile, plan.BoundType, plan.Policy, share.Verdict, tiers))
		case plan.BoundType != "":
			parts = append(parts, fmt.Sprintf("profile %q %s/%s -> tier %s", plan.Profile, plan.BoundType, plan.Policy, tiers))
		}
		return strings.Join(parts, "; ")
	}
	spec := c.Spec.Devices
	for _, req := range spec.Requests {
		switch {
		case len(req.FirstAvailable) > 0:
			parts = append(parts, "firstAvailable -> "+strings.Join(uniq(subrequests(c)), ","))
		case req.Exactly != nil && len(req.Exactly.Selectors) > 0:
			parts = append(parts, "selector")
		}
		if req.Exactly != nil && req.Exactly.Capacity != nil && c.Status.Allocation != nil {
			for _, res := range c.Status.Allocation.Devices.Results {
				if q, ok := res.ConsumedCapacity[gpuv1alpha1.MemoryCapacity.Qualified()]; ok && res.Request == req.Name && res.ShareID != nil {
					parts = append(parts, "memory share "+q.String())
				}
			}
		}
	}
	for _, con := range spec.Constraints {
		if con.MatchAttribute != nil {
			parts = append(parts, "matchAttribute "+strings.TrimPrefix(string(*con.MatchAttribute), gpuv1alpha1.DriverName+"/"))
		}
	}
	for _, cfg := range spec.Config {
		if cfg.Opaque == nil || cfg.Opaque.Driver != gpuv1alpha1.DriverName {
			continue
		}
		var gc struct {
			Sharing *struct {
				Strategy    string `json:"strategy"`
				TimeSlicing *struct {
					Interval string `json:"interval"`
				} `json:"timeSlicing"`
			} `json:"sharing"`
			Profiling *struct {
				Enabled bool `json:"enabled"`
			} `json:"profiling"`
		}
		_ = json.Unmarshal(cfg.Opaque.Parameters.Raw, &gc)
		if gc.Sharing != nil {
			s := "GpuConfig " + gc.Sharing.Strategy
			if gc.Sharing.TimeSlicing != nil {
				s += "/" + gc.Sharing.TimeSlicing.Interval
			}
			parts = append(parts, s)
		}
		if gc.Profiling != nil && gc.Profiling.Enabled {
			parts = append(parts, "GpuConfig profiling")
		}
	}
	users := 0
	for _, ctr := range pod.Spec.Containers {
		for _, cl := range ctr.Resources.Claims {
			for _, prc := range pod.Spec.ResourceClaims {
				if prc.Name == cl.Name && claimOf(pod, prc) == c.Name {
					users++
				}
			}
		}
	}
	if users > 1 {
		parts = append(parts, fmt.Sprintf("claim shared by %d containers", users))
	}
	if n := len(c.Status.ReservedFor); n > 1 {
		parts = append(parts, fmt.Sprintf("claim shared by %d pods", n))
	}
	if len(parts) == 0 {
		return "plain"
	}
	return strings.Join(parts, "; ")
}

func claimOf(pod *corev1.Pod, prc corev1.PodResourceClaim) string {
	if prc.ResourceClaimName != nil {
		return *prc.ResourceClaimName
	}
	for _, st := range pod.Status.ResourceClaimStatuses {
		if st.Name == prc.Name && st.ResourceClaimName != nil {
			return *st.ResourceClaimName
		}
	}
	return ""
}

// subrequests are the firstAvailable alternatives the allocator took.
func subrequests(c *resourceapi.ResourceClaim) []string {
	var out []string
	if c.Status.Allocation == nil {
		return nil
	}
	for _, res := range c.Status.Allocation.Devices.Results {
		if _, sub, ok := strings.Cut(res.Request, "/"); ok {
			out = append(out, sub)
		}
	}
	return out
}

// check compares what the pod got with its expect-* annotations.
func (r *runner) check(pod *corev1.Pod, ids []string) []string {
	var problems []string
	ann := pod.Annotations
	devs := make([]resourceapi.Device, 0, len(ids))
	for _, id := range ids {
		devs = append(devs, r.slices[id])
	}
	each := func(key string, attrName gpuv1alpha1.AttributeName) {
		want, ok := ann[prefix+key]
		if !ok {
			return
		}
		for i, d := range devs {
			if got := attr(d, attrName); got != want {
				problems = append(problems, fmt.Sprintf("%s: %s is %q, want %q", ids[i], attrName, got, want))
			}
		}
		if len(devs) == 0 {
			problems = append(problems, fmt.Sprintf("no GPU, want %s %q", attrName, want))
		}
	}
	each("expect-product", gpuv1alpha1.ProductNameAttribute)
	each("expect-class", gpuv1alpha1.BandwidthClassAttribute)
	if want, ok := ann[prefix+"expect-gpus"]; ok && want != strconv.Itoa(len(ids)) {
		problems = append(problems, fmt.Sprintf("got %d GPUs, want %s", len(ids), want))
	}
	if want, ok := ann[prefix+"expect-node"]; ok && want != pod.Spec.NodeName {
		problems = append(problems, fmt.Sprintf("on node %s, want %s", pod.Spec.NodeName, want))
	}
	if ann[prefix+"expect-same-nvlink-domain"] == "true" {
		var domains []string
		nodes := map[string]bool{}
		for i, d := range devs {
			domains = append(domains, attr(d, gpuv1alpha1.NVLinkDomainAttribute))
			nodes[strings.Split(ids[i], "/")[0]] = true
		}
		if len(devs) < 2 || len(uniq(domains)) != 1 || slices.Contains(domains, "") || len(nodes) != 1 {
			problems = append(problems, fmt.Sprintf("NVLink domains %v of %v, want one shared domain", domains, ids))
		}
	}
	if want, ok := ann[prefix+"expect-why"]; ok {
		claims, _ := r.podClaims(context.Background(), pod)
		var whys []string
		for _, c := range claims {
			whys = append(whys, why(pod, c))
		}
		if got := strings.Join(whys, "; "); !strings.Contains(got, want) {
			problems = append(problems, fmt.Sprintf("placement reason %q lacks %q", got, want))
		}
	}
	if want, ok := ann[prefix+"expect-not-device"]; ok {
		for _, id := range ids {
			if id == want || strings.SplitN(id, "/", 2)[1] == want {
				problems = append(problems, fmt.Sprintf("got %s, want any GPU but %s", id, want))
			}
		}
		if len(ids) == 0 {
			problems = append(problems, fmt.Sprintf("no GPU, want one other than %s", want))
		}
	}
	if want, ok := ann[prefix+"expect-memory-share"]; ok {
		problems = append(problems, r.checkMemoryShare(pod, want)...)
	}
	if want, ok := ann[prefix+"expect-config"]; ok {
		claims, _ := r.podClaims(context.Background(), pod)
		found := false
		for _, c := range claims {
			if c.Status.Allocation == nil {
				continue
			}
			for _, cfg := range c.Status.Allocation.Devices.Config {
				if cfg.Opaque != nil && bytes.Contains(cfg.Opaque.Parameters.Raw, []byte(want)) {
					found = true
				}
			}
		}
		if !found {
			problems = append(problems, fmt.Sprintf("allocation carries no opaque config with %q", want))
		}
	}
	for k := range ann {
		if strings.HasPrefix(k, prefix+"expect-") && !slices.Contains(knownExpectations, k[expectPrefixLen:]) {
			problems = append(problems, "unknown expectation "+k)
		}
	}
	return problems
}

var knownExpectations = []string{"product", "class", "gpus", "node", "same-gpu-as", "different-gpu-from", "same-nvlink-domain", "config", "why", "memory-share", "not-device"}

// checkMemoryShare: every Prism device of the pod's claims is a share
// (allocation with a shareID) consuming want of gpu.prism.dev/memory.
func (r *runner) checkMemoryShare(pod *corev1.Pod, want string) []string {
	q, err := resource.ParseQuantity(want)
	if err != nil {
		return []string{fmt.Sprintf("expect-memory-share %q: %v", want, err)}
	}
	claims, err := r.podClaims(context.Background(), pod)
	if err != nil {
		return []string{err.Error()}
	}
	var problems []string
	n := 0
	for _, c := range claims {
		if c.Status.Allocation == nil {
			continue
		}
		for _, res := range c.Status.Allocation.Devices.Results {
			if res.Driver != gpuv1alpha1.DriverName {
				continue
			}
			n++
			got, ok := res.ConsumedCapacity[gpuv1alpha1.MemoryCapacity.Qualified()]
			switch {
			case res.ShareID == nil:
				problems = append(problems, fmt.Sprintf("%s/%s: allocation has no shareID, want a %s share", res.Pool, res.Device, want))
			case !ok:
				problems = append(problems, fmt.Sprintf("%s/%s: allocation consumes no %s, want %s", res.Pool, res.Device, gpuv1alpha1.MemoryCapacity.Qualified(), want))
			case got.Cmp(q) != 0:
				problems = append(problems, fmt.Sprintf("%s/%s: allocation consumes %s of %s, want %s", res.Pool, res.Device, got.String(), gpuv1alpha1.MemoryCapacity.Qualified(), want))
			}
		}
	}
	if n == 0 {
		problems = append(problems, "no GPU, want a "+want+" memory share")
	}
	return problems
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

// standIn plays the profiled container: the plugin prepared the claim with
// profiling and collects <state-dir>/profiles/<claim UID>/report.csv when
// the claim is unprepared.
func (r *runner) standIn(ctx context.Context, podName, report string) (string, error) {
	pod, err := r.client.CoreV1().Pods(Namespace).Get(ctx, podName, metav1.GetOptions{})
	if err != nil {
		return "", err
	}
	claims, err := r.podClaims(ctx, pod)
	if err != nil || len(claims) != 1 {
		return "", fmt.Errorf("stand-in: want one claim on the pod (%v)", err)
	}
	claim := claims[0]
	profile := claim.Annotations[profileAnnot]
	if profile == "" {
		return "", fmt.Errorf("stand-in: claim %s has no %s annotation", claim.Name, profileAnnot)
	}
	stateDir, ok := r.env.StateDirs[pod.Spec.NodeName]
	if !ok {
		return "", fmt.Errorf("stand-in: no plugin state directory known for node %s", pod.Spec.NodeName)
	}
	dir := profiling.ClaimDir(stateDir, string(claim.UID))
	if _, err := os.Stat(dir); err != nil {
		return "", fmt.Errorf("stand-in: the plugin did not prepare profiling for claim %s: %w", claim.Name, err)
	}
	data, err := os.ReadFile(filepath.Join(r.env.RepoRoot, report))
	if err != nil {
		return "", err
	}
	if err := os.WriteFile(filepath.Join(dir, profiling.ReportFile), data, 0o644); err != nil {
		return "", err
	}
	r.logf("  stand-in for the profiled container: wrote %s into %s, deleting pod %s", report, dir, podName)
	zero := int64(0)
	if err := r.client.CoreV1().Pods(Namespace).Delete(ctx, podName, metav1.DeleteOptions{GracePeriodSeconds: &zero}); err != nil {
		return "", err
	}
	var bound string
	err = wait.PollUntilContextTimeout(ctx, 250*time.Millisecond, profileTimeout, true, func(ctx context.Context) (bool, error) {
		wp, err := r.dyn.Resource(workloadProfiles).Namespace(Namespace).Get(ctx, profile, metav1.GetOptions{})
		if err != nil {
			return false, nil
		}
		bound, _, _ = unstructured.NestedString(wp.Object, "status", "boundType")
		return bound != "", nil
	})
	if err != nil {
		return "", fmt.Errorf("stand-in: no WorkloadProfile %s with a status after unprepare: %w", profile, err)
	}
	r.logf("  WorkloadProfile %s created by the plugin: %s", profile, bound)
	if err := r.waitControllerSees(ctx, profile); err != nil {
		return "", err
	}
	return fmt.Sprintf("profiled, then deleted: WorkloadProfile %s is %s", profile, bound), nil
}

// Print writes the results table and a verdict per scenario.
func (rs Results) Print(w io.Writer) {
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "SCENARIO\tPOD\tNODE\tGPU\tCLASS\tWHY\tRESULT")
	for _, s := range rs.Scenarios {
		if len(s.Rows) == 0 {
			fmt.Fprintf(tw, "%s\t-\t-\t-\t-\t-\t%s\n", s.File, verdict(s.Passed()))
		}
		for i, row := range s.Rows {
			name := s.File
			if i > 0 {
				name = ""
			}
			res := verdict(len(row.Problems) == 0)
			if row.Note != "" {
				res += " (" + row.Note + ")"
			}
			fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%s\t%s\n", name, row.Pod, row.Node, row.GPU, row.Class, row.Why, res)
		}
	}
	tw.Flush()
	fmt.Fprintln(w)
	passed := 0
	for _, s := range rs.Scenarios {
		if s.Passed() {
			passed++
		}
		fmt.Fprintf(w, "%s  %-28s %s (%s)\n", verdict(s.Passed()), s.File, s.Title, s.Duration.Round(100*time.Millisecond))
		if s.Err != nil {
			fmt.Fprintf(w, "        error: %v\n", s.Err)
		}
		for _, row := range s.Rows {
			for _, p := range row.Problems {
				fmt.Fprintf(w, "        %s: %s\n", row.Pod, p)
			}
		}
	}
	fmt.Fprintf(w, "\n%d/%d scenarios passed in %s\n", passed, len(rs.Scenarios), rs.Duration.Round(100*time.Millisecond))
}

func verdict(ok bool) string {
	if ok {
		return "PASS"
	}
	return "FAIL"
}
