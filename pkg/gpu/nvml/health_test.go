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
	"errors"
	"runtime"
	"sync/atomic"
	"testing"
	"time"

	"github.com/NVIDIA/go-nvml/pkg/nvml"
	"github.com/NVIDIA/go-nvml/pkg/nvml/mock"
	"github.com/google/go-cmp/cmp"
	"github.com/google/go-cmp/cmp/cmpopts"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/klog/v2"
	"k8s.io/klog/v2/ktesting"
	testingclock "k8s.io/utils/clock/testing"
	"k8s.io/utils/ptr"
)

// hangTimeout turns a watcher that never delivers into a failure.
const hangTimeout = 10 * time.Second

// TestWatchHealthOutlivesAnUnreadableGPU: a GPU whose handle or UUID NVML
// cannot read when the watch starts is reported unreadable, does not stop
// the watch of the others, and is watched once it reads.
func TestWatchHealthOutlivesAnUnreadableGPU(t *testing.T) {
	for name, tc := range map[string]struct {
		// break_ makes GPU 1 unreadable while broken is set.
		break_  func(sim *Simulated, broken *atomic.Bool)
		wantErr error
	}{
		"handle": {
			break_: func(sim *Simulated, broken *atomic.Bool) {
				handle := sim.DeviceGetHandleByIndexFunc
				sim.DeviceGetHandleByIndexFunc = func(i int) (nvml.Device, nvml.Return) {
					if i == 1 && broken.Load() {
						return nil, nvml.ERROR_GPU_IS_LOST
					}
					return handle(i)
				}
			},
			wantErr: nvml.ERROR_GPU_IS_LOST,
		},
		"UUID": {
			break_: func(sim *Simulated, broken *atomic.Bool) {
				uuid := sim.Devices()[1].GetUUIDFunc
				sim.Devices()[1].GetUUIDFunc = func() (string, nvml.Return) {
					if broken.Load() {
						return "", nvml.ERROR_UNKNOWN
					}
					return uuid()
				}
			},
			wantErr: nvml.ERROR_UNKNOWN,
		},
		"registration, GPU lost": {
			break_: func(sim *Simulated, broken *atomic.Bool) {
				register := sim.Devices()[1].RegisterEventsFunc
				sim.Devices()[1].RegisterEventsFunc = func(types uint64, set nvml.EventSet) nvml.Return {
					if broken.Load() {
						return nvml.ERROR_GPU_IS_LOST
					}
					return register(types, set)
				}
			},
			wantErr: nvml.ERROR_GPU_IS_LOST,
		},
	} {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			_, ctx := ktesting.NewTestContext(t)
			ctx, cancel := context.WithCancel(ctx)
			sim := simulate(t, &Fleet{DriverVersion: "550.54.15", CUDADriverVersion: 12040, GPUs: []GPUGroup{{Product: "Tesla T4", Count: 2}}}, "node-a")
			uuid0, _ := sim.Devices()[0].GetUUID()
			uuid1, _ := sim.Devices()[1].GetUUID()
			lib, faults := SimulateFaults(sim)
			var broken atomic.Bool
			broken.Store(true)
			tc.break_(sim, &broken)

			events := make(chan HealthEvent)
			done := make(chan error)
			go func() { done <- WatchHealth(ctx, lib, events, wait.Backoff{Duration: time.Millisecond}) }()
			next := func() HealthEvent {
				t.Helper()
				select {
				case ev := <-events:
					return ev
				case err := <-done:
					t.Fatalf("WatchHealth returned %v while a GPU was unreadable", err)
				case <-time.After(hangTimeout):
					t.Fatal("no health event")
				}
				return HealthEvent{}
			}
			registered := func(uuid string) {
				t.Helper()
				select {
				case <-faults.Registered(uuid):
				case <-time.After(hangTimeout):
					t.Fatalf("GPU %s never registered for events", uuid)
				}
			}
			diffEvent := func(want, got HealthEvent) {
				t.Helper()
				if diff := cmp.Diff(want, got, cmpopts.EquateErrors()); diff != "" {
					t.Errorf("health event (-want +got):\n%s", diff)
				}
			}

			ev := next()
			if !errors.Is(ev.Unreadable, tc.wantErr) {
				t.Errorf("GPU 1 unreadable because %v, want %v", ev.Unreadable, tc.wantErr)
			}
			diffEvent(HealthEvent{Index: 1, Unreadable: ev.Unreadable}, ev)

			registered(uuid0)
			if err := faults.InjectXID(uuid0, 48); err != nil {
				t.Fatal(err)
			}
			diffEvent(HealthEvent{UUID: uuid0, XID: 48}, next())

			// NVML would not deliver an Xid of a GPU not registered.
			if err := faults.InjectXID(uuid1, 48); err == nil {
				t.Fatal("an Xid was raised on a GPU not registered for events")
			}
			broken.Store(false)
			registered(uuid1)
			if err := faults.InjectXID(uuid1, 48); err != nil {
				t.Fatal(err)
			}
			diffEvent(HealthEvent{UUID: uuid1, XID: 48}, next())

			cancel()
			select {
			case err := <-done:
				if err != nil {
					t.Errorf("WatchHealth: %v", err)
				}
			case <-time.After(hangTimeout):
				t.Fatal("WatchHealth did not return once its context ended")
			}
		})
	}
}

