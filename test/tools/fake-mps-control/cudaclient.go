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
	"bytes"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"path/filepath"
	"strconv"
	"syscall"
	"time"

	"github.com/prismgpu/prism/internal/plugin/mps/mpstest"
)

// cudaClient is one run of the stand-in as a CUDA client.
type cudaClient struct {
	rec    *recorder
	stdout io.Writer
	uid    int
}

// runCUDAClient stands in for a CUDA program initialising under MPS: see
// the package doc.
func runCUDAClient(args []string, pipeDir string, rec *recorder, stdout, stderr io.Writer) int {
	flags := flag.NewFlagSet("--cuda-client", flag.ContinueOnError)
	flags.SetOutput(stderr)
	hold := flags.Duration("hold", 0, "How long to stay a client of the server once attached; SIGTERM ends it early.")
	alloc := flags.String("alloc", "", "Pinned device memory to allocate, such as 8G; none by default.")
	wait := flags.Duration("wait", 10*time.Second, "How long to wait for the server of another UID to exit.")
	if err := flags.Parse(args); err != nil {
		return 1
	}
	var allocBytes int64
	if *alloc != "" {
		var err error
		if allocBytes, err = parseBytes(*alloc); err != nil {
			fmt.Fprintf(stderr, "fake-mps-control: --alloc: %v\n", err)
			return 1
		}
	}
	c := &cudaClient{rec: rec, stdout: stdout, uid: os.Geteuid()}

	conn, err := dialControl(pipeDir)
	if err != nil {
		c.record("connect", mpstest.ClientResult{Error: err.Error()})
		return c.finish(mpstest.ClientResult{MPS: false}, 0)
	}
	defer conn.Close()
	c.record("connect", mpstest.ClientResult{})
	if _, err := fmt.Fprintf(conn, "%s %s\n", attachCommand, *wait); err != nil {
		return c.finish(mpstest.ClientResult{MPS: true, Error: err.Error()}, mpstest.ExitServerFailed)
	}
	replies := json.NewDecoder(conn)
	var rep attachReply
	err = replies.Decode(&rep)
	if err == nil && rep.Waiting {
		c.record("wait", mpstest.ClientResult{Waited: true})
		rep = attachReply{}
		err = replies.Decode(&rep)
	}
	switch {
	case err != nil:
		return c.finish(mpstest.ClientResult{MPS: true, Error: fmt.Sprintf("the MPS control daemon did not answer: %v", err)}, mpstest.ExitServerFailed)
	case rep.TimedOut:
		return c.finish(mpstest.ClientResult{MPS: true, Waited: true, Error: rep.Error}, mpstest.ExitWaitTimedOut)
	case rep.Error != "":
		return c.finish(mpstest.ClientResult{MPS: true, Waited: rep.Waited, Error: rep.Error}, mpstest.ExitServerFailed)
	}
	res := mpstest.ClientResult{MPS: true, ServerUID: &rep.UID, Server: strconv.Itoa(rep.Server), Waited: rep.Waited}
	if needsSharedMemory() {
		if err := sharesMemory(rep); err != nil {
			res.Error = err.Error()
			return c.finish(res, mpstest.ExitNoSharedMemory)
		}
	}
	res.ActiveThreadPercentage, res.PinnedMemLimitBytes = clientLimits(rep.Limits, os.Getenv)
	if limit := res.PinnedMemLimitBytes; limit > 0 && allocBytes > limit {
		res.Error = fmt.Sprintf("out of memory: %d bytes asked, the pinned device memory limit is %d", allocBytes, limit)
		return c.finish(res, mpstest.ExitOutOfMemory)
	}
	c.record("attach", res)

	// Before the result is out: a test that has read it may end the hold.
	term := make(chan os.Signal, 1)
	signal.Notify(term, syscall.SIGTERM, syscall.SIGINT)
	c.print(res)
	// The daemon sends nothing more; the end of the stream is the
	// server's.
	lost := make(chan struct{})
	go func() {
		_, _ = io.Copy(io.Discard, conn)
		close(lost)
	}()
	timer := time.NewTimer(*hold)
	defer timer.Stop()
	select {
	case <-timer.C:
	case <-term:
	case <-lost:
		fmt.Fprintf(stderr, "fake-mps-control: MPS server %d exited under the client\n", rep.Server)
		c.record("exit", mpstest.ClientResult{Error: "the MPS server exited"})
		return mpstest.ExitServerFailed
	}
	c.record("exit", mpstest.ClientResult{})
	return 0
}

// sharesMemory checks that the client sees the server's file in
// /dev/shm, as a CUDA client must map the server's shared memory.
func sharesMemory(rep attachReply) error {
	path := filepath.Join(shmDir(), rep.Shm)
	got, err := os.ReadFile(path)
	if err == nil && !bytes.Equal(got, []byte(rep.Token)) {
		err = errors.New("it holds another server's token")
	}
	if err != nil {
		return fmt.Errorf("cannot reach the shared memory of MPS server %d: %v (the client's /dev/shm must be the server's)", rep.Server, err)
	}
	return nil
}

// finish prints the client's result and records its exit with status.
func (c *cudaClient) finish(res mpstest.ClientResult, status int) int {
	c.print(res)
	c.record("exit", mpstest.ClientResult{Error: res.Error})
	return status
}

func (c *cudaClient) print(res mpstest.ClientResult) {
	line, _ := json.Marshal(res)
	fmt.Fprintf(c.stdout, "%s\n", line)
}

func (c *cudaClient) record(event string, res mpstest.ClientResult) {
	uid := c.uid
	c.rec.record(mpstest.Entry{
		Role: "client", Event: event, UID: &uid, Server: res.Server,
		ActiveThreadPercentage: res.ActiveThreadPercentage, PinnedMemLimitBytes: res.PinnedMemLimitBytes,
		Waited: res.Waited, Error: res.Error,
	})
}
