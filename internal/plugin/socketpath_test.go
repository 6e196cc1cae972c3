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
	"strings"
	"testing"

	"k8s.io/apimachinery/pkg/types"
)

func TestCheckDRASocketPath(t *testing.T) {
	const uid = types.UID("c2e4a7fd-c161-4666-9b1a-a01511e2981e")
	for _, tc := range []struct {
		name, dir string
		uid       types.UID
		wantErr   bool
	}{
		{name: "default directory, rolling update", dir: "/var/lib/kubelet/plugins/gpu.prism.dev", uid: uid},
		{name: "test-bed kubelet root without a UID", dir: "/tmp/prism-tb-4179390437/nodes/localhost/kubelet/plugins/gpu.prism.dev"},
		// The first helm e2e run failed here with "bind: invalid argument".
		{name: "test-bed kubelet root, rolling update", dir: "/tmp/prism-tb-4179390437/nodes/localhost/kubelet/plugins/gpu.prism.dev", uid: uid, wantErr: true},
		{name: "exactly at the limit", dir: "/" + strings.Repeat("d", maxSocketPath-len("/dra.sock")-1)},
		{name: "one byte over", dir: "/" + strings.Repeat("d", maxSocketPath-len("/dra.sock")), wantErr: true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			err := checkDRASocketPath(tc.dir, tc.uid)
			if (err != nil) != tc.wantErr {
				t.Fatalf("checkDRASocketPath(%q, %q) = %v, want error %v", tc.dir, tc.uid, err, tc.wantErr)
			}
			if err != nil && !strings.Contains(err.Error(), "kubeletPlugin.paths.kubeletPluginDir") {
				t.Errorf("error %q does not say which setting to change", err)
			}
		})
	}
}
