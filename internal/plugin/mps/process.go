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

package mps

import (
	"bytes"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"

	"github.com/prismgpu/prism/internal/plugin/checkpoint"
)

// readEnviron reads a process's environment; a test plays a plugin that
// may not.
var readEnviron = os.ReadFile

// procStat reads a process's state letter and start time in clock ticks
// after boot from /proc/<pid>/stat.
func procStat(procRoot string, pid int) (state byte, startTicks uint64, err error) {
	raw, err := os.ReadFile(filepath.Join(procRoot, strconv.Itoa(pid), "stat"))
	if err != nil {
		return 0, 0, err
	}
	// The command name, field 2, is in parentheses and may hold spaces or
	// parentheses itself: the fields after it follow the last ")".
	i := bytes.LastIndexByte(raw, ')')
	if i < 0 {
		return 0, 0, fmt.Errorf("malformed %s/%d/stat", procRoot, pid)
	}
	fields := strings.Fields(string(raw[i+1:]))
	// fields[0] is field 3 (state); starttime is field 22.
	if len(fields) < 20 {
		return 0, 0, fmt.Errorf("malformed %s/%d/stat: %d fields", procRoot, pid, len(fields)+2)
	}
	startTicks, err = strconv.ParseUint(fields[19], 10, 64)
	if err != nil {
		return 0, 0, fmt.Errorf("malformed start time in %s/%d/stat: %w", procRoot, pid, err)
	}
	return fields[0][0], startTicks, nil
}

// running says whether the recorded daemon is still the process with its
// PID. It returns why not, for the log. A zombie has exited; a process
// started at another time is another process that reuses the PID; one that
// runs another program, or serves another pipe directory, is not this
// daemon. A daemon in a pod must also run in that pod's container, as its
// cgroup says; the plugin made the pod for the daemon's pipe directory, so
// where the daemon's environment is out of the plugin's reach (reading it
// takes every capability the daemon has, and an unprivileged plugin's
// daemons keep the two they need to start servers as other users), the
// container stands for it.
func running(procRoot, binary string, rec checkpoint.MPSDaemon) (bool, string) {
	if rec.PID <= 0 {
		return false, "its start was interrupted before its PID was recorded"
	}
	state, ticks, err := procStat(procRoot, rec.PID)
	switch {
	case errors.Is(err, os.ErrNotExist):
		return false, "no process has its PID"
	case err != nil:
		return false, err.Error()
	case state == 'Z' || state == 'X':
		return false, "it has exited"
	case ticks != rec.StartTicks:
		return false, "its PID belongs to a process started at another time"
	}
	dir := filepath.Join(procRoot, strconv.Itoa(rec.PID))
	cmdline, err := os.ReadFile(filepath.Join(dir, "cmdline"))
	if err != nil {
		return false, err.Error()
	}
	argv0, _, _ := bytes.Cut(cmdline, []byte{0})
	if filepath.Base(string(argv0)) != filepath.Base(binary) {
		return false, fmt.Sprintf("its PID runs %q", argv0)
	}
	if rec.Container != "" {
		if ok, why := inContainer(dir, rec.Container); !ok {
			return false, why
		}
	}
	environ, err := readEnviron(filepath.Join(dir, "environ"))
	if rec.Container != "" && errors.Is(err, os.ErrPermission) {
		// Its container is the one the plugin made for this pipe directory.
		return true, ""
	}
	if err != nil {
		return false, err.Error()
	}
	want := []byte(EnvPipeDirectory + "=" + rec.PipeDir)
	for _, kv := range bytes.Split(environ, []byte{0}) {
		if bytes.Equal(kv, want) {
			return true, ""
		}
	}
	return false, "its PID serves another pipe directory"
}

// inContainer says whether the process of procDir runs in the container
// with the ID id, as its cgroup path names it: .../<id> under the
// kubelet's cgroupfs driver, .../cri-containerd-<id>.scope under its
// systemd one, /k8s.io/<id> where the kubelet makes no pod cgroups.
func inContainer(procDir, id string) (bool, string) {
	data, err := os.ReadFile(filepath.Join(procDir, "cgroup"))
	if err != nil {
		return false, err.Error()
	}
	if strings.Contains(string(data), id) {
		return true, ""
	}
	return false, "its PID runs outside the daemon's container " + id
}

// findDaemon finds the PID and start time of the control daemon recorded
// as rec, but for its PID: a process that runs binary with -f, in rec's
// container. Control clients (no -f) are not it.
func findDaemon(procRoot, binary string, rec checkpoint.MPSDaemon) (int, uint64, error) {
	entries, err := os.ReadDir(procRoot)
	if err != nil {
		return 0, 0, err
	}
	var found []checkpoint.MPSDaemon
	for _, e := range entries {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		cmdline, err := os.ReadFile(filepath.Join(procRoot, e.Name(), "cmdline"))
		if err != nil {
			continue
		}
		argv := strings.Split(strings.TrimSuffix(string(cmdline), "\x00"), "\x00")
		if len(argv) != 2 || filepath.Base(argv[0]) != filepath.Base(binary) || argv[1] != "-f" {
			continue
		}
		cand := rec
		cand.PID = pid
		if _, cand.StartTicks, err = procStat(procRoot, pid); err != nil {
			continue
		}
		if alive, _ := running(procRoot, binary, cand); alive {
			found = append(found, cand)
		}
	}
	switch len(found) {
	case 0:
		return 0, 0, fmt.Errorf("no process in %s runs %s -f in pod %s", procRoot, filepath.Base(binary), rec.Pod)
	case 1:
		return found[0].PID, found[0].StartTicks, nil
	}
	pids := make([]int, len(found))
	for i, f := range found {
		pids[i] = f.PID
	}
	return 0, 0, fmt.Errorf("processes %v in %s all run %s -f in pod %s", pids, procRoot, filepath.Base(binary), rec.Pod)
}
