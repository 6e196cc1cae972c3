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

package plugin

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"time"

	corev1 "k8s.io/api/core/v1"
	resourceapi "k8s.io/api/resource/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/record"
	"k8s.io/klog/v2"
	cdispec "tags.cncf.io/container-device-interface/specs-go"

	gpuv1alpha1 "github.com/prismgpu/prism/api/gpu/v1alpha1"
	prismv1alpha1 "github.com/prismgpu/prism/api/prism/v1alpha1"
	"github.com/prismgpu/prism/internal/plugin/checkpoint"
	"github.com/prismgpu/prism/internal/plugin/profiling"
	"github.com/prismgpu/prism/pkg/profile"
)

// ProfilingConfig is what the plugin needs to profile claims.
type ProfilingConfig struct {
	// Host paths of the ncu install and the compiled preload shim.
	Options profiling.Options
	// Publisher writes collected reports to WorkloadProfiles.
	Publisher *profiling.Publisher
	// Retention is how many raw reports are kept on the node.
	Retention int
	// ProcRoot is where the NVIDIA driver's parameters are read, to warn
	// when counters are restricted; "/proc" on a real node.
	ProcRoot string
}

// profiler runs the workloads of claims that ask for it under ncu: it
// edits their containers at prepare, sets their reports aside at unprepare
// and collects, publishes and archives them afterwards (collections).
type profiler struct {
	// cfg is nil where the node does not profile.
	cfg      *ProfilingConfig
	gpus     *nodeGPUs
	kube     kubernetes.Interface
	recorder record.EventRecorder
	node     *corev1.ObjectReference
	metrics  *Metrics
	jobs     *collections
}

// checkQuota decides once, at start, whether the report
// directories of profiled claims are size-limited tmpfs mounts. Where the
// plugin may not mount (an unprivileged container) they are plain
// directories: saying so once here beats failing every profiled claim, and
// Collect still reads them within its budget.
func (pr *profiler) checkQuota(ctx context.Context) {
	if pr.cfg == nil {
		return
	}
	logger := klog.FromContext(ctx)
	p := *pr.cfg
	if p.Options.DirSize == 0 {
		logger.Info("Report directories of profiled claims are not size-limited (--profile-dir-size=0)", "stateDir", p.Options.StateDir)
		return
	}
	if err := profiling.CheckQuota(p.Options.StateDir); err != nil {
		logger.Error(err, "Report directories of profiled claims are not size-limited; a profiled container can fill the state directory's file system", "stateDir", p.Options.StateDir)
		pr.recorder.Eventf(pr.node, corev1.EventTypeWarning, "ProfilingQuotaUnavailable",
			"Report directories of profiled claims on node %s are not size-limited, so a profiled container can fill %s: %v", pr.node.Name, p.Options.StateDir, err)
		p.Options.DirSize = 0
		// A copy: the caller's configuration is not the driver's to change.
		pr.cfg = &p
		return
	}
	logger.Info("Report directories of profiled claims are size-limited", "bytes", p.Options.DirSize)
}

// edits are the CDI edits that run the claim's workload under ncu.
func (pr *profiler) edits(ctx context.Context, rec checkpoint.Claim) (*cdispec.ContainerEdits, error) {
	if pr.cfg == nil {
		return nil, fmt.Errorf("claim %s was prepared for profiling, which is now disabled on this node", rec.UID)
	}
	var cfg gpuv1alpha1.GpuProfiling
	if err := json.Unmarshal(rec.Profiling.Config, &cfg); err != nil {
		return nil, fmt.Errorf("read recorded profiling config: %w", err)
	}
	edits, err := profiling.Prepare(ctx, pr.cfg.Options, rec.UID, &cfg)
	if err != nil {
		return nil, fmt.Errorf("prepare profiling: %w", err)
	}
	return edits, nil
}

// release sets a profiled claim's report directory aside, under the
// driver lock, and queues the job of collecting, publishing and archiving
// it, which runs after the unprepare has returned (see collections). It
// does nothing when there is nothing to collect, for example when an
// earlier unprepare of the claim got that far.
func (pr *profiler) release(ctx context.Context, rec checkpoint.Claim) {
	if pr.cfg == nil {
		return
	}
	job := profiling.Job{
		Claim:   prismv1alpha1.ClaimReference{Namespace: rec.Namespace, Name: rec.Name, UID: types.UID(rec.UID)},
		Profile: rec.Profiling.Profile,
	}
	if len(rec.Devices) > 0 {
		if dev, ok := pr.gpus.get(rec.Devices[0].Name); ok {
			job.Device = prismv1alpha1.ProfiledDevice{ProductName: dev.ProductName, ComputeCapability: dev.CUDAComputeCapability.String()}
		}
	}
	dir, err := profiling.Detach(pr.cfg.Options.StateDir, job)
	if err != nil {
		klog.FromContext(ctx).Error(err, "Setting the report of a profiled claim aside; it is not collected", "claim", rec.Namespace+"/"+rec.Name)
		return
	}
	if dir == "" {
		return
	}
	job.Dir = dir
	pr.queue(ctx, job)
}

