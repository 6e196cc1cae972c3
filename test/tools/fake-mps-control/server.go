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
	"crypto/rand"
	"fmt"
	"io"
	"os"
	"os/signal"
	"path/filepath"
	"syscall"
)

// runServer is a server, the daemon's child, run as the server's UID. It
// makes its file in /dev/shm with a fresh token, prints the token for the
// daemon, and removes the file when the daemon closes its standard input
// (it stops the server, or is gone) or sends SIGTERM.
func runServer(stdin io.Reader, stdout, stderr io.Writer) int {
	token := rand.Text()
	shm := filepath.Join(shmDir(), shmName(os.Getpid()))
	// Its user's alone, as the real server's shared memory is.
	if err := os.WriteFile(shm, []byte(token), 0o600); err != nil {
		fmt.Fprintf(stderr, "nvidia-cuda-mps-server: %v\n", err)
		return 1
	}
	defer os.Remove(shm)
	term := make(chan os.Signal, 1)
	signal.Notify(term, syscall.SIGTERM, syscall.SIGINT)
	if _, err := fmt.Fprintln(stdout, token); err != nil {
		return 1
	}
	closed := make(chan struct{})
	go func() {
		_, _ = io.Copy(io.Discard, stdin)
		close(closed)
	}()
	select {
	case <-term:
	case <-closed:
	}
	return 0
}
