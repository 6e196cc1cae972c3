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

package webhook

import (
	"context"
	"fmt"
	"sync"
	"time"
)

// Synced is one part of what the webhooks read that an informer fills,
// such as every ResourceClaim: whole once the informer and its handlers
// have seen its initial list. prism-controller serves once the parts that
// every review reads are whole; a review that reads a part that is not
// waits for it (WaitSynced), so that it is answered as the whole part
// answers it, never from the part read so far.
type Synced struct {
	name    string
	done    chan struct{}
	once    sync.Once
	metrics *Metrics
}

// NewSynced returns a part named name (the label of
// prism_webhook_reviews_waited_total and the line of /readyz?verbose) that
// is not yet whole. metrics may be nil.
func NewSynced(name string, metrics *Metrics) *Synced {
	return &Synced{name: name, done: make(chan struct{}), metrics: metrics}
}

// Name is the part's name.
func (s *Synced) Name() string { return s.name }

// MarkSynced says the part is whole; once is enough, more are harmless.
func (s *Synced) MarkSynced() { s.once.Do(func() { close(s.done) }) }

// Done is closed once the part is whole.
func (s *Synced) Done() <-chan struct{} { return s.done }

// HasSynced says whether the part is whole. A nil part is: a webhook given
// none reads a view that is whole from the start.
func (s *Synced) HasSynced() bool {
	if s == nil {
		return true
	}
	select {
	case <-s.done:
		return true
	default:
		return false
	}
}

// Outcomes of a review that waited, the label values of
// prism_webhook_reviews_waited_total.
const (
	waitedSynced   = "synced"
	waitedDeadline = "deadline"
)

// maxAnswerMargin bounds what a waiting review leaves of its deadline to
// be answered in: the API server's clock started before the request left
// it, and an answer that reaches it after its timeout is not read.
const maxAnswerMargin = time.Second

// WaitSynced returns once every part is whole, or with an error once the
// review's deadline is close: a fifth of the time left, at most a second,
// before it, so that the review can still be answered. A review that
// waited is counted by how its wait ended.
func WaitSynced(ctx context.Context, parts ...*Synced) error {
	if deadline, ok := ctx.Deadline(); ok {
		var cancel context.CancelFunc
		ctx, cancel = context.WithDeadline(ctx, deadline.Add(-min(time.Until(deadline)/5, maxAnswerMargin)))
		defer cancel()
	}
	for _, s := range parts {
		if s.HasSynced() {
			continue
		}
		select {
		case <-s.done:
			s.count(waitedSynced)
		case <-ctx.Done():
			s.count(waitedDeadline)
			return fmt.Errorf("the controller had not read every object of its %s informer by the review's deadline", s.name)
		}
	}
	return nil
}

func (s *Synced) count(outcome string) {
	if s.metrics != nil {
		s.metrics.waited.WithLabelValues(s.name, outcome).Inc()
	}
}
