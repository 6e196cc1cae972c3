//go:build faultinject

package plugin

import (
	"os"
	"syscall"
)

// crashPoint kills the process with SIGKILL, as a crash or an OOM kill would,
// when PRISM_CRASH_AT names this point. Only test binaries built with
// -tags faultinject contain it.
func crashPoint(name string) {
	if os.Getenv("PRISM_CRASH_AT") == name {
		_ = syscall.Kill(os.Getpid(), syscall.SIGKILL)
		select {}
	}
}
