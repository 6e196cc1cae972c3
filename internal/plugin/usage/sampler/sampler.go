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

// Package sampler samples the GPUs of prepared claims through NVML and
// publishes each claim's run into its WorkloadProfile's status.usage once
// the claim is released. It knows claims only as the plugin hands them in
// (Track, Release) and keeps its own records on disk, so that a restarted
// plugin goes on with the runs it left; package usage, which it feeds,
// stays a pure core of runs and merges.
//
// Run samples every interval and persists what changed, at most every
// 30 s; a released claim's run waits in a queue that merges it into the
// WorkloadProfile (through profiling.UpdateStatus), retrying API errors,
// without holding up the unprepare that released it.
//
// On a GPU the claim holds alone, its figures are the GPU's. On a shared
// GPU only the claim's own processes count, told by their pod's cgroup
// (attribute.go has the rules for processes that cannot be told).
package sampler

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"time"

	"github.com/NVIDIA/go-nvml/pkg/nvml"
	"github.com/prometheus/client_golang/prometheus"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/tools/record"
	"k8s.io/client-go/util/workqueue"
	"k8s.io/klog/v2"
	"k8s.io/utils/clock"

	gpuv1alpha1 "github.com/prismgpu/prism/api/gpu/v1alpha1"
	prismv1alpha1 "github.com/prismgpu/prism/api/prism/v1alpha1"
	"github.com/prismgpu/prism/internal/atomicfile"
	"github.com/prismgpu/prism/internal/plugin/profiling"
	"github.com/prismgpu/prism/internal/plugin/usage"
)

const (
	// DefaultInterval is how often prepared claims' GPUs are sampled.
	// NVML's utilisation is the share of the last sample period (1/6 s to
	// 1 s, by GPU) in which a kernel ran, so a sample is a snapshot, not a
	// mean since the last one: every 5 s gives a p95 from 60 samples in
	// five minutes, enough for the jobs worth sharing, at a cost of a few
	// NVML calls per GPU (docs/plugin-performance.md).
	DefaultInterval = 5 * time.Second
	// persistEvery bounds what a killed plugin loses of a run.
	persistEvery = 30 * time.Second
)

// Config turns on the usage profile: NVML is sampled for the GPUs of
// every prepared claim, and each run is merged into its WorkloadProfile's
// status.usage at unprepare.
type Config struct {
	// NVML is read for the figures; on a simulated node, the simulated
	// library.
	NVML nvml.Interface
	// Profiles is where runs are published; nil keeps them in the metrics
	// and logs only.
	Profiles profiling.WorkloadProfiles
	// ProcRoot is where the GPU processes' cgroups are read, to tell whose
	// process is whose on a shared GPU; "/proc" of the host's PID
	// namespace on a real node.
	ProcRoot string
	// Interval is how often to sample; zero is DefaultInterval.
	Interval time.Duration
}

// Env is what the plugin that runs the sampler lends it.
type Env struct {
	// Dir holds one record per claim.
	Dir      string
	NodeName string
	Recorder record.EventRecorder
	Clock    clock.WithTicker
	Metrics  *Metrics
	// Dropped counts the runs given up after maxPublishTries.
	Dropped prometheus.Counter
	// Prepared says whether a claim is still prepared: a tracked claim
	// that is not was released by a path other than Release (the
	// stale-claim sweep, start-up reconciliation, the other plugin of a
	// rolling update), and its run ends at the next cycle.
	Prepared func(uid string) bool
}

// Claim is what the sampler needs of a prepared claim.
type Claim struct {
	Ref prismv1alpha1.ClaimReference
	// Profile names the claim's WorkloadProfile; "" keeps its run out of
	// any.
	Profile string
	// Pods reserved the claim at prepare; on a shared GPU only their
	// processes count.
	Pods        []Pod
	ProductName string
	// Share is the share of a GPU the claim was given, to hold its run
	// against; nil for whole GPUs.
	Share *gpuv1alpha1.Share
	// Profiled says the workload runs under Nsight Compute, whose kernel
	// replays stretch its busy time.
	Profiled bool
	GPUs     []GPU
}

// GPU is one of a claim's GPUs.
type GPU struct {
	UUID string
	// Shared: others may use the GPU, so only the claim's processes count.
	Shared bool
	// MPS: an MPS daemon enforces the claim's share, so that the claim's
	// processes are clients of an MPS server.
	MPS bool
	// MPSPipeDir is the host path of the pipe directory of the share's own
	// MPS daemon, which the daemon's server has in its environment; "" for
	// a share of a daemon of the whole GPU, which serves all its MPS
	// shares, or of a daemon not recorded.
	MPSPipeDir string
}

// Pod is a pod that reserved a claim.
type Pod struct {
	Name string    `json:"name"`
	UID  types.UID `json:"uid"`
}

