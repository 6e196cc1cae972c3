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

package bench

import (
	"context"
	"testing"
	"time"
)

// A busy loop on this goroutine keeps at least part of one CPU busy, and
// the fraction cpuBusy reports is one.
func TestCPUBusySeesABusyLoop(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	go func() {
		for ctx.Err() == nil {
		}
	}()
	busy, err := cpuBusy(ctx, 300*time.Millisecond)
	if err != nil {
		t.Fatal(err)
	}
	if busy <= 0 || busy > 1 {
		t.Errorf("cpuBusy with a goroutine spinning = %v, want within (0, 1]", busy)
	}
}

// No machine is ever less than 0 % busy, so only the limit ends the wait,
// and it returns what the last second measured.
func TestWaitQuietStopsAtItsLimit(t *testing.T) {
	busy, err := waitQuiet(context.Background(), 0, 10*time.Millisecond)
	if err != nil {
		t.Fatal(err)
	}
	if busy < 0 || busy > 1 {
		t.Errorf("waitQuiet returned a busy fraction of %v, want within [0, 1]", busy)
	}
}
