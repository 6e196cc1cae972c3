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
