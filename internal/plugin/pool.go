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
	"fmt"
	"reflect"
	"sync"

	corev1 "k8s.io/api/core/v1"
	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/record"
	"k8s.io/dynamic-resource-allocation/resourceslice"
	"k8s.io/klog/v2"
)

// slicePool publishes the node's GPUs, with their taints, as the node's
// ResourceSlices through the helper's ResourceSlice controller.
type slicePool struct {
	publisher slicePublisher
	kube      kubernetes.Interface
	gpus      *nodeGPUs
	opts      poolOptions
	recorder  record.EventRecorder
	node      *corev1.ObjectReference
	metrics   *Metrics

	// mu makes building the slice's devices and publishing them one step,
	// so that a rediscovery cannot publish taints older than those a
	// health event published in between. It guards published.
	mu        sync.Mutex
	published []resourceslice.Slice
	// migNoted holds the UUIDs of MIG-capable GPUs not in MIG mode that
	// were already reported, so that each gets one log line and one Event.
	migNoted sync.Map
	// changed wakes the kubelet's health watchers (healthstatus.go).
	// Every change to the GPUs or their taints is published, so
	// publishIfChanged notifies it.
	changed healthSignal
	// dropped are the feature gates the API server was seen to lack.
	dropped droppedFeatures
}

// poolOptions are the Config fields that shape the published devices.
type poolOptions struct {
	ShareMemory, FiguresAsCapacity, MIGPartitions bool
}

// publish hands the node's pool to the helper's ResourceSlice controller. An
// empty pool is still published, so that the scheduler sees the node has none.
func (p *slicePool) publish(ctx context.Context) error {
	_, err := p.publishIfChanged(ctx, true)
	return err
}

// publishIfChanged publishes the devices as they are now, unless always is
// false and they are what was last published. It reports whether it
// published.
func (p *slicePool) publishIfChanged(ctx context.Context, always bool) (bool, error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	// The kubelet learns of a change even when the API server does not.
	p.changed.notify()
	slices, err := p.resourceSlices(ctx)
	if err != nil {
		return false, fmt.Errorf("build ResourceSlice devices: %w", err)
	}
	if !always && reflect.DeepEqual(slices, p.published) {
		return false, nil
	}
	err = p.publisher.PublishResources(ctx, resourceslice.DriverResources{Pools: map[string]resourceslice.Pool{
		p.node.Name: {Slices: slices},
	}})
	if err != nil {
		return false, fmt.Errorf("publish ResourceSlice: %w", err)
	}
	p.published = slices
	devices := sliceDevices(slices)
	p.metrics.publishedDevices.Set(float64(len(devices)))
	klog.FromContext(ctx).V(2).Info("Published ResourceSlice", "devices", len(devices), "slices", len(slices))
	return true, nil
}

func (p *slicePool) publishedDevices() []resourceapi.Device {
	p.mu.Lock()
	defer p.mu.Unlock()
	return sliceDevices(p.published)
}

// slicePublisher is the part of the kubelet plugin helper that publishes
// ResourceSlices; tests stand in for it.
type slicePublisher interface {
	PublishResources(ctx context.Context, resources resourceslice.DriverResources) error
}

// healthSignal wakes the kubelet's health watchers when the GPUs or their
// health may have changed. Waking costs the health monitor nothing: it
// never waits for a watcher, and a watcher that is behind sends only the
// state as it is when it catches up.
type healthSignal struct {
	mu      sync.Mutex
	changed chan struct{}
}

// wait returns a channel that is closed at the next notify. Take it before
// reading the state, so that a change made after the read is not missed.
func (s *healthSignal) wait() <-chan struct{} {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.changed == nil {
		s.changed = make(chan struct{})
	}
	return s.changed
}

func (s *healthSignal) notify() {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.changed != nil {
		close(s.changed)
		s.changed = nil
	}
}