// runRecord is what the sampler keeps of a claim's run, in
// <dir>/<claim UID>.json: enough to publish it after a restart.
type runRecord struct {
	Claim       prismv1alpha1.ClaimReference `json:"claim"`
	Profile     string                       `json:"profile,omitempty"`
	Pods        []Pod                        `json:"pods,omitempty"`
	ProductName string                       `json:"productName,omitempty"`
	Share       *gpuv1alpha1.Share           `json:"share,omitempty"`
	Profiled    bool                         `json:"profiled,omitempty"`
	Run         usage.Run                    `json:"run"`
	// UpdatedAt is when the record was last written.
	UpdatedAt time.Time `json:"updatedAt"`
	// EndedAt is set once the claim was unprepared: the record waits to be
	// published.
	EndedAt *time.Time `json:"endedAt,omitempty"`
	// Signalled is set once a run that exceeded its share was counted and
	// its Events recorded, so that a retried publish does not repeat them.
	Signalled bool `json:"signalled,omitempty"`
}

// trackedClaim is a prepared claim being sampled.
type trackedClaim struct {
	rec   runRecord
	gpus  []GPU
	dirty bool
	// unattributed is set once a sample was dropped because a process on
	// a shared GPU could not be told to be the claim's or another's.
	unattributed bool
}

// Sampler holds the runs of prepared claims and the released runs' queue.
type Sampler struct {
	cfg      Config
	env      Env
	interval time.Duration

	mu      sync.Mutex
	claims  map[string]*trackedClaim
	ended   map[string]runRecord
	readers map[string]*deviceReader
	// lastPersist is when the dirty records were last written.
	lastPersist time.Time
	nvmlReady   bool

	queue workqueue.TypedRateLimitingInterface[string]
}

// New returns a sampler that tracks nothing yet; Load takes up the runs a
// stopped plugin left.
func New(cfg Config, env Env) *Sampler {
	interval := cfg.Interval
	if interval <= 0 {
		interval = DefaultInterval
	}
	if env.Clock == nil {
		env.Clock = clock.RealClock{}
	}
	return &Sampler{
		cfg: cfg, env: env, interval: interval,
		claims: map[string]*trackedClaim{}, ended: map[string]runRecord{}, readers: map[string]*deviceReader{},
		queue: workqueue.NewTypedRateLimitingQueueWithConfig(
			workqueue.NewTypedItemExponentialFailureRateLimiter[string](time.Second, 5*time.Minute),
			workqueue.TypedRateLimitingQueueConfig[string]{Name: "prism-usage-publish"}),
	}
}

// Track starts sampling the claims a prepare completed. It does no I/O on
// the prepare path: the records are written by the next persist, which it
// asks for at once, so that a restart knows the claims' profiles.
func (s *Sampler) Track(ctx context.Context, claims ...Claim) {
	now := s.env.Clock.Now()
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, c := range claims {
		r := runRecord{Claim: c.Ref, Profile: c.Profile, Pods: c.Pods, UpdatedAt: now}
		s.claims[string(c.Ref.UID)] = newTrackedClaim(r, c)
	}
	// Written on the next cycle rather than after 30 s.
	s.lastPersist = time.Time{}
	klog.FromContext(ctx).V(4).Info("Sampling the usage of prepared claims", "claims", len(claims))
}

// newTrackedClaim goes on with r's run on c's GPUs; what r lacks of the
// model and the share, c has.
func newTrackedClaim(r runRecord, c Claim) *trackedClaim {
	if r.ProductName == "" {
		r.ProductName = c.ProductName
	}
	if r.Share == nil {
		r.Share = c.Share
	}
	r.Profiled = r.Profiled || c.Profiled
	return &trackedClaim{rec: r, gpus: c.GPUs, dirty: true}
}

// Release ends the runs of released claims and queues their publishing;
// the caller does not wait for it.
func (s *Sampler) Release(ctx context.Context, uids ...string) {
	now := s.env.Clock.Now()
	s.mu.Lock()
	var ended []string
	for _, uid := range uids {
		t, ok := s.claims[uid]
		if !ok {
			continue
		}
		delete(s.claims, uid)
		s.env.Metrics.forget(t.rec.Claim)
		t.rec.EndedAt = &now
		s.ended[uid] = t.rec
		ended = append(ended, uid)
	}
	s.mu.Unlock()
	for _, uid := range ended {
		s.queue.Add(uid)
	}
	if len(ended) > 0 {
		klog.FromContext(ctx).V(4).Info("Queued the usage of unprepared claims for publishing", "claims", len(ended))
	}
}

