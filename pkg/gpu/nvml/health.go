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

package nvml

import (
	"context"
	"fmt"
	"maps"
	"math"
	"slices"
	"sync"
	"time"

	"github.com/NVIDIA/go-nvml/pkg/nvml"
	"github.com/NVIDIA/go-nvml/pkg/nvml/mock"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/klog/v2"
	"k8s.io/utils/clock"
)

// XIDGPULost is the Xid NVML reports when a GPU has fallen off the bus.
const XIDGPULost = 79

// noInstance is NVML's GPU and compute instance ID of an event that no MIG
// instance raised: the GPU is not in MIG mode, or the error is the whole
// GPU's.
const noInstance = math.MaxUint32

// HealthEvent is what NVML said about one GPU: an Xid error, or that it
// cannot be read at all.
type HealthEvent struct {
	// UUID is the GPU's; empty when Unreadable says its UUID cannot be read.
	// For an Xid of a MIG instance it is still the parent GPU's.
	UUID string
	// XID is the Xid error code, XIDGPULost for a GPU that is gone.
	XID uint64
	// GPUInstance is the ID of the MIG GPU instance that raised the Xid, on
	// the GPU UUID names; nil when the Xid is the whole GPU's. A pointer,
	// because 0 is a valid instance ID (the instance that spans the GPU).
	GPUInstance *uint32
	// Unreadable says why NVML cannot read the GPU at Index (its handle or
	// its UUID), so that its health cannot be watched; nil for an Xid.
	Unreadable error
	// Index is the GPU's NVML index. It is set with Unreadable, the only
	// way to name a GPU whose UUID is unknown.
	Index int
}

// waitTimeoutMs bounds each wait so that the watcher notices ctx ending.
const waitTimeoutMs = 1000

// DefaultHealthRetry paces the attempts to read a GPU that NVML could not
// read when the watch started: after a second, then twice as long each
// time up to five minutes, until it reads or the watch ends.
var DefaultHealthRetry = wait.Backoff{Duration: time.Second, Factor: 2, Jitter: 0.1, Steps: math.MaxInt32, Cap: 5 * time.Minute}

// waitRetry paces the waits for events after one failed: NVML returns a
// failure at once, not after the wait's timeout, so that without a pause a
// failure that persists (NVML gone under the plugin, a lost GPU that every
// wait reports) would be retried hundreds of thousands of times a second.
// The pause starts at a tenth of a second, so that an error that clears
// costs nothing, and doubles up to ten seconds, which bounds how late an
// Xid of another GPU is read while one is lost. A wait that succeeds or
// times out starts it over.
var waitRetry = wait.Backoff{Duration: 100 * time.Millisecond, Factor: 2, Steps: math.MaxInt32, Cap: 10 * time.Second}

// WatchHealth registers for critical Xid events on every GPU and sends them
// until ctx ends. A GPU that NVML reports as lost is sent as XIDGPULost; a
// loss that NVML does not attribute to a GPU it can name is sent for every
// GPU the watch knows, since any of them may be the one.
//
// Each GPU is watched on its own. One whose handle or UUID NVML cannot read
// is sent once as Unreadable and read again with the retry backoff
// (DefaultHealthRetry when zero) until it reads, and from then on watched
// like the others, which are watched meanwhile. Only NVML itself failing
// (initialising, creating the event set, counting the GPUs) ends the watch
// with an error; a wait for events that fails is retried with a backoff.
func WatchHealth(ctx context.Context, lib nvml.Interface, events chan<- HealthEvent, retry wait.Backoff) error {
	return watchHealth(ctx, lib, events, retry, clock.RealClock{})
}

