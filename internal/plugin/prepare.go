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
	"slices"
	"strings"

	corev1 "k8s.io/api/core/v1"
	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/dynamic-resource-allocation/kubeletplugin"
	"k8s.io/klog/v2"
	"k8s.io/utils/ptr"
	cdispec "tags.cncf.io/container-device-interface/specs-go"

	gpuv1alpha1 "github.com/prismgpu/prism/api/gpu/v1alpha1"
	prismv1alpha1 "github.com/prismgpu/prism/api/prism/v1alpha1"
	"github.com/prismgpu/prism/internal/plugin/cdi"
	"github.com/prismgpu/prism/internal/plugin/checkpoint"
	"github.com/prismgpu/prism/internal/plugin/profiling"
	"github.com/prismgpu/prism/pkg/gpu"
)

// prepareClaims takes every claim of a call through the same steps at
// once: plan, record PrepareStarted, write CDI specs, record
// PrepareCompleted with one fsync. A claim that fails a step leaves the
// batch and has its record removed; the others go on.
func (s *deviceState) prepareClaims(ctx context.Context, claims []*resourceapi.ResourceClaim) map[types.UID]kubeletplugin.PrepareResult {
	results := make(map[types.UID]kubeletplugin.PrepareResult, len(claims))
	fail := func(claim *resourceapi.ResourceClaim, reason string, err error) {
		s.metrics.claimErrors.WithLabelValues("prepare", reason).Inc()
		results[claim.UID] = kubeletplugin.PrepareResult{Err: fmt.Errorf("prepare claim %s/%s: %w", claim.Namespace, claim.Name, err)}
	}
	s.guard.lock(ctx)
	defer s.guard.unlock()
	if err := s.guard.sync(ctx); err != nil {
		for _, claim := range claims {
			fail(claim, "checkpoint", err)
		}
		return results
	}

	type pending struct {
		claim *resourceapi.ResourceClaim
		rec   checkpoint.Claim
	}
	var batch []pending
	var planned []checkpoint.Claim
	endPlan := span(ctx, StagePlan)
	for _, claim := range claims {
		uid := string(claim.UID)
		if prev, ok := s.checkpoint.Get(uid); ok && prev.State == checkpoint.PrepareCompleted {
			results[claim.UID] = kubeletplugin.PrepareResult{Devices: kubeletDevices(prev)}
			continue
		} else if ok {
			// A retried prepare first undoes what its interrupted attempt
			// made, so that its partitions are free to create again.
			if err := s.partitions.destroy(ctx, prev); err != nil {
				fail(claim, "mig", err)
				continue
			}
		}
		rec, err := s.plan(ctx, claim)
		if err != nil {
			fail(claim, "invalid", err)
			continue
		}
		// Claims earlier in this call hold their devices as if recorded.
		if err := s.checkExclusive(uid, rec.Devices, planned); err != nil {
			fail(claim, "conflict", err)
			continue
		}
		if err := s.partitions.checkPlacements(ctx, uid, rec.Devices, planned); err != nil {
			fail(claim, "mig", err)
			continue
		}
		rec.State = checkpoint.PrepareStarted
		batch = append(batch, pending{claim: claim, rec: rec})
		planned = append(planned, rec)
	}
	endPlan()
	if len(batch) == 0 {
		return results
	}

	// Phase one: the devices are claimed before anything exists on disk, so a
	// crash from here on leaves a record that start-up reconciliation undoes.
	// It is not fsynced: only a power loss could lose it, and then the CDI
	// spec it would have explained is an orphan that reconciliation removes
	// (and /var/run/cdi is gone with the reboot anyway).
	if err := s.checkpoint.PutClaims(ctx, false, planned...); err != nil {
		for _, p := range batch {
			fail(p.claim, "checkpoint", fmt.Errorf("record prepare start: %w", err))
		}
		return results
	}
	crashPoint(CrashAfterPrepareStarted)

	var done []checkpoint.Claim
	var undo []string
	for _, p := range batch {
		uid := string(p.claim.UID)
		if err := s.partitions.create(ctx, &p.rec); err != nil {
			fail(p.claim, "mig", err)
			if !errors.Is(err, errMIGLeft) {
				undo = append(undo, uid)
			}
			continue
		}
		endCDI := span(ctx, StageCDIWrite)
		err := s.writeSpec(ctx, p.rec)
		endCDI()
		if err != nil {
			err = s.partitions.undo(ctx, p.rec, err)
			fail(p.claim, "cdi", err)
			if !errors.Is(err, errMIGLeft) {
				undo = append(undo, uid)
			}
			continue
		}
		s.shares.start(ctx, p.claim, p.rec)
		if err := s.timeSlices.set(ctx, p.rec, nil); err != nil {
			err = s.partitions.undo(ctx, p.rec, errors.Join(err, s.cdi.RemoveClaimSpec(ctx, uid)))
			fail(p.claim, "timeslice", err)
			if !errors.Is(err, errMIGLeft) {
				undo = append(undo, uid)
			}
			continue
		}
		p.rec.State = checkpoint.PrepareCompleted
		done = append(done, p.rec)
	}
	crashPoint(CrashAfterCDIWritten)
	if len(undo) > 0 {
		if err := s.forget(ctx, undo...); err != nil {
			for _, p := range batch {
				if slices.Contains(undo, string(p.claim.UID)) {
					res := results[p.claim.UID]
					res.Err = errors.Join(res.Err, err)
					results[p.claim.UID] = res
				}
			}
		}
	}
	if len(done) == 0 {
		return results
	}

	// Phase two, one fsync for the whole call: the kubelet is told the
	// claims are ready only once their records are on disk.
	if err := s.checkpoint.PutClaims(ctx, true, done...); err != nil {
		for _, rec := range done {
			s.metrics.claimErrors.WithLabelValues("prepare", "checkpoint").Inc()
			results[types.UID(rec.UID)] = kubeletplugin.PrepareResult{Err: fmt.Errorf("prepare claim %s/%s: record prepare completion: %w", rec.Namespace, rec.Name, err)}
		}
		return results
	}
	crashPoint(CrashAfterPrepareCompleted)
	for _, rec := range done {
		results[types.UID(rec.UID)] = kubeletplugin.PrepareResult{Devices: kubeletDevices(rec)}
	}
	if s.usage != nil {
		s.usage.Track(ctx, s.usageClaims(claims, done)...)
	}
	return results
}

