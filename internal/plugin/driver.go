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
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"sync"
	"sync/atomic"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/kubernetes/scheme"
	typedcorev1 "k8s.io/client-go/kubernetes/typed/core/v1"
	"k8s.io/client-go/tools/record"
	"k8s.io/dynamic-resource-allocation/kubeletplugin"
	"k8s.io/klog/v2"
	"k8s.io/utils/clock"

	gpuv1alpha1 "github.com/prismgpu/prism/api/gpu/v1alpha1"
	"github.com/prismgpu/prism/internal/plugin/cdi"
	"github.com/prismgpu/prism/internal/plugin/checkpoint"
	"github.com/prismgpu/prism/internal/plugin/mig"
	"github.com/prismgpu/prism/internal/plugin/mps"
	"github.com/prismgpu/prism/internal/plugin/profiling"
	"github.com/prismgpu/prism/internal/plugin/usage/sampler"
	"github.com/prismgpu/prism/pkg/gpu"
	"github.com/prismgpu/prism/pkg/gpu/nvml"
)

// Config wires a Driver. Everything but the kubelet directories is required.
type Config struct {
	NodeName   string
	KubeClient kubernetes.Interface
	// SweepClient, when set, serves the stale-claim sweep, so that its GETs
	// use another rate limiter than the kubelet calls' claim GETs.
	SweepClient kubernetes.Interface
	// RegistrarDir and PluginDir are the kubelet's plugin registry directory
	// and this driver's data directory.
	RegistrarDir string
	PluginDir    string
	// StateDir holds the checkpoint.
	StateDir string
	// Inventory reads the node's GPUs: through NVML or from a simulated fleet.
	Inventory nvml.Inventory
	// CDI writes the per-claim specs.
	CDI *cdi.Writer
	// RediscoverInterval is how often devices are read again and the slice
	// republished if they changed. Zero disables it.
	RediscoverInterval time.Duration
	// RollingUpdatePodUID lets two plugin pods of a DaemonSet overlap during
	// an update, so that the node's slices never disappear.
	RollingUpdatePodUID types.UID
	// StaleClaimInterval is how often prepared claims are checked against the
	// API; a claim gone for StaleClaimGrace is released. Zero disables it.
	StaleClaimInterval time.Duration
	StaleClaimGrace    time.Duration
	// Health watches NVML events and taints unhealthy GPUs; nil disables it.
	Health *HealthConfig
	// TimeSlicer applies time-slicing asked for in GpuConfig; nil ignores it.
	TimeSlicer TimeSlicer
	// ShareMemory publishes GPUs that several claims may share by memory.
	ShareMemory bool
	// FiguresAsCapacity publishes the tier figures as capacities too (see
	// gpu.PublishOptions).
	FiguresAsCapacity bool
	// MIGPartitions publishes the partitions of GPUs in MIG mode beside
	// the whole GPU, all consuming the GPU's shared counters (the
	// MIGPartitions feature gate). Off, every GPU is published whole.
	MIGPartitions bool
	// MPSDriverRoot is the driver root, as the plugin sees it, that holds
	// nvidia-cuda-mps-control for enforcing GPU shares; empty, or without
	// the binary, shares run time-sliced.
	MPSDriverRoot string
	// MPSPods, when set, runs each MPS daemon in a pod of its own, so that
	// it outlives the plugin's container; MPSProcRoot is then where the
	// host's processes are (see mps.Pods).
	MPSPods     *mps.Pods
	MPSProcRoot string
	// Profiling enables claims that ask for an ncu run; nil refuses them.
	Profiling *ProfilingConfig
	// Usage samples prepared claims' GPUs for their usage profile; nil
	// turns it off.
	Usage *sampler.Config
	// MIG creates and destroys the MIG instances of partitions; nil
	// refuses claims for partitions.
	MIG     mig.Interface
	Metrics *Metrics
	// Probes, when set, answer liveness and readiness for this driver; they
	// are made before the driver so that the HTTP server can start first.
	Probes *Probes
}

