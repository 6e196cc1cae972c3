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