// unprepareClaims removes the specs of a call's claims, then their records
// with one fsync. A claim whose spec cannot be removed keeps its record, so
// that the kubelet's retry finds it.
func (s *deviceState) unprepareClaims(ctx context.Context, claims []kubeletplugin.NamespacedObject) map[types.UID]error {
	results := make(map[types.UID]error, len(claims))
	s.guard.lock(ctx)
	defer s.guard.unlock()
	if err := s.guard.sync(ctx); err != nil {
		for _, claim := range claims {
			results[claim.UID] = err
		}
		return results
	}
	releasing := map[string]bool{}
	for _, claim := range claims {
		releasing[string(claim.UID)] = true
	}
	var forget []string
	for _, claim := range claims {
		uid := string(claim.UID)
		rec, ok := s.checkpoint.Get(uid)
		endCDI := span(ctx, StageCDIRemove)
		err := s.cdi.RemoveClaimSpec(ctx, uid)
		endCDI()
		if !ok {
			// Nothing recorded; a spec can only exist if reconciliation has
			// not run yet, so removing it is cheap insurance.
			results[claim.UID] = err
			continue
		}
		if err != nil {
			s.metrics.claimErrors.WithLabelValues("unprepare", "cdi").Inc()
			results[claim.UID] = err
			continue
		}
		if err := s.partitions.destroy(ctx, rec); err != nil {
			s.metrics.claimErrors.WithLabelValues("unprepare", "mig").Inc()
			results[claim.UID] = err
			continue
		}
		if err := s.timeSlices.set(ctx, rec, releasing); err != nil {
			// The claim is going regardless; a GPU left on a long slice only
			// costs other workloads latency, so log and carry on.
			klog.FromContext(ctx).Error(err, "Resetting time slices of an unprepared claim")
		}
		if rec.Profiling != nil {
			s.profiler.release(ctx, rec)
		}
		forget = append(forget, uid)
	}
	crashPoint(CrashAfterCDIRemoved)
	if len(forget) == 0 {
		return results
	}
	if err := s.forget(ctx, forget...); err != nil {
		for _, uid := range forget {
			s.metrics.claimErrors.WithLabelValues("unprepare", "checkpoint").Inc()
			results[types.UID(uid)] = err
		}
		return results
	}
	crashPoint(CrashAfterUnprepared)
	if s.usage != nil {
		s.usage.Release(ctx, forget...)
	}
	for _, uid := range forget {
		results[types.UID(uid)] = nil
	}
	return results
}

