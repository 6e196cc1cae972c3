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

package e2e

import (
	"bytes"
	"path/filepath"
	"strings"
	"testing"

	"github.com/prismgpu/prism/demo/bed"
	"github.com/prismgpu/prism/demo/scenario"
	"github.com/prismgpu/prism/test/testbed"
)

// TestDemo runs every scenario of demo/specs, in-process, against a test-bed
// cluster set up as `make demo` sets it up (without its daemon), and fails
// if any scenario misses the expectation written into its spec file.
func TestDemo(t *testing.T) {
	ctx, cluster := testbed.ForTest(t, testbed.Options{CRDDirs: bed.CRDDirs(repoRoot)})
	ncuDir := buildStandInNCU(t)
	var log bytes.Buffer
	b, err := bed.Setup(ctx, cluster, bed.Options{
		RepoRoot: repoRoot, PluginBin: pluginBinary, ControllerBin: controllerBinary, NCUDir: ncuDir, Nodes: bed.DemoNodes, Log: &log,
		// Scenario 12 needs the taint only while it places one pod, and then
		// waits for it to lift; the last flag wins over the demo's 20 s.
		PluginFlags: []string{"--health-recover-after=10s"},
	})
	t.Log(strings.TrimSpace(log.String()))
	if err != nil {
		t.Fatalf("set up demo environment: %v", err)
	}
	t.Cleanup(b.Stop)
	log.Reset()
	res, err := scenario.Run(ctx, scenario.Env{Config: cluster.Config, StateDirs: b.StateDirs, RepoRoot: repoRoot, Log: &log}, filepath.Join(repoRoot, "demo", "specs"))
	t.Log(strings.TrimSpace(log.String()))
	var table bytes.Buffer
	res.Print(&table)
	t.Logf("results:\n%s", table.String())
	if err != nil {
		t.Fatalf("run scenarios: %v", err)
	}
	if len(res.Scenarios) < 14 {
		t.Errorf("ran %d scenarios, want the 14 of demo/specs", len(res.Scenarios))
	}
	if failed := res.Failed(); len(failed) > 0 {
		t.Errorf("scenarios missed their expectation: %s", strings.Join(failed, ", "))
	}
}
