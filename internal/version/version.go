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

// Package version reports what a binary was built from.
package version

import (
	"fmt"
	"runtime/debug"
	"strconv"
)

// Set with -ldflags "-X github.com/prismgpu/prism/internal/version.<name>=...",
// for builds without VCS stamps (a container build from a source archive,
// or go build -buildvcs=false) that should still say what they are.
var (
	version   string
	revision  string
	buildTime string
)

// Info is a binary's build information.
type Info struct {
	Version   string
	Revision  string
	Time      string
	Modified  bool
	GoVersion string
}

// Get returns the running binary's build information.
func Get() Info {
	bi, _ := debug.ReadBuildInfo()
	return fromBuildInfo(bi, version, revision, buildTime)
}

// fromBuildInfo takes what the Go toolchain stamped into the binary and
// lets non-empty linker overrides win over it.
func fromBuildInfo(bi *debug.BuildInfo, version, revision, buildTime string) Info {
	info := Info{Version: "unknown", Revision: "unknown", Time: "unknown", GoVersion: "unknown"}
	if bi != nil {
		info.GoVersion = bi.GoVersion
		if bi.Main.Version != "" {
			info.Version = bi.Main.Version
		}
		for _, s := range bi.Settings {
			switch s.Key {
			case "vcs.revision":
				info.Revision = s.Value
			case "vcs.time":
				info.Time = s.Value
			case "vcs.modified":
				info.Modified, _ = strconv.ParseBool(s.Value)
			}
		}
	}
	if version != "" {
		info.Version = version
	}
	if revision != "" {
		info.Revision = revision
	}
	if buildTime != "" {
		info.Time = buildTime
	}
	return info
}

// String is the one line that --version prints.
func (i Info) String() string {
	return fmt.Sprintf("version %s, revision %s, built %s, modified %t, %s", i.Version, i.Revision, i.Time, i.Modified, i.GoVersion)
}

// KeysAndValues are the fields for a structured log line.
func (i Info) KeysAndValues() []any {
	return []any{"version", i.Version, "revision", i.Revision, "buildTime", i.Time, "modified", i.Modified, "goVersion", i.GoVersion}
}
