package residency

import (
	"errors"

	"golang.org/x/sys/unix"
)

func pageOut(start, length uint64) error {
	// The range is the process's own mapping, named by address: there is no
	// Go slice over it to hand to unix.Madvise.
	_, _, errno := unix.Syscall(unix.SYS_MADVISE, uintptr(start), uintptr(length), unix.MADV_PAGEOUT)
	switch {
	case errno == 0:
		return nil
	case errors.Is(errno, unix.EINVAL):
		// Kernels before 5.4 know no MADV_PAGEOUT.
		return ErrUnsupported
	}
	return errno
}
