package plugin

import (
	"fmt"
	"path/filepath"

	"k8s.io/apimachinery/pkg/types"
)

// maxSocketPath is the longest path a Unix socket can be bound at on Linux:
// sun_path holds 108 bytes, the terminating NUL included.
const maxSocketPath = 107

// draSocketPath is where the kubeletplugin helper listens for the kubelet's
// DRA calls: dra.sock in the plugin directory, dra-<pod UID>.sock when
// rolling updates are on.
func draSocketPath(pluginDir string, podUID types.UID) string {
	name := "dra.sock"
	if podUID != "" {
		name = "dra-" + string(podUID) + ".sock"
	}
	return filepath.Join(pluginDir, name)
}

// checkDRASocketPath fails early, and says which setting to change, where
// binding the DRA socket would fail with a bare "invalid argument".
func checkDRASocketPath(pluginDir string, podUID types.UID) error {
	p := draSocketPath(pluginDir, podUID)
	if len(p) > maxSocketPath {
		return fmt.Errorf("the DRA socket %s would be %d bytes long, over the %d a Unix socket path may have: choose a shorter --kubelet-plugin-dir (chart: kubeletPlugin.paths.kubeletPluginDir)", p, len(p), maxSocketPath)
	}
	return nil
}
