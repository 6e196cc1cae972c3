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