// forget removes claims' records, fsynced.
func (s *deviceState) forget(ctx context.Context, uids ...string) error {
	if err := s.checkpoint.DeleteClaims(ctx, true, uids...); err != nil {
		return fmt.Errorf("remove claims %v from checkpoint: %w", uids, err)
	}
	s.shares.stopUnneeded(ctx)
	return nil
}

// plan turns the claim's allocation on this node into the checkpoint record
// that prepare will write, validating its configuration on the way.
func (s *deviceState) plan(ctx context.Context, claim *resourceapi.ResourceClaim) (checkpoint.Claim, error) {
	rec := checkpoint.Claim{UID: string(claim.UID), Namespace: claim.Namespace, Name: claim.Name}
	if claim.Status.Allocation == nil {
		return rec, errors.New("claim is not allocated")
	}
	configs, err := decodeConfigs(claim.Status.Allocation.Devices.Config)
	if err != nil {
		return rec, err
	}
	for _, result := range claim.Status.Allocation.Devices.Results {
		if result.Driver != gpuv1alpha1.DriverName || result.Pool != s.node.Name {
			continue
		}
		gpuDev, ok := s.gpus.get(result.Device)
		var migIntent *checkpoint.MIGInstance
		if !ok {
			var err error
			if gpuDev, migIntent, ok, err = s.partitions.intent(result.Device); err != nil {
				return rec, err
			}
		}
		if !ok {
			return rec, fmt.Errorf("device %s of request %s is not a GPU of node %s (was it removed?)", result.Device, result.Request, s.node.Name)
		}
		if reason, err := unmetHardNeed(claim, result.Request, result.Device, gpuDev); err != nil {
			s.recorder.Eventf(claim, corev1.EventTypeWarning, reason, "%v", err)
			return rec, err
		}
		cfg := configs.forRequest(result.Request)
		dev := checkpoint.Device{
			Requests:     []string{result.Request},
			Pool:         result.Pool,
			Name:         result.Device,
			CDIDeviceIDs: []string{cdi.DeviceID(rec.UID, result.Device)},
			MIG:          migIntent,
		}
		if migIntent != nil && (result.ShareID != nil || (cfg.Sharing != nil && cfg.Sharing.Strategy == gpuv1alpha1.TimeSlicingSharing)) {
			return rec, fmt.Errorf("device %s of request %s is a MIG partition, which cannot be shared; remove the sharing configuration", result.Device, result.Request)
		}
		if cfg.Sharing != nil && cfg.Sharing.Strategy != "" {
			dev.Sharing = &checkpoint.Sharing{Strategy: string(cfg.Sharing.Strategy)}
			if cfg.Sharing.TimeSlicing != nil {
				dev.Sharing.TimeSlice = string(cfg.Sharing.TimeSlicing.Interval)
			}
		}
		if result.ShareID != nil {
			// The scheduler allocated a share of the device: record how much
			// memory it counted, so the workload can be told its limit and
			// the guard below can add up shares.
			dev.ShareID = string(*result.ShareID)
			if dev.Sharing == nil {
				dev.Sharing = &checkpoint.Sharing{}
			}
			dev.Sharing.Share = gpuv1alpha1.ConsumedShare(result.ConsumedCapacity)
			if cfg.Sharing != nil {
				dev.Sharing.ComputeLimitPercent = dev.Sharing.Share.GrantedComputeLimit(cfg.Sharing.ComputeLimitPercent)
			}
		}
		// prism-validate refuses this at admission; a claim created while
		// it was down, or given the config by its DeviceClass, is refused
		// here, before the GPU's time slice, which the other shares run
		// under, is touched.
		if cfg.Sharing != nil && partOfGPU(dev, gpuDev) {
			if err := cfg.Sharing.Strategy.ShareConflict(); err != nil {
				return rec, fmt.Errorf("device %s of request %s is a share of the GPU (%s), and its GpuConfig sets sharing.strategy %s: %w; remove the sharing configuration, or ask for a whole GPU",
					result.Device, result.Request, dev.Sharing.Share, cfg.Sharing.Strategy, err)
			}
		}
		rec.Devices = append(rec.Devices, dev)
	}
	if len(rec.Devices) == 0 {
		return rec, fmt.Errorf("no device of driver %s on node %s is allocated to the claim", gpuv1alpha1.DriverName, s.node.Name)
	}
	s.shares.plan(claim, rec.Devices)
	// Said once here, where the claim is at hand; profiling and usage then
	// read the annotation as naming no profile. The claim's author saw the
	// controller's NotRewritten Event at creation already.
	profile, err := prismv1alpha1.ProfileName(claim.Annotations)
	if err != nil {
		klog.FromContext(ctx).Info("Claim's profile annotation is invalid: neither its GPU usage nor its profile is written to a WorkloadProfile", "claim", klog.KObj(claim), "err", err)
	}
	// Profiling wraps the claim's containers, so it is a claim-wide choice:
	// any request asking for it profiles the claim.
	for _, dev := range rec.Devices {
		cfg := configs.forRequest(dev.Requests[0])
		if cfg.Profiling == nil || !cfg.Profiling.Enabled {
			continue
		}
		// Profiling is a measurement, not a requirement: where this node
		// cannot profile, the workload runs unprofiled rather than not at all.
		unavailable := errors.New("profiling is disabled on this node (prism-kubelet-plugin --profiling=false)")
		if s.profiler.cfg != nil {
			unavailable = profiling.Available(s.profiler.cfg.Options)
		}
		if unavailable != nil {
			s.metrics.claimErrors.WithLabelValues("prepare", "profiling-unavailable").Inc()
			s.recorder.Eventf(claim, corev1.EventTypeWarning, "ProfilingUnavailable",
				"Running unprofiled on node %s: %v", s.node.Name, unavailable)
			break
		}
		// ncu serialises kernels and reads counters of the whole GPU: on a
		// shared GPU it would slow the other tenants and measure their work.
		if shared, how := s.sharedDevice(rec.Devices); shared != "" {
			s.metrics.claimErrors.WithLabelValues("prepare", "profiling-refused-shared").Inc()
			s.recorder.Eventf(claim, corev1.EventTypeWarning, "ProfilingRefusedSharedGPU",
				"Running unprofiled on node %s: device %s is allocated for sharing (%s), and profiling would slow down and measure the other workloads on it", s.node.Name, shared, how)
			break
		}
		s.profiler.warnIfForbidden(ctx, claim)
		raw, err := json.Marshal(cfg.Profiling)
		if err != nil {
			return rec, err
		}
		rec.Profiling = &checkpoint.Profiling{
			ReportDir: profiling.ClaimDir(s.profiler.cfg.Options.StateDir, rec.UID),
			Profile:   profile,
			Config:    raw,
		}
		break
	}
	return rec, nil
}