// collect turns the report a job names into its WorkloadProfile.
// Nothing here fails the claim, which is gone: problems end up in the
// profile's conditions and the logs. It returns what Collect said of the
// report, and the error of a publish worth trying again.
func (pr *profiler) collect(ctx context.Context, job profiling.Job) (collectErr, publishErr error) {
	logger := klog.FromContext(ctx)
	claim := prismv1alpha1.ClaimReference{Namespace: job.Claim.Namespace, Name: job.Claim.Name}
	opts := profile.Options{
		Source: &prismv1alpha1.ProfileSource{Type: prismv1alpha1.ProfileSourceResourceClaim, ResourceClaim: &claim},
		Device: job.Device,
	}
	st, collectErr := profiling.Collect(ctx, job.Dir, opts)
	if collectErr != nil {
		logger.Info("Profiled claim left no usable report", "reason", collectErr.Error())
	}
	switch {
	case job.Profile == "":
		logger.Info("Profiled claim names no WorkloadProfile (annotation prism.dev/profile); keeping only the raw report")
	case pr.cfg.Publisher != nil:
		publishErr = pr.cfg.Publisher.Publish(ctx, profiling.Result{Claim: claim, Profile: job.Profile, Status: st, Err: collectErr})
		if publishErr == nil {
			logger.Info("Published WorkloadProfile from the claim's ncu report")
		}
	}
	return collectErr, publishErr
}

// profilingOutcome is the metric label for what collecting a report gave.
func profilingOutcome(collectErr error) string {
	if collectErr == nil {
		return "ReportCollected"
	}
	if ce, ok := errors.AsType[*profiling.CollectError](collectErr); ok {
		return string(ce.Reason)
	}
	return "CollectFailed"
}

// warnIfForbidden tells the claim's author, before the run rather
// than after a failed one, that ncu will fail with ERR_NVGPUCTRPERM: the
// driver restricts the counters and no container of the pod may read them.
// Prepare still proceeds; the workload runs, only unprofiled.
func (pr *profiler) warnIfForbidden(ctx context.Context, claim *resourceapi.ResourceClaim) {
	procRoot := pr.cfg.ProcRoot
	if procRoot == "" {
		return
	}
	restricted, err := profiling.DriverRestrictsProfiling(procRoot)
	if err != nil || !restricted {
		return
	}
	for _, ref := range claim.Status.ReservedFor {
		if ref.Resource != "pods" {
			continue
		}
		pod, err := pr.getPod(ctx, claim.Namespace, ref.Name)
		if err != nil {
			// A 403 here is a chart without "pods get": say so, or the
			// warning silently never comes.
			klog.FromContext(ctx).Error(err, "Cannot check whether the profiled pod may read GPU counters", "pod", klog.KRef(claim.Namespace, ref.Name))
			pr.recorder.Eventf(claim, corev1.EventTypeWarning, "ProfilingPermissionUnknown",
				"Could not check whether pod %s may read GPU performance counters on node %s: %v", ref.Name, pr.node.Name, err)
			continue
		}
		if profiling.PodMayProfile(pod) {
			continue
		}
		pr.recorder.Eventf(claim, corev1.EventTypeWarning, "ProfilingNotPermitted",
			"Pod %s cannot read GPU performance counters: the NVIDIA driver on node %s sets RestrictProfilingToAdminUsers=1. "+
				"Add capabilities: {add: [SYS_ADMIN]} to the profiled container. (NVreg_RestrictProfilingToAdminUsers=0 on the node would also do, but lets every user there read the performance counters of other users' GPU work.)", ref.Name, pr.node.Name)
	}
}

// apiCallTimeout bounds an API call made under the driver lock, so that a
// slow API server delays one claim rather than every claim on the node.
const apiCallTimeout = 10 * time.Second

func (pr *profiler) getPod(ctx context.Context, namespace, name string) (*corev1.Pod, error) {
	ctx, cancel := context.WithTimeout(ctx, apiCallTimeout)
	defer cancel()
	pod, err := pr.kube.CoreV1().Pods(namespace).Get(ctx, name, metav1.GetOptions{})
	if err != nil {
		return nil, fmt.Errorf("get pod %s/%s: %w", namespace, name, err)
	}
	return pod, nil
}
