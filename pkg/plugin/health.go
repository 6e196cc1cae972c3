package plugin

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"strconv"
	"time"

	gonvml "github.com/NVIDIA/go-nvml/pkg/nvml"
	corev1 "k8s.io/api/core/v1"
	resourceapi "k8s.io/api/resource/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/klog/v2"

	"github.com/prismgpu/prism/pkg/gpu/nvml"
)

// TaintKey marks a GPU that NVML reported unhealthy.
const TaintKey = DriverName + "/unhealthy"

// HealthConfig turns on health watching.
type HealthConfig struct {
	// NVML is watched for Xid events; it must stay initialised-able for the
	// plugin's lifetime.
	NVML gonvml.Interface
	// IgnoredXIDs are the application's fault (a bad kernel, a page fault),
	// not the GPU's, and taint nothing.
	IgnoredXIDs map[uint64]bool
	// RecoverAfter is how long a GPU must go without a new fatal event
	// before its taint is removed.
	RecoverAfter time.Duration
}

// DefaultIgnoredXIDs are Xids caused by applications rather than the GPU:
// 13 graphics engine exception, 31 memory page fault, 43 GPU stopped
// processing, 45 preemptive cleanup, 68 video processor exception, 109
// context switch timeout.
var DefaultIgnoredXIDs = []uint64{13, 31, 43, 45, 68, 109}

// unhealthy is a GPU's current taint.
type unhealthy struct {
	taint     resourceapi.DeviceTaint
	lastEvent time.Time
}

func (d *Driver) watchHealth(ctx context.Context) {
	logger := klog.FromContext(ctx)
	events := make(chan nvml.HealthEvent, 16)
	go func() {
		if err := nvml.WatchHealth(ctx, d.cfg.Health.NVML, events); err != nil {
			logger.Error(err, "GPU health is not watched")
		}
	}()
	recheck := time.NewTicker(max(d.cfg.Health.RecoverAfter/4, 100*time.Millisecond))
	defer recheck.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case ev := <-events:
			d.handleHealthEvent(ctx, ev)
		case <-recheck.C:
			d.recoverQuietGPUs(ctx)
		}
	}
}

func (d *Driver) handleHealthEvent(ctx context.Context, ev nvml.HealthEvent) {
	logger := klog.FromContext(ctx)
	name, ok := d.deviceByUUID(ev.UUID)
	if !ok {
		return
	}
	if d.cfg.Health.IgnoredXIDs[ev.XID] {
		logger.V(2).Info("Ignoring an application Xid", "device", name, "xid", ev.XID)
		d.metrics.healthEvents.WithLabelValues("ignored").Inc()
		return
	}
	effect, value := resourceapi.DeviceTaintEffectNoSchedule, "xid-"+strconv.FormatUint(ev.XID, 10)
	if ev.XID == nvml.XIDGPULost {
		// Pods on a GPU that is gone cannot make progress: evict them.
		effect, value = resourceapi.DeviceTaintEffectNoExecute, "gpu-lost"
	}
	now := time.Now()
	d.devicesMu.Lock()
	prev, had := d.unhealthy[name]
	d.unhealthy[name] = unhealthy{
		taint:     resourceapi.DeviceTaint{Key: TaintKey, Value: value, Effect: effect, TimeAdded: &metav1.Time{Time: now.Truncate(time.Second)}},
		lastEvent: now,
	}
	d.devicesMu.Unlock()
	d.metrics.healthEvents.WithLabelValues("fatal").Inc()
	if had && prev.taint.Value == value {
		return
	}
	logger.Info("GPU unhealthy, tainting it", "device", name, "xid", ev.XID, "effect", effect)
	d.recorder.Eventf(d.nodeRef(), corev1.EventTypeWarning, "GPUUnhealthy", "GPU %s (%s) reported Xid %d; tainted %s=%s:%s", name, ev.UUID, ev.XID, TaintKey, value, effect)
	d.republish(ctx)
}

func (d *Driver) recoverQuietGPUs(ctx context.Context) {
	var recovered []string
	d.devicesMu.Lock()
	for name, u := range d.unhealthy {
		if time.Since(u.lastEvent) >= d.cfg.Health.RecoverAfter {
			delete(d.unhealthy, name)
			recovered = append(recovered, name)
		}
	}
	d.devicesMu.Unlock()
	for _, name := range recovered {
		klog.FromContext(ctx).Info("GPU quiet again, removing its taint", "device", name)
		d.metrics.healthEvents.WithLabelValues("recovered").Inc()
		d.recorder.Eventf(d.nodeRef(), corev1.EventTypeNormal, "GPURecovered", "GPU %s reported no fatal event for %s; taint removed", name, d.cfg.Health.RecoverAfter)
	}
	if len(recovered) > 0 {
		d.republish(ctx)
	}
}

func (d *Driver) republish(ctx context.Context) {
	if err := d.publish(ctx); err != nil {
		klog.FromContext(ctx).Error(err, "Republishing after a health change")
	}
}

func (d *Driver) deviceByUUID(uuid string) (string, bool) {
	d.devicesMu.RLock()
	defer d.devicesMu.RUnlock()
	for name, dev := range d.devices {
		if dev.UUID == uuid {
			return name, true
		}
	}
	return "", false
}

// FeedSimulatedFaults reads fault lines appended to path, one JSON object
// per line such as {"gpu": 2, "xid": 48}, and injects them into a simulated
// node, so that a test or the demo can make a GPU fail from outside.
func FeedSimulatedFaults(ctx context.Context, path string, uuidOf func(index int) (string, bool), faults *nvml.Faults) {
	logger := klog.FromContext(ctx)
	var offset int64
	ticker := time.NewTicker(200 * time.Millisecond)
	defer ticker.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-ticker.C:
		}
		f, err := os.Open(path)
		if err != nil {
			continue
		}
		if _, err := f.Seek(offset, io.SeekStart); err != nil {
			f.Close()
			continue
		}
		r := bufio.NewReader(f)
		for {
			line, err := r.ReadBytes('\n')
			if err != nil {
				break // a partial line is read again next time
			}
			offset += int64(len(line))
			var fault struct {
				GPU int    `json:"gpu"`
				XID uint64 `json:"xid"`
			}
			if err := json.Unmarshal(line, &fault); err != nil {
				logger.Error(err, "Bad simulated fault line", "line", string(line))
				continue
			}
			uuid, ok := uuidOf(fault.GPU)
			if !ok {
				logger.Error(fmt.Errorf("no GPU %d", fault.GPU), "Simulated fault for an unknown GPU")
				continue
			}
			if err := faults.InjectXID(uuid, fault.XID); err != nil {
				logger.Error(err, "Injecting simulated fault")
			}
		}
		f.Close()
	}
}