// sharedDevice names a device of the claim that other workloads may use at
// the same time, and how: a GPU set up for time-slicing, or a memory share
// that leaves room for others. A share of the whole GPU, which is what a
// claim that asks for no amount gets where GPUs are published shareable, is
// the GPU alone (checkExclusive admits no share beside it) and may be
// profiled.
func (s *deviceState) sharedDevice(devices []checkpoint.Device) (name, how string) {
	for _, dev := range devices {
		if dev.Sharing != nil && dev.Sharing.Strategy == string(gpuv1alpha1.TimeSlicingSharing) {
			return dev.Name, "time-slicing"
		}
		if dev.ShareID == "" {
			continue
		}
		// The whole GPU's share is its memory rounded down to the share
		// step; what is left below one step cannot be granted to anyone.
		if g, ok := s.gpus.get(dev.Name); !ok || dev.Sharing == nil || int64(g.MemoryBytes)-dev.Sharing.Share.MemoryBytes >= gpu.MemoryShareStep.Value() {
			return dev.Name, "a memory share of part of the GPU"
		}
	}
	return "", ""
}

// checkExclusive refuses a device that another claim holds whole, and a
// share that would take a shared device past its memory. A claim that is
// only PrepareStarted holds its devices too: its prepare may be in flight or
// about to be retried. So do the claims in pending, planned earlier in the
// same call.
func (s *deviceState) checkExclusive(uid string, devices []checkpoint.Device, pending []checkpoint.Claim) error {
	for _, dev := range devices {
		var sharedBytes int64
		var conflict error
		check := func(other *checkpoint.Claim) bool {
			if other.UID == uid {
				return true
			}
			for _, od := range other.Devices {
				if od.Name != dev.Name {
					continue
				}
				if od.ShareID == "" || dev.ShareID == "" {
					conflict = fmt.Errorf("device %s is already prepared for claim %s/%s (uid %s); refusing to share it", dev.Name, other.Namespace, other.Name, other.UID)
					return false
				}
				if od.Sharing != nil {
					sharedBytes += od.Sharing.Share.MemoryBytes
				}
			}
			return true
		}
		s.checkpoint.Range(check)
		for i := range pending {
			if conflict == nil {
				check(&pending[i])
			}
		}
		if conflict != nil {
			return conflict
		}
		if dev.ShareID == "" || dev.Sharing == nil {
			continue
		}
		g, _ := s.gpus.get(dev.Name)
		if total := sharedBytes + dev.Sharing.Share.MemoryBytes; g.MemoryBytes > 0 && uint64(total) > g.MemoryBytes {
			return fmt.Errorf("device %s has %d bytes of memory; the shares prepared on it would add up to %d", dev.Name, g.MemoryBytes, total)
		}
	}
	return nil
}

