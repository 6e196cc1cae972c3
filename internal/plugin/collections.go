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
	"sync"
	"time"

	"k8s.io/client-go/util/workqueue"
	"k8s.io/klog/v2"

	"github.com/prismgpu/prism/internal/plugin/profiling"
)

const (
	// collectionWorkers run report jobs side by side, so that one slow
	// report (each is bounded by its budget and timeout) does not hold up
	// every other claim's profile. Each holds a bounded summary, not the
	// report.
	collectionWorkers = 2
	// maxPublishTries bounds the tries of a job whose publish fails, for
	// example while the API server is down: with the queue's backoff from
	// one second, doubling up to five minutes, the last try comes about
	// nine minutes after the first. The report is then archived unpublished.
	maxPublishTries = 10
)

// collections runs the report jobs of profiled claims (collect, publish,
// archive) after their unprepare has returned. No prepare or unprepare
// waits on them: the report is the tenant's, publishing waits for the API
// server, and the kubelet plugin helper holds a file lock across each
// call during a rolling update. The jobs are on disk (profiling.Job), so
// those a stopped plugin did not finish are done after its next start.
type collections struct {
	queue workqueue.TypedRateLimitingInterface[string]
	mu    sync.Mutex
	// jobs are the queued jobs by directory, the queue's keys.
	jobs map[string]profiling.Job
}

func newCollections() *collections {
	return &collections{
		queue: workqueue.NewTypedRateLimitingQueueWithConfig(
			workqueue.NewTypedItemExponentialFailureRateLimiter[string](time.Second, 5*time.Minute),
			workqueue.TypedRateLimitingQueueConfig[string]{Name: "prism-profile-collections"}),
		jobs: map[string]profiling.Job{},
	}
}

func (c *collections) add(job profiling.Job) {
	c.mu.Lock()
	c.jobs[job.Dir] = job
	c.mu.Unlock()
	c.queue.Add(job.Dir)
}

func (c *collections) job(dir string) profiling.Job {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.jobs[dir]
}

func (c *collections) remove(dir string) int {
	c.mu.Lock()
	defer c.mu.Unlock()
	delete(c.jobs, dir)
	return len(c.jobs)
}

// pending is how many jobs are queued or running.
func (c *collections) pending() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return len(c.jobs)
}

// start queues the jobs a stopped plugin left and starts the
// workers, which stop with ctx; the jobs they did not finish stay on disk.
func (pr *profiler) start(ctx context.Context) {
	if pr.cfg == nil {
		return
	}
	logger := klog.FromContext(ctx)
	jobs, err := profiling.PendingJobs(pr.cfg.Options.StateDir)
	if err != nil {
		logger.Error(err, "Listing the profiled claims' reports a stopped plugin left uncollected")
	}
	for _, job := range jobs {
		pr.queue(ctx, job)
	}
	if len(jobs) > 0 {
		logger.Info("Collecting the reports a stopped plugin left", "reports", len(jobs))
	}
	for range collectionWorkers {
		go func() {
			for pr.runNext(ctx) {
			}
		}()
	}
	go func() {
		<-ctx.Done()
		pr.jobs.queue.ShutDown()
	}()
}

func (pr *profiler) queue(ctx context.Context, job profiling.Job) {
	job.Profile = profiling.ValidProfile(klog.FromContext(ctx), job.Claim, job.Profile)
	pr.jobs.add(job)
	pr.metrics.profileCollectionsPending.Set(float64(pr.jobs.pending()))
	klog.FromContext(ctx).V(2).Info("Queued the report of a profiled claim", "claim", job.Claim.Namespace+"/"+job.Claim.Name, "dir", job.Dir)
}

// runNext runs the next job, and returns false once the queue is shut
// down.
func (pr *profiler) runNext(ctx context.Context) bool {
	q := pr.jobs.queue
	dir, shutdown := q.Get()
	if shutdown {
		return false
	}
	defer q.Done(dir)
	job := pr.jobs.job(dir)
	logger := klog.FromContext(ctx).WithValues("claim", job.Claim.Namespace+"/"+job.Claim.Name, "profile", job.Profile)
	ctx = klog.NewContext(ctx, logger)

	collectErr, publishErr := pr.collect(ctx, job)
	if ctx.Err() != nil {
		// Stopping: the job stays on disk for the next start.
		return false
	}
	if publishErr != nil {
		if tries := q.NumRequeues(dir) + 1; tries < maxPublishTries {
			logger.Info("Publishing the WorkloadProfile failed; retrying", "try", tries, "err", publishErr)
			q.AddRateLimited(dir)
			return true
		}
		pr.metrics.claimErrors.WithLabelValues("unprepare", "profile-publish").Inc()
		logger.Error(publishErr, "Publishing the WorkloadProfile failed; keeping only the raw report", "tries", maxPublishTries)
	}
	pr.metrics.profilingRuns.WithLabelValues(profilingOutcome(collectErr)).Inc()
	if err := profiling.Archive(ctx, pr.cfg.Options.StateDir, dir, pr.cfg.Retention); err != nil {
		logger.Error(err, "Archiving the raw report")
	}
	q.Forget(dir)
	pr.metrics.profileCollectionsPending.Set(float64(pr.jobs.remove(dir)))
	return true
}
