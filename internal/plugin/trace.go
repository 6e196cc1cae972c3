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

package plugin

import (
	"context"
	"fmt"
	"net/http"
	"strings"
	"sync"
	"time"

	"google.golang.org/grpc"
	"k8s.io/client-go/util/flowcontrol"
	"k8s.io/klog/v2"

	"github.com/prismgpu/prism/internal/plugin/checkpoint"
)

// TraceVerbosity is the log level at which every kubelet call logs where its
// time went ("Call timing"). Below it the stages cost one context lookup
// each: no clock reads, no allocation.
const TraceVerbosity = 4

// Stages of a kubelet call. The API stages are the kubelet plugin helper's
// claim GET, before the driver sees the claim: the wait in client-go's rate
// limiter, then the HTTP round trip.
const (
	StageRateLimiter   = "client-rate-limiter"
	StageAPIRoundTrip  = "api-roundtrip"
	StageHelperOther   = "helper-other"
	StageLockWait      = "driver-lock-wait"
	StagePlan          = "plan"
	StageCDIWrite      = "cdi-write"
	StageCDIRemove     = "cdi-remove"
	StageCkptEncode    = "checkpoint-" + checkpoint.StepEncode
	StageCkptAppend    = "checkpoint-" + checkpoint.StepAppend
	StageCkptFsync     = "checkpoint-" + checkpoint.StepFsync
	StageCkptCompact   = "checkpoint-" + checkpoint.StepCompact
	StageDriverOther   = "driver-other"
	stageDriverTotal   = "driver"
	traceTotalKey      = "totalMicros"
	traceStagesKey     = "stages"
	traceLogMessage    = "Call timing"
	traceStageSplitter = ","
)

// callTrace adds up the time one kubelet call spent in each stage. API calls
// of the same call may run on other goroutines, hence the lock.
type callTrace struct {
	mu     sync.Mutex
	order  []string
	micros map[string]int64
}

type traceKey struct{}

func traceFrom(ctx context.Context) *callTrace {
	t, _ := ctx.Value(traceKey{}).(*callTrace)
	return t
}

func (t *callTrace) add(stage string, d time.Duration) {
	if t == nil {
		return
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	if _, ok := t.micros[stage]; !ok {
		t.order = append(t.order, stage)
	}
	t.micros[stage] += d.Microseconds()
}

func (t *callTrace) get(stage string) time.Duration {
	t.mu.Lock()
	defer t.mu.Unlock()
	return time.Duration(t.micros[stage]) * time.Microsecond
}

// String lists the stages as name=micros, comma-separated, in first-seen order.
func (t *callTrace) String() string {
	t.mu.Lock()
	defer t.mu.Unlock()
	parts := make([]string, 0, len(t.order))
	for _, s := range t.order {
		parts = append(parts, fmt.Sprintf("%s=%d", s, t.micros[s]))
	}
	return strings.Join(parts, traceStageSplitter)
}

// span starts timing a stage of the call in ctx; the returned function ends
// it. Without a trace it reads no clock.
func span(ctx context.Context, stage string) func() {
	t := traceFrom(ctx)
	if t == nil {
		return func() {}
	}
	start := time.Now()
	return func() { t.add(stage, time.Since(start)) }
}

// observeCheckpoint records the steps the checkpoint store timed into the
// call in ctx.
func observeCheckpoint(ctx context.Context, step string, d time.Duration) {
	traceFrom(ctx).add("checkpoint-"+step, d)
}

// TraceInterceptor times each kubelet call and logs its stages at
// TraceVerbosity: what the helper did before and after the driver (the
// claim GET), and what the driver's own spans recorded.
func TraceInterceptor(logger klog.Logger) grpc.UnaryServerInterceptor {
	return func(ctx context.Context, req any, info *grpc.UnaryServerInfo, handler grpc.UnaryHandler) (any, error) {
		if !logger.V(TraceVerbosity).Enabled() {
			return handler(ctx, req)
		}
		t := &callTrace{micros: map[string]int64{}}
		start := time.Now()
		resp, err := handler(context.WithValue(ctx, traceKey{}, t), req)
		total := time.Since(start)
		driver := t.get(stageDriverTotal)
		if driver > 0 {
			helper := total - driver - t.get(StageRateLimiter) - t.get(StageAPIRoundTrip)
			t.add(StageHelperOther, max(helper, 0))
			accounted := time.Duration(0)
			for _, s := range []string{StageLockWait, StagePlan, StageCDIWrite, StageCDIRemove, StageCkptEncode, StageCkptAppend, StageCkptFsync, StageCkptCompact} {
				accounted += t.get(s)
			}
			t.add(StageDriverOther, max(driver-accounted, 0))
		}
		method := info.FullMethod[strings.LastIndex(info.FullMethod, "/")+1:]
		logger.V(TraceVerbosity).Info(traceLogMessage, "method", method, traceTotalKey, total.Microseconds(), traceStagesKey, t.String())
		return resp, err
	}
}

// TracedRateLimiter times client-go's rate limiter for the call in the
// request's context, so a claim GET that waited for a token says so.
func TracedRateLimiter(l flowcontrol.RateLimiter) flowcontrol.RateLimiter {
	return tracedLimiter{l}
}

type tracedLimiter struct{ flowcontrol.RateLimiter }

func (l tracedLimiter) Wait(ctx context.Context) error {
	defer span(ctx, StageRateLimiter)()
	return l.RateLimiter.Wait(ctx)
}

// TracedTransport times the HTTP round trips of the call in the request's
// context; wrap a rest.Config's transport with it.
func TracedTransport(rt http.RoundTripper) http.RoundTripper {
	return tracedTransport{rt}
}

type tracedTransport struct{ http.RoundTripper }

func (t tracedTransport) RoundTrip(req *http.Request) (*http.Response, error) {
	defer span(req.Context(), StageAPIRoundTrip)()
	return t.RoundTripper.RoundTrip(req)
}