// Load reads the records a stopped plugin left: a run of a claim still
// prepared goes on; one whose claim is gone (released while the record
// was not yet marked ended) is queued for publishing, as is one marked
// ended. Prepared claims without a record are sampled from now on.
func (s *Sampler) Load(ctx context.Context, prepared []Claim) {
	logger := klog.FromContext(ctx)
	entries, err := os.ReadDir(s.env.Dir)
	if err != nil && !errors.Is(err, fs.ErrNotExist) {
		logger.Error(err, "Reading the usage records a stopped plugin left; their runs are lost", "dir", s.env.Dir)
	}
	byUID := make(map[string]Claim, len(prepared))
	for _, c := range prepared {
		byUID[string(c.Ref.UID)] = c
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, e := range entries {
		uid, ok := strings.CutSuffix(e.Name(), ".json")
		if !ok || e.IsDir() {
			// Temporary files of a write that was cut short.
			_ = os.Remove(filepath.Join(s.env.Dir, e.Name()))
			continue
		}
		var r runRecord
		data, err := os.ReadFile(filepath.Join(s.env.Dir, e.Name()))
		if err == nil {
			err = json.Unmarshal(data, &r)
		}
		if err != nil || string(r.Claim.UID) != uid {
			logger.Error(err, "Dropping an unreadable usage record", "file", e.Name())
			_ = os.Remove(filepath.Join(s.env.Dir, e.Name()))
			continue
		}
		r.Profile = profiling.ValidProfile(logger, r.Claim, r.Profile)
		if c, ok := byUID[uid]; ok && r.EndedAt == nil {
			s.claims[uid] = newTrackedClaim(r, c)
			continue
		}
		if r.EndedAt == nil {
			r.EndedAt = ptrTime(r.UpdatedAt)
		}
		s.ended[uid] = r
		s.queue.Add(uid)
	}
	for _, c := range prepared {
		uid := string(c.Ref.UID)
		if _, ok := s.claims[uid]; ok {
			continue
		}
		if _, ok := s.ended[uid]; ok {
			continue
		}
		r := runRecord{Claim: c.Ref, Profile: profiling.ValidProfile(logger, c.Ref, c.Profile), UpdatedAt: s.env.Clock.Now()}
		logger.Info("Prepared claim has no usage record, as after an upgrade: sampling it from now on", "claim", klog.KRef(c.Ref.Namespace, c.Ref.Name), "profile", r.Profile)
		s.claims[uid] = newTrackedClaim(r, c)
	}
	if len(s.claims)+len(s.ended) > 0 {
		logger.Info("Recovered usage records", "sampling", len(s.claims), "toPublish", len(s.ended))
	}
}

func ptrTime(t time.Time) *time.Time { return &t }

// Run samples every interval and publishes released runs until ctx ends;
// the records stay on disk for the next start.
func (s *Sampler) Run(ctx context.Context) {
	go func() {
		<-ctx.Done()
		s.queue.ShutDown()
	}()
	go func() {
		for s.PublishNext(ctx) {
		}
	}()
	ticker := s.env.Clock.NewTicker(s.interval)
	defer ticker.Stop()
	defer s.shutdownNVML(ctx)
	for {
		select {
		case <-ctx.Done():
			s.persist(context.WithoutCancel(ctx), true)
			return
		case <-ticker.C():
			s.Sample(ctx)
			s.persist(ctx, false)
		}
	}
}

// Persist writes the records changed since the last write now; Run does
// so at most every 30 s.
func (s *Sampler) Persist(ctx context.Context) { s.persist(ctx, true) }

// persist writes the records changed since the last write, at most every
// persistEvery unless forced. Released runs are written by their
// publishing.
func (s *Sampler) persist(ctx context.Context, force bool) {
	now := s.env.Clock.Now()
	s.mu.Lock()
	if !force && now.Sub(s.lastPersist) < persistEvery {
		s.mu.Unlock()
		return
	}
	s.lastPersist = now
	var write []runRecord
	for _, t := range s.claims {
		if t.dirty {
			t.dirty = false
			t.rec.UpdatedAt = now
			write = append(write, t.rec)
		}
	}
	s.mu.Unlock()
	for _, r := range write {
		if err := s.write(r); err != nil {
			klog.FromContext(ctx).Error(err, "Writing a claim's usage record; a restart would lose its run since the last write", "claim", klog.KRef(r.Claim.Namespace, r.Claim.Name))
		}
	}
}

// write replaces the claim's record atomically: a crash leaves the old
// record or the new one, never half of one.
func (s *Sampler) write(r runRecord) error {
	if err := os.MkdirAll(s.env.Dir, 0o750); err != nil {
		return err
	}
	data, err := json.Marshal(r)
	if err != nil {
		return err
	}
	if err := atomicfile.WriteFile(filepath.Join(s.env.Dir, string(r.Claim.UID)+".json"), data, 0o600); err != nil {
		return fmt.Errorf("write usage record of claim %s: %w", r.Claim.UID, err)
	}
	return nil
}

func (s *Sampler) remove(uid string) error {
	err := os.Remove(filepath.Join(s.env.Dir, uid+".json"))
	if errors.Is(err, fs.ErrNotExist) {
		return nil
	}
	return err
}

// Samples says how many samples the run of each claim being sampled
// holds, by claim UID.
func (s *Sampler) Samples() map[string]int32 {
	s.mu.Lock()
	defer s.mu.Unlock()
	out := make(map[string]int32, len(s.claims))
	for uid, t := range s.claims {
		out[uid] = t.rec.Run.Samples()
	}
	return out
}
