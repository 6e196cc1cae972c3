// Package plugin is Prism's kubelet plugin: it publishes the node's GPUs as a
// ResourceSlice and prepares and unprepares claims for the kubelet, recording
// every step in a checkpoint so that a crash at any point is recovered.
package plugin

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"reflect"
	"sync"
	"time"

	corev1 "k8s.io/api/core/v1"
	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/kubernetes/scheme"
	typedcorev1 "k8s.io/client-go/kubernetes/typed/core/v1"
	"k8s.io/client-go/tools/record"
	"k8s.io/dynamic-resource-allocation/kubeletplugin"
	"k8s.io/dynamic-resource-allocation/resourceslice"
	"k8s.io/klog/v2"

	"github.com/prismgpu/prism/pkg/cdi"
	"github.com/prismgpu/prism/pkg/checkpoint"
	"github.com/prismgpu/prism/pkg/gpu"
	"github.com/prismgpu/prism/pkg/gpu/nvml"
	"github.com/prismgpu/prism/pkg/profiling"
)

// DriverName is the DRA driver name, also the attribute domain.
const DriverName = gpu.Domain

// Config wires a Driver. Everything but the kubelet directories is required.
type Config struct {
	NodeName   string
	KubeClient kubernetes.Interface
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
	// Profiling enables claims that ask for an ncu run; nil refuses them.
	Profiling *ProfilingConfig
	Metrics   *Metrics
}

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

// Driver implements kubeletplugin.DRAPlugin for gpu.prism.dev.
type Driver struct {
	cfg        Config
	helper     *kubeletplugin.Helper
	checkpoint *checkpoint.Store
	recorder   record.EventRecorder
	broadcast  record.EventBroadcaster
	metrics    *Metrics

	// mu serialises prepare and unprepare: the exclusivity check and the
	// checkpoint write that claims a device must be one step.
	mu sync.Mutex
	// devices are the node's GPUs by device name, as last discovered.
	devicesMu sync.RWMutex
	devices   map[string]gpu.Device
	sysfs     fs.ReadLinkFS
	unhealthy map[string]unhealthy
	published []resourceapi.Device

	ready chan struct{}
	// staleSince records when each prepared claim was first seen missing
	// from the API.
	staleSince sync.Map
}