// watchHealth is WatchHealth on a clock that paces the failed waits.
func watchHealth(ctx context.Context, lib nvml.Interface, events chan<- HealthEvent, retry wait.Backoff, clk clock.Clock) error {
	logger := klog.FromContext(ctx)
	if retry == (wait.Backoff{}) {
		retry = DefaultHealthRetry
	}
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
	gpus := &knownGPUs{uuids: map[int]string{}}
	// The retries register with the set, so it is freed only after they
	// have returned.
	var retries sync.WaitGroup
	defer retries.Wait()
	for i := range count {
		w := &gpuWatch{lib: lib, set: set, events: events, index: i, gpus: gpus, logger: klog.LoggerWithValues(logger, "index", i)}
		if w.try(ctx) {
			continue
		}
		retries.Go(func() {
			_ = retry.DelayFunc().Until(ctx, false, true, func(ctx context.Context) (bool, error) {
				return w.try(ctx), nil
			})
		})
	}
	// The set is kept whatever the waits return. NVML documents no failure
	// of a wait that a new set would cure (an uninitialised library, a lost
	// GPU, an unknown error), and a new set would have to register every
	// GPU again, which a lost one refuses, so that its Xids would no longer
	// be read.
	failing := waitFailures{logger: logger}
	for ctx.Err() == nil {
		data, ret := set.Wait(waitTimeoutMs)
		switch ret {
		case nvml.SUCCESS:
			failing.succeeded()
			deliver(ctx, logger, events, gpus, data, true)
		case nvml.ERROR_TIMEOUT:
			failing.succeeded()
		case nvml.ERROR_GPU_IS_LOST:
			// The whole GPU is gone, whatever else the data says.
			data.EventData, data.GpuInstanceId = XIDGPULost, noInstance
			deliver(ctx, logger, events, gpus, data, failing.failed(ret))
			failing.pause(ctx, clk)
		default:
			failing.failed(ret)
			failing.pause(ctx, clk)
		}
	}
	return nil
}

// deliver sends the event NVML delivered, on the GPU it names. A lost GPU
// that it does not name (no device, or one whose UUID cannot be read, which
// is how NVML's null handle reads through go-nvml) or names as none the
// watch registered is sent as lost for every GPU the watch knows: NVML says
// that one is gone but not which, and leaving work on a lost GPU is the
// worse mistake. Other Xids that name no GPU are dropped, since tainting
// every GPU for them would drain a node for what may be one GPU's
// recoverable error. loud says whether to log the loss at default
// verbosity: a failing wait that repeats it is logged as the failure is.
func deliver(ctx context.Context, logger klog.Logger, events chan<- HealthEvent, gpus *knownGPUs, data nvml.EventData, loud bool) {
	uuid, named := "", false
	if data.Device != nil {
		var ret nvml.Return
		uuid, ret = data.Device.GetUUID()
		named = ret == nvml.SUCCESS
	}
	if data.EventData == XIDGPULost && !(named && gpus.has(uuid)) {
		all := gpus.all()
		if !loud {
			logger = logger.V(4)
		}
		logger.Info("NVML reports a GPU lost without naming one the watch knows; marking every GPU lost", "uuid", uuid, "gpus", all)
		for _, uuid := range all {
			send(ctx, events, HealthEvent{UUID: uuid, XID: XIDGPULost})
		}
		return
	}
	if !named {
		logger.V(2).Info("Dropping an Xid that NVML did not attribute to a GPU", "xid", data.EventData)
		return
	}
	ev := HealthEvent{UUID: uuid, XID: data.EventData}
	if data.GpuInstanceId != noInstance {
		ev.GPUInstance = &data.GpuInstanceId
	}
	send(ctx, events, ev)
}

// knownGPUs are the UUIDs of the GPUs the watch has read, by index: the
// node's GPUs as far as the watch can name them.
type knownGPUs struct {
	mu    sync.Mutex
	uuids map[int]string
}

func (g *knownGPUs) add(index int, uuid string) {
	g.mu.Lock()
	defer g.mu.Unlock()
	g.uuids[index] = uuid
}

func (g *knownGPUs) has(uuid string) bool {
	g.mu.Lock()
	defer g.mu.Unlock()
	for _, u := range g.uuids {
		if u == uuid {
			return true
		}
	}
	return false
}

