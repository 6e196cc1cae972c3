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

package main

import (
	"bytes"
	"strings"
	"testing"

	"k8s.io/klog/v2"
)

// The help once listed component-base's logging options, written for
// servers: --log-json-split-stream, --log-text-info-buffer-size and so on.
func TestHelpListsNoServerLoggingFlags(t *testing.T) {
	for _, args := range [][]string{{"--help"}, {"get", "gpus", "--help"}, {"explain", "claim", "--help"}} {
		t.Run(strings.Join(args, " "), func(t *testing.T) {
			root := newRootCommand()
			var out bytes.Buffer
			root.SetOut(&out)
			root.SetErr(&out)
			root.SetArgs(args)
			if err := root.Execute(); err != nil {
				t.Fatal(err)
			}
			var listed []string
			for _, flag := range []string{"--log-", "--logging-format", "--vmodule", "--feature-gates"} {
				if strings.Contains(out.String(), flag) {
					listed = append(listed, flag)
				}
			}
			if len(listed) > 0 {
				t.Errorf("help lists %s:\n%s", strings.Join(listed, ", "), out.String())
			}
			if !strings.Contains(out.String(), "-v, --v") {
				t.Errorf("help lacks -v:\n%s", out.String())
			}
		})
	}
}

func TestVerbosityFlagSetsKlog(t *testing.T) {
	root := newRootCommand()
	t.Cleanup(func() {
		if err := root.PersistentFlags().Set("v", "0"); err != nil {
			t.Error(err)
		}
	})
	root.SetOut(&bytes.Buffer{})
	root.SetArgs([]string{"-v=6", "get"})
	if err := root.Execute(); err != nil {
		t.Fatal(err)
	}
	if !klog.V(6).Enabled() {
		t.Error("-v=6 did not turn klog's verbosity up to 6")
	}
}
