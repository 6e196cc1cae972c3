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

// Package checkpoint is the kubelet plugin's crash-safe record of prepared
// claims. After a plugin-only restart the kubelet does not repeat
// NodePrepareResources, so this file is the only way to know what must later
// be undone.
//
// # File format
//
// One JSON file, rewritten atomically on every change:
//
//	{"version":"v2","checksum":"sha256:<hex>","data":{"bootID":"...","claims":{"<uid>":{...}}}}
//
// The checksum is the SHA-256 of the compact JSON encoding of "data". The
// data object is hashed after compaction so that a file which was only
// re-indented by hand still loads.
//
// The earlier format, v1, written by the first plugin release, is read and
// migrated:
//
//	{"version":"v1","checksum":"<hex>","preparedClaims":{"<uid>":{"namespace":"..","name":"..",
//	  "devices":[{"pool":"..","device":"gpu-0","cdiDeviceIDs":["..."]}]}}}
//
// where checksum is the hex SHA-256 of the compact JSON of "preparedClaims".
// v1 recorded a claim only after its prepare had finished and had no boot
// ID, so migrated claims are PrepareCompleted with an unknown boot.
//
// # Damaged files
//
// A file that does not parse, is truncated, fails its checksum, has an
// unknown version or holds data the recovery logic cannot act on is renamed
// to "<name>.corrupt-<UTC timestamp>" and reported in Recovered; the store
// then starts empty. Refusing to start would only put the plugin into
// CrashLoopBackOff without making the file readable; the caller is expected
// to log and emit a Node Event, and to reconcile from what is on the node
// (CDI specs, the API server's claims).
//
// # Reboots
//
// Each write records the node's boot ID. A completed prepare is only
// trusted within the boot that completed it: device settings, MPS/time
// slicing state and transient CDI specs under /var/run do not survive a
// reboot. When Open sees a different boot ID it downgrades every
// PrepareCompleted claim to PrepareStarted and lists them in
// Recovered.Invalidated. They keep all the information needed to undo them;
// the kubelet prepares still-used claims again after the reboot, which
// brings them back to PrepareCompleted, and unprepares the rest. When either
// boot ID is unknown (unreadable boot_id file, migrated v1 data) nothing is
// downgraded, because that would wrongly invalidate running pods after a
// mere plugin restart.
package checkpoint