// TestWatchHealthFailsWithoutNVML: only NVML itself failing ends the watch.
func TestWatchHealthFailsWithoutNVML(t *testing.T) {
	for name, break_ := range map[string]func(sim *Simulated){
		"init": func(sim *Simulated) { sim.InitFunc = func() nvml.Return { return nvml.ERROR_DRIVER_NOT_LOADED } },
		"count": func(sim *Simulated) {
			sim.DeviceGetCountFunc = func() (int, nvml.Return) { return 0, nvml.ERROR_UNKNOWN }
		},
	} {
		t.Run(name, func(t *testing.T) {
			_, ctx := ktesting.NewTestContext(t)
			sim := simulate(t, oneOf("Tesla T4"), "node-a")
			lib, _ := SimulateFaults(sim)
			break_(sim)
			if err := WatchHealth(ctx, lib, make(chan HealthEvent), wait.Backoff{}); err == nil {
				t.Error("WatchHealth without NVML returned no error")
			}
		})
	}
}

// TestUnreadableGPUIsLoggedWithBackoff: a GPU that stays unreadable is sent
// once, and logged at default verbosity after 1, 2, 4, 8, ... failed
// attempts only.
func TestUnreadableGPUIsLoggedWithBackoff(t *testing.T) {
	logger := ktesting.NewLogger(t, ktesting.NewConfig(ktesting.BufferLogs(true)))
	ctx := klog.NewContext(context.Background(), logger)
	sim := simulate(t, oneOf("Tesla T4"), "node-a")
	sim.DeviceGetHandleByIndexFunc = func(int) (nvml.Device, nvml.Return) { return nil, nvml.ERROR_GPU_IS_LOST }
	events := make(chan HealthEvent, 2)
	w := &gpuWatch{lib: sim, events: events, index: 0, logger: logger}
	for range 9 {
		if w.try(ctx) {
			t.Fatal("an unreadable GPU counted as watched")
		}
	}
	if got := len(events); got != 1 {
		t.Errorf("sent %d Unreadable events for one GPU, want 1", got)
	}
	var logged []any
	for _, e := range logger.GetSink().(ktesting.Underlier).GetBuffer().Data() {
		if e.Verbosity == 0 {
			logged = append(logged, e.ParameterKVList[len(e.ParameterKVList)-1])
		}
	}
	if diff := cmp.Diff([]any{1, 2, 4, 8}, logged); diff != "" {
		t.Errorf("failed attempts logged at verbosity 0 (-want +got):\n%s", diff)
	}
}

// TestWatchHealthNamesTheGPUInstance: an Xid that NVML attributes to a MIG
// GPU instance is sent with that instance's ID, on the parent GPU's UUID;
// one that is the whole GPU's names none. Instance 0 (the instance that
// spans the GPU) is an instance like any other.
func TestWatchHealthNamesTheGPUInstance(t *testing.T) {
	_, ctx := ktesting.NewTestContext(t)
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	sim := simulate(t, oneOf("NVIDIA A100-SXM4-40GB"), "node-a")
	uuid, _ := sim.Devices()[0].GetUUID()
	lib, faults := SimulateFaults(sim)
	events := make(chan HealthEvent)
	go func() { _ = WatchHealth(ctx, lib, events, wait.Backoff{}) }()
	select {
	case <-faults.Registered(uuid):
	case <-time.After(hangTimeout):
		t.Fatal("GPU never registered for events")
	}

	for _, tc := range []struct {
		name   string
		inject func() error
		want   HealthEvent
	}{{
		name:   "whole GPU",
		inject: func() error { return faults.InjectXID(uuid, 48) },
		want:   HealthEvent{UUID: uuid, XID: 48},
	}, {
		name:   "GPU instance 5",
		inject: func() error { return faults.InjectInstanceXID(uuid, 5, 94) },
		want:   HealthEvent{UUID: uuid, XID: 94, GPUInstance: ptr.To[uint32](5)},
	}, {
		name:   "GPU instance 0",
		inject: func() error { return faults.InjectInstanceXID(uuid, 0, 94) },
		want:   HealthEvent{UUID: uuid, XID: 94, GPUInstance: ptr.To[uint32](0)},
	}} {
		t.Run(tc.name, func(t *testing.T) {
			if err := tc.inject(); err != nil {
				t.Fatal(err)
			}
			select {
			case got := <-events:
				if diff := cmp.Diff(tc.want, got, cmpopts.EquateErrors()); diff != "" {
					t.Errorf("health event (-want +got):\n%s", diff)
				}
			case <-time.After(hangTimeout):
				t.Fatal("no health event")
			}
		})
	}

	if err := faults.InjectInstanceXID(uuid, noInstance, 94); err == nil {
		t.Error("an Xid was raised on NVML's \"no instance\" ID as if it were an instance")
	}
}

