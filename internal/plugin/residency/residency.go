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

// Package residency returns start-up-only pages of the running executable
// to the kernel.
//
// A Go binary built on client-go touches a little of every API group at
// start-up (the clientset's scheme registers each group's types), and the
// kernel maps every touched page of the executable, and the pages around
// it, for good. Most of them are never used again, yet they make up most of
// a kubelet plugin's resident memory (docs/plugin-performance.md). Once the
// process is ready, Release asks the kernel to page out the executable's
// read-only mappings (madvise MADV_PAGEOUT, Linux 5.4 or later); what the
// process still uses is faulted back in on first use, the rest stays out.
// This is to the executable what debug.FreeOSMemory is to the heap.
package residency

import (
	"errors"
	"fmt"
	"os"
	"strconv"
	"strings"
)

// Result is what Release did.
type Result struct {
	// Mappings is how many mappings of the executable were paged out.
	Mappings int
	// Bytes is their total size, resident or not.
	Bytes uint64
}

// ErrUnsupported is returned where the kernel cannot page out a mapping
// on request.
var ErrUnsupported = errors.New("paging out on request is not supported here")

// Release pages out the read-only, file-backed mappings of the running
// executable. Writable mappings (data, bss) are left alone: their pages are
// private copies, and paging them out would mean swap.
func Release() (Result, error) {
	exe, err := os.Readlink("/proc/self/exe")
	if err != nil {
		return Result{}, err
	}
	maps, err := os.ReadFile("/proc/self/maps")
	if err != nil {
		return Result{}, err
	}
	var res Result
	for _, m := range executableMappings(string(maps), exe) {
		if err := pageOut(m.start, m.end-m.start); err != nil {
			return res, err
		}
		res.Mappings++
		res.Bytes += m.end - m.start
	}
	return res, nil
}

type mapping struct{ start, end uint64 }

// executableMappings parses /proc/self/maps for the read-only mappings of
// the file exe.
func executableMappings(maps, exe string) []mapping {
	var out []mapping
	for _, line := range strings.Split(maps, "\n") {
		// address perms offset dev inode path
		fields := strings.Fields(line)
		if len(fields) < 6 || strings.Join(fields[5:], " ") != exe || len(fields[1]) < 2 || fields[1][1] == 'w' {
			continue
		}
		lo, hi, ok := strings.Cut(fields[0], "-")
		if !ok {
			continue
		}
		start, err1 := strconv.ParseUint(lo, 16, 64)
		end, err2 := strconv.ParseUint(hi, 16, 64)
		if err1 != nil || err2 != nil || end <= start {
			continue
		}
		out = append(out, mapping{start, end})
	}
	return out
}

// Memory is a process's resident memory in bytes, as /proc/PID/status
// gives it.
type Memory struct {
	// Total is VmRSS; File (RssFile) and Anon (RssAnon) are its file-backed
	// and anonymous parts.
	Total, File, Anon uint64
}

// ReadMemory reads the resident memory of process pid; 0 is this process.
func ReadMemory(pid int) (Memory, error) {
	path := "/proc/self/status"
	if pid != 0 {
		path = "/proc/" + strconv.Itoa(pid) + "/status"
	}
	status, err := os.ReadFile(path)
	if err != nil {
		return Memory{}, err
	}
	var m Memory
	fields := map[string]*uint64{"VmRSS": &m.Total, "RssFile": &m.File, "RssAnon": &m.Anon}
	for _, line := range strings.Split(string(status), "\n") {
		key, value, ok := strings.Cut(line, ":")
		if field := fields[key]; ok && field != nil {
			kib, err := strconv.ParseUint(strings.TrimSuffix(strings.TrimSpace(value), " kB"), 10, 64)
			if err != nil {
				return Memory{}, fmt.Errorf("%s in %s: %w", key, path, err)
			}
			*field = kib << 10
			delete(fields, key)
		}
	}
	if len(fields) > 0 {
		return Memory{}, fmt.Errorf("%s has no %d of VmRSS, RssFile, RssAnon", path, len(fields))
	}
	return m, nil
}
