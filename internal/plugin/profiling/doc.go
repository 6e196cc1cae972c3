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

// Package profiling closes the loop from a claim's profiling request to a
// WorkloadProfile status, through CDI alone.
//
// At prepare the kubelet plugin calls Prepare: it creates a per-claim
// directory under <state-dir>/profiles, a tmpfs of bounded size where the
// plugin may mount (CheckQuota), writes the ncu argument file there
// and returns CDI container edits that mount ncu, the report directory and
// a small preload library (the shim, see ShimSource), listed in
// /etc/ld.so.preload, into the container. The shim re-executes the
// container's first process under ncu, once, and ncu writes its CSV into
// the report directory. At unprepare the plugin calls Detach under its
// lock, then, with the lock released, Collect, a Publisher, and Archive,
// which keeps the report's files and unmounts the tmpfs.
// The report directory is the tenant's: Collect reads it as untrusted.
//
// CDI edits cannot change a container's command line or its capabilities;
// CheckPermissions tells whether the driver lets ncu read the counters at
// all.
package profiling