// Driver implements kubeletplugin.DRAPlugin for gpu.prism.dev.
type Driver struct {
	cfg      Config
	helper   *kubeletplugin.Helper
	recorder record.EventRecorder
	// node is the object Events about the plugin's own state are attached to.
	node      *corev1.ObjectReference
	broadcast record.EventBroadcaster
	metrics   *Metrics
	clock     clock.WithTicker

	// state prepares and unprepares claims.
	state *deviceState
	// pool publishes the GPUs as the node's ResourceSlices.
	pool *slicePool
	// health keeps the GPUs and their taints current.
	health *healthWatch

	// ready is closed once the plugin serves its sockets and its slice is
	// published; kubeletRegistered is set once the kubelet has registered
	// it. Readiness needs both.
	ready             chan struct{}
	kubeletRegistered atomic.Bool
	// staleSince records when each prepared claim was first seen missing
	// from the API.
	staleSince sync.Map
}

// Start discovers the GPUs, recovers the checkpoint, reconciles it against the
// CDI specs on disk, registers with the kubelet and publishes the slice.
func Start(ctx context.Context, cfg Config) (*Driver, error) {
	if cfg.PluginDir != "" {
		if err := checkDRASocketPath(cfg.PluginDir, cfg.RollingUpdatePodUID); err != nil {
			return nil, fmt.Errorf("start plugin: %w", err)
		}
	}
	d, err := newDriver(ctx, cfg)
	if err != nil {
		return nil, err
	}
	opts := []kubeletplugin.Option{
		kubeletplugin.DriverName(gpuv1alpha1.DriverName),
		kubeletplugin.NodeName(cfg.NodeName),
		kubeletplugin.KubeClient(cfg.KubeClient),
		// Alone on the node the driver's own lock (guard) is enough. During a
		// rolling update two instances share the node, and only the helper's
		// serialisation takes a file lock that orders calls across processes.
		kubeletplugin.Serialize(cfg.RollingUpdatePodUID != ""),
		// The kubelet is told the GPUs' health (WatchHealthStatus) where
		// it is watched.
		kubeletplugin.HealthService(cfg.Health != nil),
		kubeletplugin.GRPCInterceptor(TraceInterceptor(klog.FromContext(ctx))),
		kubeletplugin.GRPCInterceptor(d.watchRegistration(klog.FromContext(ctx))),
	}
	if cfg.RegistrarDir != "" {
		opts = append(opts, kubeletplugin.RegistrarDirectoryPath(cfg.RegistrarDir))
	}
	if cfg.PluginDir != "" {
		if err := os.MkdirAll(cfg.PluginDir, 0o750); err != nil {
			return nil, fmt.Errorf("start plugin: create plugin directory: %w", err)
		}
		opts = append(opts, kubeletplugin.PluginDataDirectoryPath(cfg.PluginDir))
	}
	if cfg.RollingUpdatePodUID != "" {
		opts = append(opts, kubeletplugin.RollingUpdate(cfg.RollingUpdatePodUID))
	}
	helper, err := kubeletplugin.Start(ctx, d, opts...)
	if err != nil {
		return nil, fmt.Errorf("start plugin: register with the kubelet: %w", err)
	}
	d.helper, d.pool.publisher = helper, helper
	go d.reportWhileNotReady(ctx, d.ready, notReadyFirstReport, notReadyReportEvery)
	if err := d.pool.publish(ctx); err != nil {
		helper.Stop()
		return nil, err
	}
	close(d.ready)
	if cfg.RediscoverInterval > 0 {
		go d.rediscoverLoop(ctx)
	}
	if cfg.StaleClaimInterval > 0 {
		go d.collectStaleLoop(ctx, cfg.StaleClaimInterval, cfg.StaleClaimGrace)
	}
	if cfg.Health != nil {
		go d.health.watch(ctx)
	}
	if d.state.shares.daemons.Unavailable() == nil {
		go d.repairMPSLoop(ctx)
	}
	go d.pool.republishWithdrawnSlices(ctx)
	d.state.profiler.start(ctx)
	if d.state.usage != nil {
		go d.state.usage.Run(ctx)
	}
	klog.FromContext(ctx).Info("Prism kubelet plugin started", "node", cfg.NodeName, "devices", len(d.pool.publishedDevices()), "preparedClaims", len(d.state.checkpoint.List()))
	return d, nil
}

