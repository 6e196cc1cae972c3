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

package soak

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"math/rand/v2"
	"os"
	"path/filepath"
	"time"

	corev1 "k8s.io/api/core/v1"
	resourceapi "k8s.io/api/resource/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	pkgruntime "k8s.io/apimachinery/pkg/runtime"
	"k8s.io/utils/ptr"

	gpuv1alpha1 "github.com/prismgpu/prism/api/gpu/v1alpha1"
	prismv1alpha1 "github.com/prismgpu/prism/api/prism/v1alpha1"
	"github.com/prismgpu/prism/internal/plugin/profiling"
)

// shareMemory is what a shared run asks of a GPU's memory.
const shareMemory = "8Gi"

// runKinds are the pods the churn makes, each as likely.
var runKinds = []string{"exclusive", "shared", "profiled"}

// Time limits of one run: how long a pod may take to start before it must
// say why it has not, and how long a deleted one may take to go.
const (
	startWithin  = 3 * time.Minute
	deleteWithin = 3 * time.Minute
)

// churn runs one pod after another until ctx ends. Deleting the last one
// uses base, so that a pod is not left behind when the soak's time is up.
func (s *soak) churn(ctx, base context.Context, rng *rand.Rand) {
	for ctx.Err() == nil {
		kind := runKinds[rng.IntN(len(runKinds))]
		lifetime := 5*time.Second + time.Duration(rng.Int64N(int64(25*time.Second)))
		s.runOne(ctx, base, kind, lifetime)
		sleep(ctx, time.Duration(rng.Int64N(int64(2*time.Second))))
	}
}

// runOne creates a pod of the kind, lets it run for lifetime and deletes
// it. A profiled run stands in for ncu: it writes a report into its
// claim's report directory before the pod goes.
func (s *soak) runOne(ctx, base context.Context, kind string, lifetime time.Duration) {
	name := fmt.Sprintf("%s-%d", kind, s.seq.Add(1))
	template := kind
	if kind == "profiled" {
		template = name
		if err := s.createProfiledTemplate(base, name, name); err != nil {
			s.violate("churn", "api", "create template %s: %v", name, err)
			return
		}
		defer s.deleteTemplate(base, name)
	}
	if err := s.createPod(base, pod(name, template, ""), time.Minute); err != nil {
		s.violate("churn", "api", "create pod %s: %v", name, err)
		return
	}
	s.count(func(c *Counts) { c.Created++ })
	running, err := s.waitRunning(ctx, name, startWithin)
	var digest string
	switch {
	case running != nil:
		s.count(func(c *Counts) { c.Ran++ })
		if kind == "profiled" {
			if digest, err = s.writeReport(base, running); err != nil {
				s.violate("churn", "profile", "write %s's report: %v", name, err)
			}
		}
		sleep(ctx, lifetime)
	case ctx.Err() == nil:
		s.count(func(c *Counts) { c.Waited++ })
		s.explained(base, "churn", name, err)
	}
	if !s.deletePod(base, "churn", name) {
		return
	}
	if digest != "" {
		s.mu.Lock()
		s.finished = append(s.finished, finishedRun{profile: name, digest: digest, at: time.Now()})
		s.mu.Unlock()
	}
}

func pod(name, template, node string) *corev1.Pod {
	p := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: Namespace},
		Spec: corev1.PodSpec{
			HostNetwork: true,
			// A graceful deletion, as most are: with none, the API server
			// drops the pod, and its claim's allocation, before the kubelet
			// has unprepared it.
			TerminationGracePeriodSeconds: ptr.To[int64](1),
			ResourceClaims:                []corev1.PodResourceClaim{{Name: "gpu", ResourceClaimTemplateName: ptr.To(template)}},
			Containers: []corev1.Container{{
				Name: "cuda", Image: "registry.k8s.io/pause:3.10",
				Resources: corev1.ResourceRequirements{Claims: []corev1.ResourceClaim{{Name: "gpu"}}},
			}},
		},
	}
	if node != "" {
		p.Spec.NodeSelector = map[string]string{corev1.LabelHostname: node}
	}
	return p
}

