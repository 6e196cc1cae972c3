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

package bed

import (
	"bytes"
	"os"
	"path/filepath"
	"strconv"
)

// MPSProcesses are the running processes of the MPS daemons whose pipe
// directories are under stateDir, the plugin's state directory, with the
// servers they started, each with its pipe directory: what a container of
// the plugin holds besides the plugin. They are told by
// CUDA_MPS_PIPE_DIRECTORY in their environment, which the servers inherit
// from their daemon.
func MPSProcesses(stateDir string) (map[int]string, error) {
	entries, err := os.ReadDir("/proc")
	if err != nil {
		return nil, err
	}
	const name = "CUDA_MPS_PIPE_DIRECTORY="
	prefix := []byte(name + filepath.Join(stateDir, "mps") + "/")
	out := map[int]string{}
	for _, e := range entries {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		// A process that exits meanwhile, or is not ours to read, is none
		// of the plugin's.
		environ, err := os.ReadFile(filepath.Join("/proc", e.Name(), "environ"))
		if err != nil {
			continue
		}
		for _, kv := range bytes.Split(environ, []byte{0}) {
			if bytes.HasPrefix(kv, prefix) {
				out[pid] = string(kv[len(name):])
				break
			}
		}
	}
	return out, nil
}