func (s *deviceState) writeSpec(ctx context.Context, rec checkpoint.Claim) error {
	spec := cdi.Claim{UID: rec.UID}
	if rec.Profiling != nil {
		edits, err := s.profiler.edits(ctx, rec)
		if err != nil {
			return err
		}
		spec.Edits = edits
	}
	for _, dev := range rec.Devices {
		if dev.MIG != nil {
			md, err := s.partitions.cdiDevice(dev)
			if err != nil {
				return err
			}
			spec.Devices = append(spec.Devices, md)
			continue
		}
		g, ok := s.gpus.get(dev.Name)
		if !ok {
			return fmt.Errorf("device %s is no longer present on this node", dev.Name)
		}
		spec.Devices = append(spec.Devices, cdi.Device{Name: dev.Name, UUID: g.UUID, Minor: g.Minor, Edits: s.deviceEdits(dev)})
	}
	ids, err := s.cdi.WriteClaimSpec(ctx, spec)
	if err != nil {
		return fmt.Errorf("write CDI spec: %w", err)
	}
	var want []string
	for _, dev := range rec.Devices {
		want = append(want, dev.CDIDeviceIDs...)
	}
	if !slices.Equal(sortedCopy(ids), sortedCopy(want)) {
		return fmt.Errorf("CDI spec lists devices %v, expected %v", ids, want)
	}
	return nil
}

