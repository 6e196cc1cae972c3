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
	"os"
	"path/filepath"
	"sync"
	"sync/atomic"
	"time"

	"golang.org/x/sys/unix"
	"k8s.io/utils/clock"

	"github.com/prismgpu/prism/internal/plugin/checkpoint"
)

// timedMutex is the driver lock. It knows since when it is held, so that
// the liveness check can tell a busy plugin from a hung one.
type timedMutex struct {
	mu    sync.Mutex
	since atomic.Int64 // UnixNano of the current holder's Lock; 0 when free
	clock clock.PassiveClock
}

func (m *timedMutex) Lock() {
	m.mu.Lock()
	m.since.Store(m.clock.Now().UnixNano())
}

func (m *timedMutex) Unlock() {
	m.since.Store(0)
	m.mu.Unlock()
}

// heldFor is how long the current holder has held the lock, 0 when free.
func (m *timedMutex) heldFor() time.Duration {
	since := m.since.Load()
	if since == 0 {
		return 0
	}
	return m.clock.Since(time.Unix(0, since))
}

// serializeLockFile is the file the kubelet plugin helper locks around each
// kubelet call when two instances overlap in a rolling update.
const serializeLockFile = "serialize.lock"

// guard serialises whatever reads and writes the checkpoint: the
// kubelet's calls and the plugin's own work (taints, the stale-claim
// sweep, start-up sweeps). During a rolling update it also orders them
// with the other instance's, which writes the same checkpoint.
type guard struct {
	// mu serialises prepare and unprepare: the exclusivity check and the
	// checkpoint write that claims a device must be one step.
	mu         timedMutex
	checkpoint *checkpoint.Store
	// rollingUpdate is set while another instance may share the node;
	// pluginDir holds the helper's lock file then.
	rollingUpdate bool
	pluginDir     string
}

// lock takes the driver lock, timing the wait for the call's trace.
func (g *guard) lock(ctx context.Context) {
	done := span(ctx, StageLockWait)
	g.mu.Lock()
	done()
}

func (g *guard) unlock() { g.mu.Unlock() }

// sync rereads the checkpoint while a rolling update may
// have another instance writing it; the helper's file lock orders the calls.
func (g *guard) sync(ctx context.Context) error {
	if !g.rollingUpdate {
		return nil
	}
	return g.checkpoint.Reload(ctx)
}

// exclusive runs fn as the kubelet's calls run: under the driver lock,
// ordered with the other instance's calls during a rolling update, and with
// the checkpoint re-read first, so that work started by the plugin itself
// never writes back a stale checkpoint.
func (g *guard) exclusive(ctx context.Context, fn func() error) error {
	unlock, err := g.lockAcrossInstances()
	if err != nil {
		return err
	}
	defer unlock()
	g.mu.Lock()
	defer g.mu.Unlock()
	if err := g.sync(ctx); err != nil {
		return err
	}
	return fn()
}

// lockAcrossInstances takes the helper's file lock during a rolling update;
// alone on the node there is nothing to order with.
func (g *guard) lockAcrossInstances() (func(), error) {
	if !g.rollingUpdate || g.pluginDir == "" {
		return func() {}, nil
	}
	// Start creates the directory only after newDriver, whose rediscovery
	// may already record taints.
	if err := os.MkdirAll(g.pluginDir, 0o750); err != nil {
		return nil, fmt.Errorf("create plugin directory: %w", err)
	}
	path := filepath.Join(g.pluginDir, serializeLockFile)
	f, err := os.OpenFile(path, os.O_RDWR|os.O_CREATE, 0o600)
	if err != nil {
		return nil, fmt.Errorf("open %s: %w", path, err)
	}
	if err := unix.Flock(int(f.Fd()), unix.LOCK_EX); err != nil {
		f.Close()
		return nil, fmt.Errorf("lock %s: %w", path, err)
	}
	// Closing the file releases the lock.
	return func() { f.Close() }, nil
}
