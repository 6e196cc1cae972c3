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

package main

import (
	"fmt"
	"net"
	"os"
	"path/filepath"
	"strconv"
)

// controlName is the daemon's socket in the pipe directory.
const controlName = "control"

// inDir calls f with a path to name in dir that fits a socket address
// whatever dir's length: through the directory's descriptor in
// /proc/self/fd, as sun_path holds 108 bytes.
func inDir(dir, name string, f func(path string) error) error {
	d, err := os.Open(dir)
	if err != nil {
		return err
	}
	defer d.Close()
	return f(filepath.Join("/proc/self/fd", strconv.Itoa(int(d.Fd())), name))
}

// listenControl makes the control socket in pipeDir, mode 0666 whatever
// the umask, and returns its listener and what it is on disk, to know
// later whether "control" is still the one it made.
func listenControl(pipeDir string) (*net.UnixListener, os.FileInfo, error) {
	if err := os.MkdirAll(pipeDir, 0o755); err != nil {
		return nil, nil, err
	}
	// Made under a name of its own and renamed into place once its mode
	// is right, so that no client finds a socket it may not connect to.
	tmp := fmt.Sprintf(".%s.%d", controlName, os.Getpid())
	var l *net.UnixListener
	err := inDir(pipeDir, tmp, func(path string) error {
		_ = os.Remove(path)
		var err error
		if l, err = net.ListenUnix("unix", &net.UnixAddr{Name: path, Net: "unix"}); err != nil {
			return err
		}
		// The daemon removes "control" itself, only if it is still its
		// own; closing must not remove a successor's.
		l.SetUnlinkOnClose(false)
		// The umask must not narrow it: clients of any UID connect.
		return os.Chmod(path, 0o666)
	})
	if err == nil {
		err = os.Rename(filepath.Join(pipeDir, tmp), filepath.Join(pipeDir, controlName))
	}
	if err != nil {
		if l != nil {
			l.Close()
		}
		_ = os.Remove(filepath.Join(pipeDir, tmp))
		return nil, nil, fmt.Errorf("make control socket: %w", err)
	}
	made, err := os.Lstat(filepath.Join(pipeDir, controlName))
	if err != nil {
		l.Close()
		return nil, nil, err
	}
	return l, made, nil
}

// removeControl removes pipeDir's "control" if it is still made.
func removeControl(pipeDir string, made os.FileInfo) {
	path := filepath.Join(pipeDir, controlName)
	if now, err := os.Lstat(path); err == nil && os.SameFile(made, now) {
		_ = os.Remove(path)
	}
}

// dialControl connects to the daemon listening in pipeDir.
func dialControl(pipeDir string) (*net.UnixConn, error) {
	var c *net.UnixConn
	err := inDir(pipeDir, controlName, func(path string) error {
		var err error
		c, err = net.DialUnix("unix", nil, &net.UnixAddr{Name: path, Net: "unix"})
		return err
	})
	if err != nil {
		return nil, fmt.Errorf("connect to %s: %w", filepath.Join(pipeDir, controlName), err)
	}
	return c, nil
}