// newDriver does everything Start does short of talking to the kubelet.
func newDriver(ctx context.Context, cfg Config) (*Driver, error) {
	logger := klog.FromContext(ctx)
	if cfg.NodeName == "" || cfg.KubeClient == nil || cfg.Inventory == nil || cfg.CDI == nil || cfg.StateDir == "" {
		return nil, errors.New("start plugin: node name, kube client, inventory, CDI writer and state dir are required")
	}
	if cfg.Metrics == nil {
		cfg.Metrics = NewMetrics()
	}
	if cfg.SweepClient == nil {
		cfg.SweepClient = cfg.KubeClient
	}
	d := &Driver{cfg: cfg, metrics: cfg.Metrics, ready: make(chan struct{}), clock: clock.RealClock{}}
	d.state = &deviceState{cdi: cfg.CDI, kube: cfg.KubeClient, metrics: cfg.Metrics, apiBackoff: defaultAPIBackoff,
		gpus:  nodeGPUs{unhealthy: map[string]unhealthy{}},
		guard: &guard{mu: timedMutex{clock: d.clock}, rollingUpdate: cfg.RollingUpdatePodUID != "", pluginDir: cfg.PluginDir}}
	if cfg.Probes != nil {
		cfg.Probes.driver.Store(d)
	}
	d.broadcast = record.NewBroadcaster(record.WithContext(ctx))
	d.broadcast.StartRecordingToSink(&typedcorev1.EventSinkImpl{Interface: cfg.KubeClient.CoreV1().Events("")})
	d.node = nodeRef(cfg.NodeName)
	d.recorder = d.broadcast.NewRecorder(scheme.Scheme, corev1.EventSource{Component: "prism-kubelet-plugin", Host: cfg.NodeName})
	d.state.recorder, d.state.node = d.recorder, d.node
	d.pool = &slicePool{kube: cfg.KubeClient, gpus: &d.state.gpus, recorder: d.recorder, node: d.node, metrics: cfg.Metrics,
		opts: poolOptions{ShareMemory: cfg.ShareMemory, FiguresAsCapacity: cfg.FiguresAsCapacity, MIGPartitions: cfg.MIGPartitions}}
	d.state.profiler = &profiler{cfg: cfg.Profiling, gpus: &d.state.gpus, kube: cfg.KubeClient, recorder: d.recorder, node: d.node, metrics: cfg.Metrics, jobs: newCollections()}

	store, recovered, err := checkpoint.Open(ctx, cfg.StateDir, checkpoint.Options{Observe: observeCheckpoint})
	if err != nil {
		return nil, fmt.Errorf("start plugin: open checkpoint in %s: %w", cfg.StateDir, err)
	}
	d.state.checkpoint, d.state.guard.checkpoint = store, store
	d.state.partitions = &migPartitions{lib: cfg.MIG, gpus: &d.state.gpus, checkpoint: store}
	d.health = &healthWatch{cfg: cfg.Health, inventory: cfg.Inventory, gpus: &d.state.gpus, checkpoint: store, guard: d.state.guard, pool: d.pool,
		partitions: d.state.partitions, recorder: d.recorder, node: d.node, metrics: cfg.Metrics, clock: d.clock}
	d.state.timeSlices = &timeSlices{slicer: cfg.TimeSlicer, gpus: &d.state.gpus, checkpoint: store}
	d.reportRecovery(ctx, recovered)
	d.state.shares = &mpsShares{gpus: &d.state.gpus, checkpoint: store, recorder: d.recorder, kube: cfg.KubeClient, claimErrors: cfg.Metrics.claimErrors, node: d.node}
	d.state.shares.open(ctx, mps.Options{
		DriverRoot: cfg.MPSDriverRoot,
		Root:       filepath.Join(cfg.StateDir, "mps"),
		Checkpoint: store,
		Registerer: cfg.Metrics.Registry,
		Pods:       cfg.MPSPods,
		ProcRoot:   cfg.MPSProcRoot,
	})
	// Taints first: a GPU tainted before a restart stays tainted, and one
	// that cannot be read now is tainted on top.
	d.health.restoreTaints(ctx)
	if err := d.health.rediscover(ctx); err != nil {
		return nil, err
	}

	// Before reconcile, which may prepare profiled claims again.
	d.state.profiler.checkQuota(ctx)
	keepUnowned := false
	if err := d.state.adoptSpecs(ctx); err != nil {
		// Without the API server there is no telling a lost checkpoint's
		// running claims from orphans: keep every spec rather than break
		// running pods' container restarts.
		keepUnowned = true
		logger.Error(err, "Keeping CDI specs that the checkpoint does not explain")
		d.recorder.Eventf(d.node, corev1.EventTypeWarning, "CheckpointNotRebuilt",
			"Prism kept CDI specs that its checkpoint does not explain, because their claims could not be read: %v", err)
	}
	if err := d.state.reconcile(ctx, keepUnowned); err != nil {
		// Not fatal: a plugin that refuses to start blocks every claim on the
		// node, while what could not be repaired here is retried by the
		// kubelet's next prepare or unprepare of that claim.
		logger.Error(err, "Reconciling the checkpoint with the CDI specs on disk was incomplete")
		d.recorder.Eventf(d.node, corev1.EventTypeWarning, "ReconcileIncomplete", "Prism could not fully reconcile its checkpoint with CDI specs: %v", err)
	}
	// After reconcile, which may roll back claims that held shares.
	d.state.shares.recoverDaemons(ctx)
	if cfg.Usage != nil {
		d.state.usage = d.newUsageSampler(ctx, *cfg.Usage)
	}
	// Report directories of claims the checkpoint does not hold will never
	// be collected; while it may be missing running claims, they stay.
	if cfg.Profiling != nil && !keepUnowned {
		err := d.state.guard.exclusive(ctx, func() error {
			return profiling.SweepClaimDirs(ctx, cfg.Profiling.Options.StateDir, func(uid string) bool {
				_, ok := d.state.checkpoint.Get(uid)
				return ok
			})
		})
		if err != nil {
			logger.Error(err, "Removing report directories of claims no longer prepared")
		}
	}
	return d, nil
}

