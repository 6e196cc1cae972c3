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

package testbed

import (
	"bytes"
	"context"
	"os"
	"strings"
	"sync"
	"testing"

	"k8s.io/klog/v2"
	"k8s.io/klog/v2/ktesting"
)

// OptOutEnv lets a caller without root skip the test-bed tests explicitly.
// Without it such tests fail, so that CI never passes by skipping them.
const OptOutEnv = "PRISM_SKIP_TESTBED"

// RequireRoot fails the test unless it runs as root, or skips it when the
// caller opted out with PRISM_SKIP_TESTBED=1.
func RequireRoot(t testing.TB) {
	t.Helper()
	if os.Geteuid() == 0 {
		return
	}
	if os.Getenv(OptOutEnv) == "1" {
		t.Skipf("test bed skipped: not root and %s=1", OptOutEnv)
	}
	t.Fatalf("this test runs real kubelets and needs root; run it as root, or set %s=1 to skip it on purpose", OptOutEnv)
}

// ForTest starts a cluster for one test and stops it when the test ends. When
// the test fails, the work directory and every component's log are kept and
// the tail of each log is printed.
func ForTest(t *testing.T, opts Options) (context.Context, *Cluster) {
	t.Helper()
	RequireRoot(t)
	_, ctx := ktesting.NewTestContext(t)
	ctx, cancel := context.WithCancel(ctx)
	// Short, because unix socket paths are limited to 108 bytes.
	dir, err := os.MkdirTemp("/tmp", "prism-tb-")
	if err != nil {
		t.Fatal(err)
	}
	opts.WorkDir = dir
	c, err := Start(ctx, opts)
	t.Cleanup(func() {
		keep := t.Failed() || os.Getenv("PRISM_KEEP_TESTBED") == "1"
		if c != nil && !keep && background.stop(c, dir) {
			cancel()
			return
		}
		if c != nil {
			c.Stop(context.WithoutCancel(ctx))
		}
		cancel()
		if keep {
			dumpLogs(t, dir)
			return
		}
		if err := os.RemoveAll(dir); err != nil {
			t.Logf("remove test-bed dir: %v", err)
		}
	})
	if err != nil {
		t.Fatalf("start test bed: %v", err)
	}
	return ctx, c
}

// background stops the clusters of passing tests after the tests have
// returned, when StopInBackground turned it on.
var background backgroundStops

type backgroundStops struct {
	mu      sync.Mutex
	on      bool
	stopped sync.WaitGroup
}

// StopInBackground makes ForTest stop the cluster of a passing test, and
// remove its directory, after the test has returned, so that the next test
// starts while it stops. A failing test's cluster is stopped before the test
// ends, as without it, so that its logs are complete when printed. Call it
// from TestMain before m.Run, and the function it returns after: it waits
// for every stop, so that no component outlives the test binary.
func StopInBackground() (wait func()) {
	background.mu.Lock()
	background.on = true
	background.mu.Unlock()
	return func() {
		background.mu.Lock()
		background.on = false
		background.mu.Unlock()
		background.stopped.Wait()
	}
}

// stop stops c and removes dir in the background and returns true, or
// returns false when stops are not in the background. Its log lines go to
// klog, not to the test, which has returned by then.
func (b *backgroundStops) stop(c *Cluster, dir string) bool {
	b.mu.Lock()
	defer b.mu.Unlock()
	if !b.on {
		return false
	}
	b.stopped.Add(1)
	go func() {
		defer b.stopped.Done()
		ctx := klog.NewContext(context.Background(), klog.Background())
		c.Stop(ctx)
		if err := os.RemoveAll(dir); err != nil {
			klog.Background().Error(err, "Removing a test-bed directory")
		}
	}()
	return true
}

func dumpLogs(t *testing.T, dir string) {
	t.Logf("test-bed state and logs kept in %s", dir)
	c := &Cluster{opts: Options{WorkDir: dir}}
	for _, f := range c.LogFiles() {
		data, err := os.ReadFile(f)
		if err != nil {
			continue
		}
		lines := bytes.Split(bytes.TrimSpace(data), []byte("\n"))
		if len(lines) > 25 {
			lines = lines[len(lines)-25:]
		}
		t.Logf("---- last lines of %s ----\n%s", f, strings.TrimSpace(string(bytes.Join(lines, []byte("\n")))))
	}
}