// createPod creates p, trying again for up to within while the API server
// is away; a pod that already exists was made by an earlier try.
func (s *soak) createPod(ctx context.Context, p *corev1.Pod, within time.Duration) error {
	return retry(ctx, within, func() error {
		_, err := s.client.CoreV1().Pods(Namespace).Create(ctx, p, metav1.CreateOptions{})
		return ignoreExists(err)
	})
}

// gpuSpec asks for one GPU, whole, or a share of memory when memory is set.
func gpuSpec(memory string) resourceapi.ResourceClaimSpec {
	req := resourceapi.ExactDeviceRequest{DeviceClassName: gpuv1alpha1.DriverName}
	if memory != "" {
		req.Capacity = &resourceapi.CapacityRequirements{Requests: map[resourceapi.QualifiedName]resource.Quantity{
			gpuv1alpha1.MemoryCapacity.Qualified(): resource.MustParse(memory),
		}}
	}
	return resourceapi.ResourceClaimSpec{Devices: resourceapi.DeviceClaim{Requests: []resourceapi.DeviceRequest{{Name: "gpu", Exactly: &req}}}}
}

// createProfiledTemplate makes a one-GPU template whose claims name profile
// and ask for profiling.
func (s *soak) createProfiledTemplate(ctx context.Context, name, profile string) error {
	spec := gpuSpec("")
	spec.Devices.Config = []resourceapi.DeviceClaimConfiguration{{DeviceConfiguration: resourceapi.DeviceConfiguration{
		Opaque: &resourceapi.OpaqueDeviceConfiguration{Driver: gpuv1alpha1.DriverName, Parameters: pkgruntime.RawExtension{
			Raw: []byte(`{"apiVersion":"gpu.prism.dev/v1alpha1","kind":"GpuConfig","profiling":{"enabled":true}}`),
		}},
	}}}
	return retry(ctx, time.Minute, func() error {
		_, err := s.client.ResourceV1().ResourceClaimTemplates(Namespace).Create(ctx, &resourceapi.ResourceClaimTemplate{
			ObjectMeta: metav1.ObjectMeta{Name: name},
			Spec: resourceapi.ResourceClaimTemplateSpec{
				ObjectMeta: metav1.ObjectMeta{Annotations: map[string]string{prismv1alpha1.ProfileAnnotation: profile}},
				Spec:       spec,
			},
		}, metav1.CreateOptions{})
		return ignoreExists(err)
	})
}

func (s *soak) deleteTemplate(ctx context.Context, name string) {
	_ = retry(ctx, time.Minute, func() error {
		err := s.client.ResourceV1().ResourceClaimTemplates(Namespace).Delete(ctx, name, metav1.DeleteOptions{})
		if apierrors.IsNotFound(err) {
			return nil
		}
		return err
	})
}

// waitRunning waits for the pod to run and returns it; API errors while a
// fault lasts are waited out.
func (s *soak) waitRunning(ctx context.Context, name string, timeout time.Duration) (*corev1.Pod, error) {
	deadline := time.Now().Add(timeout)
	var last error
	for time.Now().Before(deadline) {
		p, err := s.client.CoreV1().Pods(Namespace).Get(ctx, name, metav1.GetOptions{})
		switch {
		case err != nil:
			last = err
		case p.Status.Phase == corev1.PodRunning:
			return p, nil
		case p.Status.Phase != corev1.PodPending:
			return nil, fmt.Errorf("pod ended in phase %s", p.Status.Phase)
		}
		if !sleep(ctx, 250*time.Millisecond) {
			return nil, ctx.Err()
		}
	}
	if last == nil {
		last = errors.New("not running in time")
	}
	return nil, last
}