// all is the UUIDs in index order.
func (g *knownGPUs) all() []string {
	g.mu.Lock()
	defer g.mu.Unlock()
	indices := slices.Sorted(maps.Keys(g.uuids))
	uuids := make([]string, 0, len(indices))
	for _, i := range indices {
		uuids = append(uuids, g.uuids[i])
	}
	return uuids
}

// waitFailures paces and logs the waits for events that fail in a row.
type waitFailures struct {
	logger  klog.Logger
	backoff wait.Backoff
	// delay is the pause after the latest failure; n counts the failures
	// in a row, and last is the latest one's.
	delay time.Duration
	n     int
	last  nvml.Return
}

// failed counts a failed wait and logs it at default verbosity when its
// error differs from the one before, or at the 1st, 2nd, 4th, 8th, ...
// failure in a row, so that a failure that persists does not fill the log;
// every failure is logged at verbosity 4. It says whether it logged at
// default verbosity.
func (f *waitFailures) failed(ret nvml.Return) bool {
	if f.n == 0 {
		f.backoff = waitRetry
	}
	f.n++
	f.delay = f.backoff.Step()
	loud := ret != f.last || f.n&(f.n-1) == 0
	f.last = ret
	logger := f.logger
	if !loud {
		logger = logger.V(4)
	}
	logger.Info("Waiting for NVML events failed; retrying", "err", ret.Error(), "failedWaits", f.n, "retryIn", f.delay)
	return loud
}

// succeeded ends a run of failures, saying so if there was one.
func (f *waitFailures) succeeded() {
	if f.n > 0 {
		f.logger.Info("Waiting for NVML events works again", "failedWaits", f.n)
	}
	f.n, f.last = 0, nvml.SUCCESS
}

// pause waits out the delay after the latest failure, or until ctx ends.
func (f *waitFailures) pause(ctx context.Context, clk clock.Clock) {
	t := clk.NewTimer(f.delay)
	defer t.Stop()
	select {
	case <-t.C():
	case <-ctx.Done():
	}
}

// gpuWatch registers one GPU for Xid events, as often as it takes.
type gpuWatch struct {
	lib    nvml.Interface
	set    nvml.EventSet
	events chan<- HealthEvent
	index  int
	gpus   *knownGPUs
	logger klog.Logger
	// failures counts the attempts that failed; reported is whether the
	// GPU was sent as Unreadable.
	failures int
	reported bool
}

// try registers the GPU and says whether it is done with it: registered,
// or not able to report Xids at all.
func (w *gpuWatch) try(ctx context.Context) bool {
	dev, ret := w.lib.DeviceGetHandleByIndex(w.index)
	if ret != nvml.SUCCESS {
		return w.failed(ctx, fmt.Errorf("getting handle: %w", ret), true)
	}
	uuid, ret := dev.GetUUID()
	if ret != nvml.SUCCESS {
		return w.failed(ctx, fmt.Errorf("getting UUID: %w", ret), true)
	}
	if w.gpus != nil {
		w.gpus.add(w.index, uuid)
	}
	switch ret := dev.RegisterEvents(nvml.EventTypeXidCriticalError, w.set); ret {
	case nvml.SUCCESS:
	case nvml.ERROR_NOT_SUPPORTED:
		// Some boards (and MIG-enabled ones) refuse for good; the rest are
		// still watched.
		w.logger.Info("GPU does not report Xid events; its health is not watched", "uuid", uuid, "reason", ret.Error())
		return true
	default:
		return w.failed(ctx, fmt.Errorf("registering %s for Xid events: %w", uuid, ret), ret == nvml.ERROR_GPU_IS_LOST)
	}
	if w.failures > 0 {
		w.logger.Info("GPU reads again; watching its health", "uuid", uuid, "failedAttempts", w.failures)
	}
	return true
}

