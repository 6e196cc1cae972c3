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
// One JSON file: a snapshot, followed by the changes made since, one JSON
// value each (written one a line):
//
//	{"version":"v2","checksum":"sha256:<hex>","data":{"bootID":"...","claims":{"<uid>":{...}}}}
//	{"checksum":"sha256:<hex>","change":{"seq":1,"claims":{"<uid>":{...}}}}
//	{"checksum":"sha256:<hex>","change":{"seq":2,"claims":{"<uid>":null}}}
//
// Each checksum is the SHA-256 of the compact JSON encoding of "data" or
// "change", hashed after compaction so that a file which was only
// re-indented by hand still loads. A change sets the claims it names, null
// removing one; seq counts the changes after the snapshot from 1.
//
// A change to some claims (PutClaims, DeleteClaims) is appended, and
// fsynced when asked, so that a prepare costs one small write and one
// fsync however many claims the node holds. Everything else (Update), the
// first change after Open or Reload, the change after a failed write and
// the change that finds the appended part larger than both the snapshot
// and 256 KiB rewrite the file whole: a temporary file, fsynced, renamed
// over the old one, and the directory fsynced. A crash thus leaves the old
// file, the new one, or the old one with a change appended or not. A last
// change cut short by a power loss was never acknowledged (its fsync did not
// return): Open drops it, reports it in Recovered.TornEntryBytes and
// rewrites the file without it.
//
// Releases before the journal wrote only the snapshot line; they move a
// file with changes appended aside as malformed, like any damaged file.
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
// A file that does not parse, is truncated, fails a checksum, misses or
// repeats a change, has an unknown version or holds data the recovery
// logic cannot act on is renamed
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
