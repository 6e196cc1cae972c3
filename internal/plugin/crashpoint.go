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

// Crash points name the steps of prepare and unprepare between which a crash
// leaves a distinct state on disk. Fault-injection tests stop the process at
// each of them (see crashpoint_faultinject.go) and check what a restart makes
// of the state left behind.
const (
	CrashAfterPrepareStarted   = "prepare-started"
	CrashAfterCDIWritten       = "prepare-cdi-written"
	CrashAfterPrepareCompleted = "prepare-completed"
	CrashAfterCDIRemoved       = "unprepare-cdi-removed"
	CrashAfterUnprepared       = "unprepare-checkpoint-removed"
)

// CrashPoints lists every crash point in the order a claim's life reaches them.
var CrashPoints = []string{
	CrashAfterPrepareStarted, CrashAfterCDIWritten, CrashAfterPrepareCompleted,
	CrashAfterCDIRemoved, CrashAfterUnprepared,
}
