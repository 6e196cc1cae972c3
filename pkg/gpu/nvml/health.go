package nvml

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/NVIDIA/go-nvml/pkg/nvml"
	"github.com/NVIDIA/go-nvml/pkg/nvml/mock"
	"k8s.io/klog/v2"
)

// XIDGPULost is the Xid NVML reports when a GPU has fallen off the bus.
const XIDGPULost = 79

// HealthEvent is what NVML said about one GPU.
type HealthEvent struct {
	UUID string
	// XID is the Xid error code, XIDGPULost for a GPU that is gone.
	XID uint64
}

// waitTimeoutMs bounds each wait so that the watcher notices ctx ending.
const waitTimeoutMs = 1000

// WatchHealth registers for critical Xid events on every GPU and sends them
// until ctx ends. A GPU that NVML reports as lost is sent as XIDGPULost.
func WatchHealth(ctx context.Context, lib nvml.Interface, events chan<- HealthEvent) error {
	logger := klog.FromContext(ctx)
	if ret := lib.Init(); ret != nvml.SUCCESS {
		return fmt.Errorf("initialize NVML for health events: %v", ret)
	}
	defer lib.Shutdown()
	set, ret := lib.EventSetCreate()
	if ret != nvml.SUCCESS {
		return fmt.Errorf("create NVML event set: %v", ret)
	}
	defer set.Free()
	count, ret := lib.DeviceGetCount()
	if ret != nvml.SUCCESS {
		return fmt.Errorf("count GPUs: %v", ret)
	}
	uuids := map[string]bool{}
	for i := range count {
		dev, ret := lib.DeviceGetHandleByIndex(i)
		if ret != nvml.SUCCESS {
			return fmt.Errorf("GPU %d: %v", i, ret)
		}
		uuid, ret := dev.GetUUID()
		if ret != nvml.SUCCESS {
			return fmt.Errorf("GPU %d UUID: %v", i, ret)
		}
		if ret := dev.RegisterEvents(nvml.EventTypeXidCriticalError, set); ret != nvml.SUCCESS {
			// Some boards (and MIG-enabled ones) refuse; the rest are still watched.
			logger.Info("GPU does not report Xid events; its health is not watched", "uuid", uuid, "reason", ret.Error())
			continue
		}
		uuids[uuid] = true
	}
	for ctx.Err() == nil {
		data, ret := set.Wait(waitTimeoutMs)
		switch {
		case ret == nvml.ERROR_TIMEOUT:
			continue
		case ret == nvml.ERROR_GPU_IS_LOST && data.Device != nil:
			data.EventData = XIDGPULost
		case ret != nvml.SUCCESS:
			logger.Error(errors.New(ret.Error()), "Waiting for NVML events")
			continue
		}
		if data.Device == nil {
			continue
		}
		uuid, ret := data.Device.GetUUID()
		if ret != nvml.SUCCESS {
			continue
		}
		select {
		case events <- HealthEvent{UUID: uuid, XID: data.EventData}:
		case <-ctx.Done():
		}
	}
	return nil
}

// Faults injects NVML events into a simulated node, as a failing GPU would
// raise them; tests and the demo use it to exercise health handling.
type Faults struct {
	queue  chan nvml.EventData
	byUUID map[string]*mock.Device
}

// SimulateFaults returns a copy of sim whose event set delivers what Inject
// queues.
func SimulateFaults(sim *Simulated) (nvml.Interface, *Faults) {
	f := &Faults{queue: make(chan nvml.EventData, 64), byUUID: map[string]*mock.Device{}}
	for _, d := range sim.Devices() {
		uuid, _ := d.GetUUID()
		f.byUUID[uuid] = d
		d.RegisterEventsFunc = func(uint64, nvml.EventSet) nvml.Return { return nvml.SUCCESS }
	}
	sim.EventSetCreateFunc = func() (nvml.EventSet, nvml.Return) {
		return &mock.EventSet{
			WaitFunc: func(timeoutMs uint32) (nvml.EventData, nvml.Return) {
				select {
				case e := <-f.queue:
					return e, nvml.SUCCESS
				case <-time.After(time.Duration(timeoutMs) * time.Millisecond):
					return nvml.EventData{}, nvml.ERROR_TIMEOUT
				}
			},
			FreeFunc: func() nvml.Return { return nvml.SUCCESS },
		}, nvml.SUCCESS
	}
	return sim, f
}

// InjectXID raises an Xid error on the GPU with this UUID.
func (f *Faults) InjectXID(uuid string, xid uint64) error {
	d, ok := f.byUUID[uuid]
	if !ok {
		return fmt.Errorf("no simulated GPU %s", uuid)
	}
	f.queue <- nvml.EventData{Device: d, EventType: nvml.EventTypeXidCriticalError, EventData: xid}
	return nil
}