// Stop unregisters from the kubelet. Published slices stay: the kubelet
// removes them if the plugin does not come back.
func (d *Driver) Stop() {
	if d.helper != nil {
		d.helper.Stop()
	}
	d.broadcast.Shutdown()
	d.state.checkpoint.Close()
}

// rediscover reads the node's GPUs. A GPU that cannot be read now is
// tainted lost and kept published as last seen, or, after a restart, from
// what the checkpoint remembers of it (unreadable.go); a lost GPU that reads
// again has proved it is back and loses its taint.
func (h *healthWatch) rediscover(ctx context.Context) error {
	devices, sysfs, err := h.inventory.Read(ctx)
	var unreadable *nvml.UnreadableError
	if err != nil && !errors.As(err, &unreadable) {
		return fmt.Errorf("discover GPUs: %w", err)
	}
	byName := make(map[string]gpu.Device, len(devices))
	for _, dev := range devices {
		byName[dev.Name()] = dev
	}
	var changes []healthChange
	claimed := h.claimedDevices()
	now := h.clock.Now()
	var unreadableGPUs map[int]error
	if unreadable != nil {
		unreadableGPUs = unreadable.GPUs
	}
	h.gpus.mu.Lock()
	h.gpus.sweepUnreadableLocked(unreadableGPUs)
	for index, readErr := range unreadableGPUs {
		if known, ok := h.gpus.byName[gpu.Device{Index: index}.Name()]; ok {
			byName[known.Name()] = known
		}
		if c, report := h.gpus.taintUnreadableLocked(index, readErr, claimed, now); report {
			changes = append(changes, c)
		}
	}
	for name, u := range h.gpus.unhealthy {
		dev, read := byName[name]
		if read && unreadable != nil {
			_, stillUnreadable := unreadable.GPUs[dev.Index]
			read = !stillUnreadable
		}
		switch {
		case !read:
		case u.uuid != "" && dev.UUID != u.uuid:
			// Another GPU now has this name: the taint was the old one's.
			delete(h.gpus.unhealthy, name)
			changes = append(changes, healthChange{device: name, uuid: u.uuid, reason: "replaced by GPU " + dev.UUID})
		case u.taint.Value == lostValue:
			delete(h.gpus.unhealthy, name)
			changes = append(changes, healthChange{device: name, uuid: dev.UUID, reason: "NVML reads it again"})
		}
	}
	h.gpus.byName, h.gpus.sysfs = byName, sysfs
	h.gpus.mu.Unlock()
	h.reportChanges(ctx, changes)
	return nil
}

