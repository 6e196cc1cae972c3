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