// explained checks that a pod which did not run says why: a condition or
// a waiting container with a message. A pod that just waits, silent, is
// what an operator cannot act on.
func (s *soak) explained(ctx context.Context, after, name string, waitErr error) {
	var p *corev1.Pod
	if err := retry(ctx, time.Minute, func() error {
		var err error
		p, err = s.client.CoreV1().Pods(Namespace).Get(ctx, name, metav1.GetOptions{})
		return err
	}); err != nil {
		s.violate(after, "pods", "pod %s not running (%v) and not readable: %v", name, waitErr, err)
		return
	}
	if why := reason(p); why == "" {
		s.violate(after, "pods", "pod %s in phase %s for %s with no reason given", name, p.Status.Phase, startWithin)
	} else {
		s.logf("pod %s did not start in %s: %s", name, startWithin, why)
	}
}

// reason is what a pending pod says about why it waits, empty if nothing.
func reason(p *corev1.Pod) string {
	for _, c := range p.Status.Conditions {
		if c.Status != corev1.ConditionTrue && c.Message != "" {
			return fmt.Sprintf("%s: %s", c.Reason, c.Message)
		}
	}
	for _, cs := range p.Status.ContainerStatuses {
		if w := cs.State.Waiting; w != nil && w.Message != "" {
			return fmt.Sprintf("%s: %s", w.Reason, w.Message)
		}
	}
	return ""
}

// deletePod deletes the pod and waits until it is gone; a pod that stays
// is a violation.
func (s *soak) deletePod(ctx context.Context, after, name string) bool {
	err := retry(ctx, deleteWithin, func() error {
		err := s.client.CoreV1().Pods(Namespace).Delete(ctx, name, metav1.DeleteOptions{})
		if err != nil && !apierrors.IsNotFound(err) {
			return err
		}
		_, err = s.client.CoreV1().Pods(Namespace).Get(ctx, name, metav1.GetOptions{})
		if apierrors.IsNotFound(err) {
			return nil
		}
		if err == nil {
			err = errors.New("still there")
		}
		return err
	})
	if err != nil {
		if ctx.Err() == nil {
			s.violate(after, "pods", "pod %s not gone %s after its deletion: %v", name, deleteWithin, err)
		}
		return false
	}
	if after == "churn" {
		s.count(func(c *Counts) { c.Deleted++ })
	}
	return true
}

// claimDir is the report directory of the running pod's claim on its node.
func (s *soak) claimDir(ctx context.Context, p *corev1.Pod) (string, error) {
	if len(p.Status.ResourceClaimStatuses) == 0 || p.Status.ResourceClaimStatuses[0].ResourceClaimName == nil {
		return "", fmt.Errorf("pod %s names no claim", p.Name)
	}
	var claim *resourceapi.ResourceClaim
	if err := retry(ctx, time.Minute, func() error {
		var err error
		claim, err = s.client.ResourceV1().ResourceClaims(Namespace).Get(ctx, *p.Status.ResourceClaimStatuses[0].ResourceClaimName, metav1.GetOptions{})
		return err
	}); err != nil {
		return "", err
	}
	stateDir, ok := s.bed.StateDirs[p.Spec.NodeName]
	if !ok {
		return "", fmt.Errorf("pod %s runs on %q, which has no plugin", p.Name, p.Spec.NodeName)
	}
	return profiling.ClaimDir(stateDir, string(claim.UID)), nil
}

// writeReport writes ncu's report of a vector add into the pod's report
// directory, as the profiled container would, and returns its digest.
func (s *soak) writeReport(ctx context.Context, p *corev1.Pod) (string, error) {
	dir, err := s.claimDir(ctx, p)
	if err != nil {
		return "", err
	}
	report, err := os.ReadFile(filepath.Join(s.opts.RepoRoot, "pkg", "ncu", "testdata", "vectoradd_raw.csv"))
	if err != nil {
		return "", err
	}
	// A run of its own: the digest tells this run's report from another's.
	// ncu's own lines come before the CSV, so one more is read as theirs.
	report = append(fmt.Appendf(nil, "==PROF== soak run %s\n", p.Name), report...)
	if err := os.WriteFile(filepath.Join(dir, profiling.ReportFile), report, 0o644); err != nil {
		return "", err
	}
	sum := sha256.Sum256(report)
	return hex.EncodeToString(sum[:]), nil
}
