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
	"testing"

	"github.com/prismgpu/prism/internal/envflag/envflagtest"
)

// The chart configures the plugin through env only, so a flag without a
// variable cannot be set from values, and a renamed variable silently
// stops configuring what it did.
func TestEveryFlagHasAnEnvMirror(t *testing.T) {
	envflagtest.Mirrors(t, newFlags, map[string]string{
		"node-name":             "NODE_NAME",
		"kubelet-registrar-dir": "KUBELET_REGISTRAR_DIRECTORY_PATH",
		"kubelet-plugin-dir":    "KUBELET_PLUGINS_DIRECTORY_PATH",
		"cdi-root":              "CDI_ROOT",
		"driver-root":           "NVIDIA_DRIVER_ROOT",
		"state-dir":             "PRISM_STATE_DIR",
		"http-address":          "PRISM_HTTP_ADDRESS",
		"probe-socket":          "PRISM_PROBE_SOCKET",
		"profiling":             "PRISM_PROFILING",
		"profile-retention":     "PRISM_PROFILE_RETENTION",
		"kube-api-qps":          "PRISM_KUBE_API_QPS",
		"kube-api-burst":        "PRISM_KUBE_API_BURST",
	})
}

func TestEnvironment(t *testing.T) {
	envflagtest.Run(t, newFlags, []envflagtest.Case[options]{{
		Name:  "flags that had no variable before",
		Env:   map[string]string{"PRISM_PROFILE_RETENTION": "5", "PRISM_KUBE_API_QPS": "7.5", "PRISM_KUBE_API_BURST": "9"},
		Check: func(o options) bool { return o.profileRetention == 5 && o.kubeAPIQPS == 7.5 && o.kubeAPIBurst == 9 },
	}, {
		Name:  "the command line wins over the environment",
		Args:  []string{"--node-name=gpu-2", "-v=4"},
		Env:   map[string]string{"NODE_NAME": "gpu-1", "PRISM_PROFILING": "false"},
		Check: func(o options) bool { return o.nodeName == "gpu-2" && !o.enableProfiling },
	}, {
		Name:    "a bool that does not parse",
		Env:     map[string]string{"PRISM_PROFILING": "off"},
		WantErr: `environment variable PRISM_PROFILING="off" is not a valid value for --profiling`,
	}, {
		Name:    "a duration that does not parse",
		Env:     map[string]string{"PRISM_STALE_CLAIM_GRACE": "2 minutes"},
		WantErr: `environment variable PRISM_STALE_CLAIM_GRACE="2 minutes"`,
	}, {
		Name:    "a verbosity that does not parse",
		Env:     map[string]string{"PRISM_VERBOSITY": "debug"},
		WantErr: `environment variable PRISM_VERBOSITY="debug" is not a valid value for --v`,
	}})
}