// TestFailingWaitBacksOff: a wait for events that fails at once is retried
// with a backoff on the watch's clock, not in a loop, and logged at default
// verbosity at the 1st, 2nd, 4th, 8th, ... failure only. The unbacked loop
// called Wait some 300,000 times a second and logged each call.
func TestFailingWaitBacksOff(t *testing.T) {
	logger := ktesting.NewLogger(t, ktesting.NewConfig(ktesting.BufferLogs(true)))
	ctx, cancel := context.WithCancel(klog.NewContext(context.Background(), logger))
	defer cancel()
	sim := simulate(t, oneOf("Tesla T4"), "node-a")
	lib, _ := SimulateFaults(sim)
	// A loop that does not back off ends the watch here, so that the test
	// fails on the count below rather than hangs.
	const spinning = 1000
	var waits atomic.Int64
	sim.EventSetCreateFunc = func() (nvml.EventSet, nvml.Return) {
		return &mock.EventSet{
			WaitFunc: func(uint32) (nvml.EventData, nvml.Return) {
				if waits.Add(1) >= spinning {
					cancel()
				}
				return nvml.EventData{}, nvml.ERROR_UNKNOWN
			},
			FreeFunc: func() nvml.Return { return nvml.SUCCESS },
		}, nvml.SUCCESS
	}
	clk := testingclock.NewFakeClock(time.Date(2025, 3, 1, 12, 0, 0, 0, time.UTC))
	done := make(chan error, 1)
	go func() { done <- watchHealth(ctx, lib, make(chan HealthEvent), wait.Backoff{}, clk) }()

	// Ten minutes, a second at a time, each step once the watch waits on
	// the clock.
	const interval, step = 10 * time.Minute, time.Second
	for range interval / step {
		for !clk.HasWaiters() {
			select {
			case err := <-done:
				t.Fatalf("WatchHealth returned %v after %d waits without waiting on its clock", err, waits.Load())
			default:
				runtime.Gosched()
			}
		}
		clk.Step(step)
	}
	cancel()
	if err := <-done; err != nil {
		t.Errorf("WatchHealth: %v", err)
	}

	// At the backoff's cap, ten minutes hold interval/cap waits; the ramp
	// up to the cap adds fewer than ten. Fewer than interval/cap would mean
	// the watch stopped trying.
	got := int(waits.Load())
	if most, least := int(interval/waitRetry.Cap)+10, int(interval/waitRetry.Cap); got > most || got < least {
		t.Errorf("Wait called %d times in %s of failing at once, want %d to %d", got, interval, least, most)
	}
	var want, logged []any
	for n := 1; n <= got; n *= 2 {
		want = append(want, n)
	}
	for _, e := range logger.GetSink().(ktesting.Underlier).GetBuffer().Data() {
		if e.Verbosity == 0 && e.Message == "Waiting for NVML events failed; retrying" {
			logged = append(logged, kv(e.ParameterKVList, "failedWaits"))
		}
	}
	if diff := cmp.Diff(want, logged); diff != "" {
		t.Errorf("failed waits logged at verbosity 0 (-want +got):\n%s", diff)
	}
}

