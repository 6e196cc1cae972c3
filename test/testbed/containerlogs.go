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
	"context"
	"os"
	"path/filepath"
	"strings"
	"time"
)

// keepContainerLogs hard-links every container log the kubelet creates under
// podLogsDir into logsDir as container-<namespace>_<pod>_<container>-<restart>.log,
// until ctx ends, and once more after. The kubelet deletes a pod's logs with the
// pod; the link keeps what the container wrote, so that a failed test still
// shows it beside the components' logs.
func keepContainerLogs(ctx context.Context, podLogsDir, logsDir string) <-chan struct{} {
	done := make(chan struct{})
	go func() {
		defer close(done)
		t := time.NewTicker(500 * time.Millisecond)
		defer t.Stop()
		for {
			linkContainerLogs(podLogsDir, logsDir)
			select {
			case <-ctx.Done():
				linkContainerLogs(podLogsDir, logsDir)
				return
			case <-t.C:
			}
		}
	}()
	return done
}

// linkContainerLogs links the kubelet's <ns>_<pod>_<uid>/<container>/<n>.log files.
func linkContainerLogs(podLogsDir, logsDir string) {
	files, _ := filepath.Glob(filepath.Join(podLogsDir, "*", "*", "*.log"))
	for _, f := range files {
		rel, err := filepath.Rel(podLogsDir, f)
		if err != nil {
			continue
		}
		parts := strings.Split(rel, string(filepath.Separator))
		podDir := parts[0]
		// The pod UID is the last field; its first eight characters tell a
		// recreated pod of the same name apart.
		if i := strings.LastIndex(podDir, "_"); i > 0 && len(podDir)-i > 8 {
			podDir = podDir[:i+9]
		}
		name := "container-" + podDir + "_" + parts[1] + "-" + strings.TrimSuffix(parts[2], ".log") + ".log"
		// Link fails when the name exists, which is the common case.
		_ = os.Link(f, filepath.Join(logsDir, name))
	}
}