// rediscoverLoop republishes when the node's GPUs change: a GPU that fell
// off the bus, a driver upgrade, or an edited simulated fleet.
func (d *Driver) rediscoverLoop(ctx context.Context) {
	logger := klog.FromContext(ctx)
	d.every(ctx, d.cfg.RediscoverInterval, func() {
		if err := d.health.rediscover(ctx); err != nil {
			logger.Error(err, "Rediscovering GPUs; keeping the published slice")
			return
		}
		before := len(d.pool.publishedDevices())
		published, err := d.pool.publishIfChanged(ctx, false)
		if err != nil {
			logger.Error(err, "Republishing")
			return
		}
		if published {
			logger.Info("GPUs changed, republished", "before", before, "after", len(d.pool.publishedDevices()))
		}
	})
}

// mpsRepairInterval is how often the shares' MPS daemons are checked: a
// daemon that died leaves its share's new processes without MPS, and
// without its limits, until the next check.
const mpsRepairInterval = 10 * time.Second

// repairMPSLoop replaces the shares' MPS daemons that died, under the
// driver lock, as a kubelet call would.
func (d *Driver) repairMPSLoop(ctx context.Context) {
	d.every(ctx, mpsRepairInterval, func() {
		if err := d.state.guard.exclusive(ctx, func() error {
			d.state.shares.repair(ctx)
			return nil
		}); err != nil {
			klog.FromContext(ctx).Error(err, "Checking the shares' MPS daemons")
		}
	})
}

// every calls fn each interval, on the driver's clock, until ctx ends.
func (d *Driver) every(ctx context.Context, interval time.Duration, fn func()) {
	ticker := d.clock.NewTicker(interval)
	defer ticker.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-ticker.C():
		}
		fn()
	}
}

func (d *Driver) reportRecovery(ctx context.Context, r checkpoint.Recovered) {
	logger := klog.FromContext(ctx)
	if r.Corruption != nil {
		d.metrics.checkpointRecover.WithLabelValues("corrupt-" + string(r.Corruption.Reason)).Inc()
		logger.Error(r.Corruption, "Checkpoint was unusable and was moved aside; starting empty and rebuilding from the CDI specs on disk")
		d.recorder.Eventf(d.node, corev1.EventTypeWarning, "CheckpointCorrupt",
			"Prism checkpoint %s was unusable (%s) and moved to %s; prepared claims are rebuilt from their CDI specs and the API server", r.Corruption.Path, r.Corruption.Reason, r.Corruption.MovedTo)
	}
	if r.TornEntryBytes > 0 {
		d.metrics.checkpointRecover.WithLabelValues("torn-entry").Inc()
		logger.Info("Dropped the checkpoint's last change, cut short by a power loss before it was acknowledged; the claim it named is prepared again on the kubelet's retry", "bytes", r.TornEntryBytes)
	}
	if r.MigratedFrom != "" {
		d.metrics.checkpointRecover.WithLabelValues("migrated").Inc()
		logger.Info("Checkpoint migrated", "from", r.MigratedFrom)
	}
	if r.BootIDChanged {
		d.metrics.checkpointRecover.WithLabelValues("reboot").Inc()
		logger.Info("Node rebooted since the checkpoint was written", "invalidatedClaims", r.Invalidated)
	}
}

// newUsageSampler makes the sampler and takes up the runs a stopped plugin
// left, once reconciliation settled which claims are prepared.
func (d *Driver) newUsageSampler(ctx context.Context, cfg sampler.Config) *sampler.Sampler {
	s := sampler.New(cfg, sampler.Env{
		Dir:      filepath.Join(d.cfg.StateDir, usageDir),
		NodeName: d.cfg.NodeName,
		Recorder: d.recorder,
		Clock:    d.clock,
		Metrics:  d.metrics.usage,
		Dropped:  d.metrics.claimErrors.WithLabelValues("unprepare", "usage-publish"),
		Prepared: func(uid string) bool {
			_, ok := d.state.checkpoint.Get(uid)
			return ok
		},
	})
	var prepared []sampler.Claim
	// List, not Range: usageClaim reads the checkpoint's MPS daemons, and a
	// read lock taken again under Range can deadlock behind a writer.
	for _, c := range d.state.checkpoint.List() {
		if c.State != checkpoint.PrepareCompleted {
			continue
		}
		uc := d.state.usageClaim(c)
		if c.Profiling != nil {
			uc.Profile = c.Profiling.Profile
		}
		prepared = append(prepared, uc)
	}
	s.Load(ctx, prepared)
	return s
}