// deviceEdits are what the strategies of a device tell its containers:
// the memory its share holds, the time slice its GPU was set to and, where
// MPS enforces the share, how to reach its daemon.
func (s *deviceState) deviceEdits(dev checkpoint.Device) *cdispec.ContainerEdits {
	env := slices.Concat(memoryShareEnv(dev.Sharing), timeSliceEnv(dev.Sharing))
	edits := s.shares.clientEdits(dev)
	if edits == nil {
		if len(env) == 0 {
			return nil
		}
		return &cdispec.ContainerEdits{Env: env}
	}
	edits.Env = append(env, edits.Env...)
	return edits
}

func kubeletDevices(rec checkpoint.Claim) []kubeletplugin.Device {
	out := make([]kubeletplugin.Device, 0, len(rec.Devices))
	for _, dev := range rec.Devices {
		kd := kubeletplugin.Device{
			Requests:     slices.Clone(dev.Requests),
			PoolName:     dev.Pool,
			DeviceName:   dev.Name,
			CDIDeviceIDs: slices.Clone(dev.CDIDeviceIDs),
		}
		if dev.ShareID != "" {
			kd.ShareID = ptr.To(types.UID(dev.ShareID))
		}
		out = append(out, kd)
	}
	return out
}

func (s *deviceState) updateGauges() {
	claims, devices := 0, 0
	s.checkpoint.Range(func(c *checkpoint.Claim) bool {
		claims++
		devices += len(c.Devices)
		return true
	})
	s.metrics.preparedClaims.Set(float64(claims))
	s.metrics.preparedDevices.Set(float64(devices))
}

func sortedCopy(s []string) []string {
	out := slices.Clone(s)
	slices.Sort(out)
	return out
}

// requestConfigs are the opaque GpuConfigs of a claim's allocation, in the
// order the scheduler recorded them: class configs first, then the claim's.
type requestConfigs []requestConfig

type requestConfig struct {
	requests []string
	config   *gpuv1alpha1.GpuConfig
}

func decodeConfigs(configs []resourceapi.DeviceAllocationConfiguration) (requestConfigs, error) {
	var out requestConfigs
	for i, c := range configs {
		if c.Opaque == nil || c.Opaque.Driver != gpuv1alpha1.DriverName {
			continue
		}
		cfg, err := gpuv1alpha1.Decode(c.Opaque.Parameters.Raw)
		if err != nil {
			scope := "all requests"
			if len(c.Requests) > 0 {
				scope = "requests " + strings.Join(c.Requests, ", ")
			}
			return nil, fmt.Errorf("opaque config #%d (from %s, for %s): %w", i, strings.ToLower(string(c.Source)), scope, err)
		}
		out = append(out, requestConfig{requests: c.Requests, config: cfg})
	}
	return out, nil
}

// forRequest returns the config that applies to a request: the last one that
// names it, its parent request, or no request at all. Later configs win
// because claim configs come after class configs.
func (rc requestConfigs) forRequest(request string) *gpuv1alpha1.GpuConfig {
	parent, _, _ := strings.Cut(request, "/")
	chosen := gpuv1alpha1.Default()
	for _, c := range rc {
		if len(c.requests) == 0 || slices.Contains(c.requests, request) || slices.Contains(c.requests, parent) {
			chosen = c.config
		}
	}
	return chosen
}
