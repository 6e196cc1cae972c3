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

package version

import (
	"runtime/debug"
	"testing"
)

func TestFromBuildInfo(t *testing.T) {
	stamped := &debug.BuildInfo{
		GoVersion: "go1.26.0",
		Main:      debug.Module{Path: "github.com/prismgpu/prism", Version: "v0.3.0"},
		Settings: []debug.BuildSetting{
			{Key: "vcs.revision", Value: "f193e6e"},
			{Key: "vcs.time", Value: "2026-01-02T03:04:05Z"},
			{Key: "vcs.modified", Value: "true"},
		},
	}
	for _, tc := range []struct {
		name                         string
		bi                           *debug.BuildInfo
		version, revision, buildTime string
		want                         Info
	}{{
		name: "no build information",
		want: Info{Version: "unknown", Revision: "unknown", Time: "unknown", GoVersion: "unknown"},
	}, {
		name: "what the toolchain stamped",
		bi:   stamped,
		want: Info{Version: "v0.3.0", Revision: "f193e6e", Time: "2026-01-02T03:04:05Z", Modified: true, GoVersion: "go1.26.0"},
	}, {
		name:      "linker overrides win",
		bi:        stamped,
		version:   "v0.3.1",
		revision:  "abc1234",
		buildTime: "2026-02-03T00:00:00Z",
		want:      Info{Version: "v0.3.1", Revision: "abc1234", Time: "2026-02-03T00:00:00Z", Modified: true, GoVersion: "go1.26.0"},
	}, {
		name: "a build without VCS stamps",
		bi:   &debug.BuildInfo{GoVersion: "go1.26.0", Main: debug.Module{Version: "(devel)"}},
		want: Info{Version: "(devel)", Revision: "unknown", Time: "unknown", GoVersion: "go1.26.0"},
	}} {
		t.Run(tc.name, func(t *testing.T) {
			if got := fromBuildInfo(tc.bi, tc.version, tc.revision, tc.buildTime); got != tc.want {
				t.Errorf("fromBuildInfo() = %+v, want %+v", got, tc.want)
			}
		})
	}
}

func TestString(t *testing.T) {
	got := Info{Version: "v0.3.0", Revision: "f193e6e", Time: "2026-01-02T03:04:05Z", Modified: true, GoVersion: "go1.26.0"}.String()
	want := "version v0.3.0, revision f193e6e, built 2026-01-02T03:04:05Z, modified true, go1.26.0"
	if got != want {
		t.Errorf("String() = %q, want %q", got, want)
	}
}
