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
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"runtime"
	"slices"
	"strings"
	"syscall"

	"golang.org/x/sys/unix"
)

// NVIDIA documents that an MPS server and its clients exchange memory
// through /dev/shm, so a daemon gets the /dev/shm that its share's
// containers have. (The driver of an H200 with CUDA 13.0 did not need it:
// a client with a /dev/shm of its own connected; older drivers may.) The
// daemon cannot be given a mount namespace of its own by exec alone: the
// bind mount has to be made between the unshare and the exec. So the
// Manager starts the plugin's own program again under launcherName, which
// makes that namespace, mounts the share's directory on /dev/shm and execs
// the control binary, keeping its PID.
const (
	launcherName   = "prism-mps-launch"
	envLaunchShm   = "PRISM_MPS_LAUNCH_SHM"
	devShm         = "/dev/shm"
	launchFailCode = 125
)

// RunLauncher turns this process into an MPS control daemon when a Manager
// started it as one, and returns at once otherwise. A program that runs a
// Manager calls it first thing in main (its tests, in TestMain), before it
// starts any other goroutine of its own.
func RunLauncher() {
	if filepath.Base(os.Args[0]) != launcherName {
		return
	}
	err := launch(os.Args[1:], os.Getenv(envLaunchShm))
	fmt.Fprintf(os.Stderr, "%s: %v\n", launcherName, err)
	os.Exit(launchFailCode)
}

// launch execs argv with shm mounted on /dev/shm in a mount namespace of
// its own; it returns only on failure.
func launch(argv []string, shm string) error {
	if len(argv) == 0 || shm == "" {
		return errors.New("no program or no shared-memory directory to launch with")
	}
	// A namespace belongs to a thread; the exec happens on this one.
	runtime.LockOSThread()
	if err := enterShmNamespace(shm); err != nil {
		return err
	}
	env := slices.DeleteFunc(os.Environ(), func(kv string) bool { return strings.HasPrefix(kv, envLaunchShm+"=") })
	return syscall.Exec(argv[0], argv, env)
}

// enterShmNamespace moves the calling thread into a mount namespace of its
// own in which shm is mounted on /dev/shm. The namespace is a slave of the
// one it came from, so that what the plugin unmounts later (another
// share's directories) is unmounted in the daemon's too, and holds no
// memory there.
func enterShmNamespace(shm string) error {
	if err := unix.Unshare(unix.CLONE_NEWNS); err != nil {
		return fmt.Errorf("make a mount namespace: %w", err)
	}
	if err := unix.Mount("", "/", "", unix.MS_REC|unix.MS_SLAVE, ""); err != nil {
		return fmt.Errorf("make the mount namespace a slave: %w", err)
	}
	if err := os.MkdirAll(devShm, 0o1777); err != nil {
		return err
	}
	if err := unix.Mount(shm, devShm, "", unix.MS_BIND, ""); err != nil {
		return fmt.Errorf("mount %s on %s: %w", shm, devShm, err)
	}
	return nil
}

// checkNamespaces says why this process cannot give a daemon a /dev/shm of
// its own, nil when it can. It tries on a thread that it then lets die, so
// that no other goroutine runs in the namespace it made.
func checkNamespaces(root string) error {
	// The root first, so that it is not made 0700 with the probe: the
	// shares' clients, of any UID, reach their daemons' pipes under it.
	if err := os.MkdirAll(root, 0o755); err != nil {
		return err
	}
	probe := filepath.Join(root, probeDir)
	if err := os.Mkdir(probe, 0o700); err != nil && !os.IsExist(err) {
		return err
	}
	defer os.Remove(probe) //nolint:errcheck // an empty directory left behind is harmless
	done := make(chan error, 1)
	go func() {
		// No UnlockOSThread: the thread ends with the goroutine.
		runtime.LockOSThread()
		done <- enterShmNamespace(probe)
	}()
	if err := <-done; err != nil {
		return fmt.Errorf("the plugin cannot give an MPS daemon the /dev/shm of its share's containers: %w", err)
	}
	return nil
}