// TestUnattributedLossMarksEveryGPULost: NVML reporting a GPU lost without
// naming a GPU the watch knows marks every GPU of the node lost, and says
// so in the log; a loss that names one marks only that one.
func TestUnattributedLossMarksEveryGPULost(t *testing.T) {
	unreadable := &mock.Device{GetUUIDFunc: func() (string, nvml.Return) { return "", nvml.ERROR_INVALID_ARGUMENT }}
	for _, tc := range []struct {
		name string
		// event is what the first wait returns, given the node's GPUs.
		event   func(devices []*mock.Device) (nvml.EventData, nvml.Return)
		wantAll bool
	}{{
		name:    "lost, no device",
		event:   func([]*mock.Device) (nvml.EventData, nvml.Return) { return nvml.EventData{}, nvml.ERROR_GPU_IS_LOST },
		wantAll: true,
	}, {
		// How go-nvml reads NVML's null device handle.
		name: "lost, device without a UUID",
		event: func([]*mock.Device) (nvml.EventData, nvml.Return) {
			return nvml.EventData{Device: unreadable}, nvml.ERROR_GPU_IS_LOST
		},
		wantAll: true,
	}, {
		name: "Xid 79, no device",
		event: func([]*mock.Device) (nvml.EventData, nvml.Return) {
			return nvml.EventData{EventType: nvml.EventTypeXidCriticalError, EventData: XIDGPULost, GpuInstanceId: noInstance, ComputeInstanceId: noInstance}, nvml.SUCCESS
		},
		wantAll: true,
	}, {
		name: "lost, GPU 1",
		event: func(devices []*mock.Device) (nvml.EventData, nvml.Return) {
			return nvml.EventData{Device: devices[1]}, nvml.ERROR_GPU_IS_LOST
		},
	}} {
		t.Run(tc.name, func(t *testing.T) {
			logger := ktesting.NewLogger(t, ktesting.NewConfig(ktesting.BufferLogs(true)))
			ctx, cancel := context.WithCancel(klog.NewContext(context.Background(), logger))
			defer cancel()
			sim := simulate(t, &Fleet{DriverVersion: "550.54.15", CUDADriverVersion: 12040, GPUs: []GPUGroup{{Product: "Tesla T4", Count: 3}}}, "node-a")
			lib, _ := SimulateFaults(sim)
			var uuids []string
			for _, d := range sim.Devices() {
				uuid, _ := d.GetUUID()
				uuids = append(uuids, uuid)
			}
			// The second wait says that the watch is done with the first
			// one's event: the events are sent unbuffered, so that all of
			// them were received by then.
			var waits atomic.Int64
			drained := make(chan struct{})
			sim.EventSetCreateFunc = func() (nvml.EventSet, nvml.Return) {
				return &mock.EventSet{
					WaitFunc: func(uint32) (nvml.EventData, nvml.Return) {
						switch waits.Add(1) {
						case 1:
							return tc.event(sim.Devices())
						case 2:
							close(drained)
						}
						<-ctx.Done()
						return nvml.EventData{}, nvml.ERROR_TIMEOUT
					},
					FreeFunc: func() nvml.Return { return nvml.SUCCESS },
				}, nvml.SUCCESS
			}
			clk := testingclock.NewFakeClock(time.Date(2025, 3, 1, 12, 0, 0, 0, time.UTC))
			events := make(chan HealthEvent)
			done := make(chan error, 1)
			go func() { done <- watchHealth(ctx, lib, events, wait.Backoff{}, clk) }()

			want := []HealthEvent{{UUID: uuids[1], XID: XIDGPULost}}
			if tc.wantAll {
				want = nil
				for _, uuid := range uuids {
					want = append(want, HealthEvent{UUID: uuid, XID: XIDGPULost})
				}
			}
			var got []HealthEvent
		read:
			for {
				select {
				case ev := <-events:
					got = append(got, ev)
					continue
				case <-drained:
					break read
				case err := <-done:
					t.Fatalf("WatchHealth returned %v after sending %+v", err, got)
				default:
				}
				// A lost GPU fails the wait, which is retried after a pause.
				if clk.HasWaiters() {
					clk.Step(waitRetry.Cap)
				}
				runtime.Gosched()
			}
			cancel()
			if err := <-done; err != nil {
				t.Errorf("WatchHealth: %v", err)
			}
			if diff := cmp.Diff(want, got, cmpopts.EquateErrors()); diff != "" {
				t.Errorf("health events (-want +got):\n%s", diff)
			}
			var said []any
			for _, e := range logger.GetSink().(ktesting.Underlier).GetBuffer().Data() {
				if e.Verbosity == 0 && e.Message == "NVML reports a GPU lost without naming one the watch knows; marking every GPU lost" {
					said = append(said, kv(e.ParameterKVList, "gpus"))
				}
			}
			var wantSaid []any
			if tc.wantAll {
				wantSaid = []any{uuids}
			}
			if diff := cmp.Diff(wantSaid, said); diff != "" {
				t.Errorf("GPUs logged as all lost (-want +got):\n%s", diff)
			}
		})
	}
}

// kv is the value of key in a log entry's key/value list; nil when absent.
func kv(list []any, key string) any {
	for i := 0; i+1 < len(list); i += 2 {
		if list[i] == key {
			return list[i+1]
		}
	}
	return nil
}