// Start discovers the GPUs, recovers the checkpoint, reconciles it against the
// CDI specs on disk, registers with the kubelet and publishes the slice.
func Start(ctx context.Context, cfg Config) (*Driver, error) {
	d, err := newDriver(ctx, cfg)
	if err != nil {
		return nil, err
	}
	opts := []kubeletplugin.Option{
		kubeletplugin.DriverName(DriverName),
		kubeletplugin.NodeName(cfg.NodeName),
		kubeletplugin.KubeClient(cfg.KubeClient),
		// Alone on the node the driver's own lock (d.mu) is enough. During a
		// rolling update two instances share the node, and only the helper's
		// serialisation takes a file lock that orders calls across processes.
		kubeletplugin.Serialize(cfg.RollingUpdatePodUID != ""),
		kubeletplugin.HealthService(false),
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
	d.helper = helper
	if err := d.publish(ctx); err != nil {
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
		go d.watchHealth(ctx)
	}
	klog.FromContext(ctx).Info("Prism kubelet plugin started", "node", cfg.NodeName, "devices", len(d.published), "preparedClaims", len(d.checkpoint.List()))
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
	d := &Driver{cfg: cfg, metrics: cfg.Metrics, ready: make(chan struct{}), unhealthy: map[string]unhealthy{}}
	d.broadcast = record.NewBroadcaster(record.WithContext(ctx))
	d.broadcast.StartRecordingToSink(&typedcorev1.EventSinkImpl{Interface: cfg.KubeClient.CoreV1().Events("")})
	d.recorder = d.broadcast.NewRecorder(scheme.Scheme, corev1.EventSource{Component: "prism-kubelet-plugin", Host: cfg.NodeName})

	devices, sysfs, err := d.discover(ctx)
	if err != nil {
		return nil, err
	}
	d.setDevices(devices, sysfs)

	store, recovered, err := checkpoint.Open(ctx, cfg.StateDir, checkpoint.Options{})
	if err != nil {
		return nil, fmt.Errorf("start plugin: open checkpoint in %s: %w", cfg.StateDir, err)
	}
	d.checkpoint = store
	d.reportRecovery(ctx, recovered)
	if recovered.Corruption != nil {
		d.adoptSpecs(ctx)
	}
	if err := d.reconcile(ctx); err != nil {
		// Not fatal: a plugin that refuses to start blocks every claim on the
		// node, while what could not be repaired here is retried by the
		// kubelet's next prepare or unprepare of that claim.
		logger.Error(err, "Reconciling the checkpoint with the CDI specs on disk was incomplete")
		d.recorder.Eventf(d.nodeRef(), corev1.EventTypeWarning, "ReconcileIncomplete", "Prism could not fully reconcile its checkpoint with CDI specs: %v", err)
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
}

// Ready is closed once the plugin is registered and its slice published.
func (d *Driver) Ready() <-chan struct{} { return d.ready }

func (d *Driver) discover(ctx context.Context) ([]gpu.Device, fs.ReadLinkFS, error) {
	devices, sysfs, err := d.cfg.Inventory.Read(ctx)
	if err != nil {
		return nil, nil, fmt.Errorf("discover GPUs: %w", err)
	}
	return devices, sysfs, nil
}

func (d *Driver) setDevices(devices []gpu.Device, sysfs fs.ReadLinkFS) {
	byName := make(map[string]gpu.Device, len(devices))
	for _, dev := range devices {
		byName[dev.Name()] = dev
	}
	d.devicesMu.Lock()
	d.devices, d.sysfs = byName, sysfs
	d.devicesMu.Unlock()
}

func (d *Driver) device(name string) (gpu.Device, bool) {
	d.devicesMu.RLock()
	defer d.devicesMu.RUnlock()
	dev, ok := d.devices[name]
	return dev, ok
}

// publish hands the node's pool to the helper's ResourceSlice controller. An
// empty pool is still published, so that the scheduler sees the node has none.
func (d *Driver) publish(ctx context.Context) error {
	resourceDevices, err := d.resourceDevices(ctx)
	if err != nil {
		return fmt.Errorf("build ResourceSlice devices: %w", err)
	}
	return d.publishDevices(ctx, resourceDevices)
}

// publishDevices publishes devices already built by resourceDevices.
func (d *Driver) publishDevices(ctx context.Context, resourceDevices []resourceapi.Device) error {
	if resourceDevices == nil {
		resourceDevices = []resourceapi.Device{}
	}
	err := d.helper.PublishResources(ctx, resourceslice.DriverResources{Pools: map[string]resourceslice.Pool{
		d.cfg.NodeName: {Slices: []resourceslice.Slice{{Devices: resourceDevices}}},
	}})
	if err != nil {
		return fmt.Errorf("publish ResourceSlice: %w", err)
	}
	d.published = resourceDevices
	d.metrics.publishedDevices.Set(float64(len(resourceDevices)))
	klog.FromContext(ctx).V(2).Info("Published ResourceSlice", "devices", len(resourceDevices))
	return nil
}

// resourceDevices renders the known GPUs as slice devices, sorted by index.
func (d *Driver) resourceDevices(ctx context.Context) ([]resourceapi.Device, error) {
	d.devicesMu.RLock()
	devices := make([]gpu.Device, 0, len(d.devices))
	for _, dev := range d.devices {
		devices = append(devices, dev)
	}
	sysfs := d.sysfs
	taints := map[string]resourceapi.DeviceTaint{}
	for name, u := range d.unhealthy {
		taints[name] = u.taint
	}
	d.devicesMu.RUnlock()
	gpu.SortByIndex(devices)
	out, err := gpu.ResourceDevices(ctx, devices, gpu.PublishOptions{SysFS: sysfs, ShareMemory: d.cfg.ShareMemory})
	if err != nil {
		return nil, err
	}
	for i := range out {
		if t, ok := taints[out[i].Name]; ok {
			out[i].Taints = []resourceapi.DeviceTaint{t}
		}
	}
	return out, nil
}

// rediscoverLoop republishes when the node's GPUs change: a GPU that fell
// off the bus, a driver upgrade, or an edited simulated fleet.
func (d *Driver) rediscoverLoop(ctx context.Context) {
	logger := klog.FromContext(ctx)
	ticker := time.NewTicker(d.cfg.RediscoverInterval)
	defer ticker.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-ticker.C:
		}
		devices, sysfs, err := d.discover(ctx)
		if err != nil {
			logger.Error(err, "Rediscovering GPUs; keeping the published slice")
			continue
		}
		d.setDevices(devices, sysfs)
		previous := d.published
		resourceDevices, err := d.resourceDevices(ctx)
		if err != nil {
			logger.Error(err, "Building ResourceSlice devices")
			continue
		}
		if reflect.DeepEqual(nonNil(resourceDevices), nonNil(previous)) {
			continue
		}
		logger.Info("GPUs changed, republishing", "before", len(previous), "after", len(resourceDevices))
		if err := d.publishDevices(ctx, resourceDevices); err != nil {
			logger.Error(err, "Republishing")
		}
	}
}

func nonNil(devs []resourceapi.Device) []resourceapi.Device {
	if devs == nil {
		return []resourceapi.Device{}
	}
	return devs
}

// nodeRef is the object events about the plugin's own state are attached to.
func (d *Driver) nodeRef() *corev1.ObjectReference {
	return &corev1.ObjectReference{Kind: "Node", Name: d.cfg.NodeName, APIVersion: "v1"}
}

func (d *Driver) reportRecovery(ctx context.Context, r checkpoint.Recovered) {
	logger := klog.FromContext(ctx)
	if r.Corruption != nil {
		d.metrics.checkpointRecover.WithLabelValues("corrupt-" + string(r.Corruption.Reason)).Inc()
		logger.Error(r.Corruption, "Checkpoint was unusable and was moved aside; starting empty and rebuilding from the CDI specs on disk")
		d.recorder.Eventf(d.nodeRef(), corev1.EventTypeWarning, "CheckpointCorrupt",
			"Prism checkpoint %s was unusable (%s) and moved to %s; prepared claims are rebuilt from their CDI specs and the API server", r.Corruption.Path, r.Corruption.Reason, r.Corruption.MovedTo)
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

// HandleError is called by the helper for errors it cannot return to anyone,
// such as a failure to publish the slice.
func (d *Driver) HandleError(ctx context.Context, err error, msg string) {
	klog.FromContext(ctx).Error(err, msg)
	d.metrics.claimErrors.WithLabelValues("background", "helper").Inc()
}

// WatchHealthStatus is not offered: health is reported with device taints.
func (d *Driver) WatchHealthStatus(context.Context, chan<- kubeletplugin.DeviceHealthReport) error {
	return kubeletplugin.ErrHealthNotSupported
}

var _ kubeletplugin.DRAPlugin = (*Driver)(nil)