// failed reports a failed attempt. A GPU that NVML cannot read is sent as
// Unreadable, once: it is unhealthy as far as anyone can tell. The log says
// so at the 1st, 2nd, 4th, 8th, ... failure, so that a GPU that stays
// unreadable does not fill the log; every attempt is logged at verbosity 4.
func (w *gpuWatch) failed(ctx context.Context, err error, unreadable bool) bool {
	w.failures++
	if unreadable && !w.reported {
		w.reported = true
		send(ctx, w.events, HealthEvent{Index: w.index, Unreadable: err})
	}
	logger := w.logger
	if w.failures&(w.failures-1) != 0 {
		logger = logger.V(4)
	}
	msg := "Cannot register the GPU for Xid events; retrying"
	if unreadable {
		msg = "GPU cannot be read; its health is not watched until it reads, retrying"
	}
	logger.Info(msg, "err", err.Error(), "failedAttempts", w.failures)
	return false
}

func send(ctx context.Context, events chan<- HealthEvent, ev HealthEvent) {
	select {
	case events <- ev:
	case <-ctx.Done():
	}
}

// Faults injects NVML events into a simulated node, as a failing GPU would
// raise them; tests and the demo use it to exercise health handling. As
// from NVML, a GPU's events are delivered only once it is registered for
// them.
type Faults struct {
	queue  chan nvml.EventData
	byUUID map[string]*simulatedWatch
	// uuids are the GPUs' in NVML index order, as a faults file names them.
	uuids []string
}

type simulatedWatch struct {
	device     *mock.Device
	register   sync.Once
	registered chan struct{}
}

// SimulateFaults returns a copy of sim whose event set delivers what Inject
// queues.
func SimulateFaults(sim *Simulated) (nvml.Interface, *Faults) {
	f := &Faults{queue: make(chan nvml.EventData, 64), byUUID: map[string]*simulatedWatch{}}
	for _, d := range sim.Devices() {
		uuid, _ := d.GetUUID()
		w := &simulatedWatch{device: d, registered: make(chan struct{})}
		f.byUUID[uuid] = w
		f.uuids = append(f.uuids, uuid)
		d.RegisterEventsFunc = func(uint64, nvml.EventSet) nvml.Return {
			w.register.Do(func() { close(w.registered) })
			return nvml.SUCCESS
		}
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

// Registered is closed once the GPU with this UUID is registered for
// events; nil for a GPU that the node does not have.
func (f *Faults) Registered(uuid string) <-chan struct{} {
	if w, ok := f.byUUID[uuid]; ok {
		return w.registered
	}
	return nil
}

// InjectXID raises an Xid error on the GPU with this UUID, as the whole
// GPU's. It is an error to raise one on a GPU not registered for events,
// which NVML would not deliver.
func (f *Faults) InjectXID(uuid string, xid uint64) error {
	return f.inject(uuid, xid, noInstance)
}

// InjectInstanceXID raises an Xid error in the MIG GPU instance with this
// ID on the GPU with this UUID, as NVML reports one: on the parent GPU,
// naming the instance. The ID is not checked against the GPU's instances,
// so that a test can raise one for an instance the plugin does not know.
func (f *Faults) InjectInstanceXID(uuid string, gpuInstance uint32, xid uint64) error {
	if gpuInstance == noInstance {
		return fmt.Errorf("GPU instance ID %d is NVML's \"no instance\"; use InjectXID", gpuInstance)
	}
	return f.inject(uuid, xid, gpuInstance)
}

func (f *Faults) inject(uuid string, xid uint64, gpuInstance uint32) error {
	w, ok := f.byUUID[uuid]
	if !ok {
		return fmt.Errorf("no simulated GPU %s", uuid)
	}
	select {
	case <-w.registered:
	default:
		return fmt.Errorf("simulated GPU %s is not registered for events; NVML would not report its Xid", uuid)
	}
	f.queue <- nvml.EventData{Device: w.device, EventType: nvml.EventTypeXidCriticalError, EventData: xid,
		GpuInstanceId: gpuInstance, ComputeInstanceId: noInstance}
	return nil
}
