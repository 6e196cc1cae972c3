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

package scenario

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"time"

	resourceapi "k8s.io/api/resource/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/dynamic"

	prismv1alpha1 "github.com/prismgpu/prism/api/prism/v1alpha1"
	"github.com/prismgpu/prism/internal/plugin/profiling"
	"github.com/prismgpu/prism/pkg/rewrite"
)

var workloadProfiles = schema.GroupVersionResource{Group: "prism.dev", Version: "v1alpha1", Resource: "workloadprofiles"}

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
		var plan rewrite.Plan
		_ = json.Unmarshal([]byte(out.Annotations[rewrite.AnnotationKey]), &plan)
		return plan.BoundType != "" && plan.BoundType != prismv1alpha1.BoundTypeUnknown, nil
	})
	if err != nil {
		return fmt.Errorf("prism-controller does not rewrite for profile %s: %w", profile, err)
	}
	return nil
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
