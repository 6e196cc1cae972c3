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

package bench

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"time"

	"github.com/prismgpu/prism/test/testbed"
)

// ReferenceDriverName is the driver name of the example driver's GPU profile.
const ReferenceDriverName = "gpu.example.com"

// ReferenceProc is the kubelet plugin of kubernetes-sigs/dra-example-driver,
// an external binary, with no kubelet either. Its checkpoint lives in its
// plugin directory, so under Dir like Prism's state.
type ReferenceProc struct {
	*testbed.Process
	Dir string
}

// Socket is the DRA gRPC socket.
func (r *ReferenceProc) Socket() string {
	return filepath.Join(r.Dir, "plugins", ReferenceDriverName, "dra.sock")
}

// StartReferencePlugin runs bin for node with 8 simulated GPUs, as many as
// Prism's bench fleet, everything under dir. Its client gets the rate limit
// Prism gets in the same run: at its own default of 5 QPS the loop's one
// claim GET per call waits about 200 ms for the limiter, which would measure
// the flag rather than the plugin.
func StartReferencePlugin(ctx context.Context, c *testbed.Cluster, bin, node, dir string, qps float64, burst int) (*ReferenceProc, error) {
	r := &ReferenceProc{Dir: dir}
	if err := os.MkdirAll(filepath.Join(dir, "registry"), 0o755); err != nil {
		return nil, fmt.Errorf("start reference plugin: %w", err)
	}
	if err := DropPageCache(bin); err != nil {
		return nil, fmt.Errorf("start reference plugin: %w", err)
	}
	var err error
	r.Process, err = testbed.StartProcess(ctx, "reference-plugin-"+node, dir, filepath.Join(c.WorkDir(), "logs", "reference-plugin-"+node+".log"), bin,
		"--node-name="+node,
		"--kubeconfig="+c.KubeconfigPath,
		"--kubelet-registrar-directory-path="+filepath.Join(dir, "registry"),
		"--kubelet-plugins-directory-path="+filepath.Join(dir, "plugins"),
		"--cdi-root="+filepath.Join(dir, "cdi"),
		"--num-devices=8",
		fmt.Sprintf("--kube-api-qps=%g", qps),
		fmt.Sprintf("--kube-api-burst=%d", burst),
	)
	return r, err
}

// WaitSocket returns when the DRA socket exists: the example driver serves
// no readiness endpoint, and its kubelet plugin helper listens before the
// driver publishes its slice, which prepare does not need.
func (r *ReferenceProc) WaitSocket(ctx context.Context, timeout time.Duration) error {
	deadline := time.Now().Add(timeout)
	for time.Now().Before(deadline) {
		if exited, err := r.Exited(); exited {
			return fmt.Errorf("reference plugin exited: %v (log %s)", err, r.LogPath)
		}
		if _, err := os.Stat(r.Socket()); err == nil {
			return nil
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(5 * time.Millisecond):
		}
	}
	return fmt.Errorf("reference plugin socket %s not there after %s (log %s)", r.Socket(), timeout, r.LogPath)
}
