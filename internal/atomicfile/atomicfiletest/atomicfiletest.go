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

// Package atomicfiletest makes one step of an atomicfile write fail, for
// the tests of atomicfile and of the packages that write through it.
package atomicfiletest

import (
	"errors"
	"fmt"
	"os"
	"sync"

	"github.com/prismgpu/prism/internal/atomicfile"
)

// ErrInjected is what a step made to fail returns, wrapped with the step's
// name.
var ErrInjected = errors.New("injected failure")

// FS is atomicfile.OS, but for the step FailAt names, which fails with
// ErrInjected: "create", "write" (a short write, as on a full disk),
// "chmod", "sync", "close", "rename" or "syncdir". It is safe for
// concurrent use.
type FS struct {
	atomicfile.OS
	mu     sync.Mutex
	failAt string
}

// FailAt makes step fail from now on; "" makes none fail.
func (f *FS) FailAt(step string) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.failAt = step
}

func (f *FS) fail(step string) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.failAt == step {
		return fmt.Errorf("%s: %w", step, ErrInjected)
	}
	return nil
}

// CreateTemp implements atomicfile.FS.
func (f *FS) CreateTemp(dir, pattern string) (atomicfile.File, error) {
	if err := f.fail("create"); err != nil {
		return nil, err
	}
	real, err := f.OS.CreateTemp(dir, pattern)
	if err != nil {
		return nil, err
	}
	return f.File(real), nil
}

// Rename implements atomicfile.FS.
func (f *FS) Rename(oldpath, newpath string) error {
	if err := f.fail("rename"); err != nil {
		return err
	}
	return f.OS.Rename(oldpath, newpath)
}

// SyncDir implements atomicfile.FS.
func (f *FS) SyncDir(dir string) error {
	if err := f.fail("syncdir"); err != nil {
		return err
	}
	return f.OS.SyncDir(dir)
}

// File wraps a file opened elsewhere, such as one a caller appends to, so
// that its steps fail as FailAt says.
func (f *FS) File(real atomicfile.File) atomicfile.File {
	return &file{File: real, fs: f}
}

type file struct {
	atomicfile.File
	fs *FS
}

func (f *file) Write(p []byte) (int, error) {
	if err := f.fs.fail("write"); err != nil {
		n, _ := f.File.Write(p[:len(p)/2])
		return n, err
	}
	return f.File.Write(p)
}

func (f *file) Chmod(mode os.FileMode) error {
	if err := f.fs.fail("chmod"); err != nil {
		return err
	}
	return f.File.Chmod(mode)
}

func (f *file) Sync() error {
	if err := f.fs.fail("sync"); err != nil {
		return err
	}
	return f.File.Sync()
}

func (f *file) Close() error {
	if err := f.fs.fail("close"); err != nil {
		_ = f.File.Close()
		return err
	}
	return f.File.Close()
}
