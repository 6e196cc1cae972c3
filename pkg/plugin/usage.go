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
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/NVIDIA/go-nvml/pkg/nvml"
	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/util/workqueue"
	"k8s.io/klog/v2"

	prismv1alpha1 "github.com/prismgpu/prism/api/prism/v1alpha1"
	"github.com/prismgpu/prism/pkg/atomicfile"
	"github.com/prismgpu/prism/pkg/checkpoint"
	"github.com/prismgpu/prism/pkg/profiling"
	"github.com/prismgpu/prism/pkg/usage"
)

const (
	// DefaultUsageInterval is how often prepared claims' GPUs are sampled.
	// NVML's utilisation is the share of the last sample period (1/6 s to
	// 1 s, by GPU) in which a kernel ran, so a sample is a snapshot, not a
	// mean since the last one: every 5 s gives a p95 from 60 samples in
	// five minutes, enough for the jobs worth sharing, at a cost of a few
	// NVML calls per GPU (docs/plugin-performance.md).
	DefaultUsageInterval = 5 * time.Second
	// usagePersistEvery bounds what a killed plugin loses of a run.
	usagePersistEvery = 30 * time.Second
	// usageDir, under the state directory, holds one record per claim.
	usageDir = "usage"
)

// UsageConfig turns on the usage profile: NVML is sampled for the GPUs of
// every prepared claim, and each run is merged into its WorkloadProfile's
// status.usage at unprepare.
type UsageConfig struct {
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
	// Interval is how often to sample; zero is DefaultUsageInterval.
	Interval time.Duration
}

// usageRecord is what the plugin keeps of a claim's run, in
// <state-dir>/usage/<claim UID>.json: enough to publish it after a restart.
type usageRecord struct {
	Claim   prismv1alpha1.ClaimReference `json:"claim"`
	Profile string                       `json:"profile,omitempty"`
	// Pods reserved the claim at prepare; on a shared GPU only their
	// processes count.
	Pods        []podRef     `json:"pods,omitempty"`
	ProductName string       `json:"productName,omitempty"`
	Share       *usage.Share `json:"share,omitempty"`
	Run         usage.Run    `json:"run"`
	// UpdatedAt is when the record was last written.
	UpdatedAt time.Time `json:"updatedAt"`
	// EndedAt is set once the claim was unprepared: the record waits to be
	// published.
	EndedAt *time.Time `json:"endedAt,omitempty"`
	// Signalled is set once a run that exceeded its share was counted and
	// its Events recorded, so that a retried publish does not repeat them.
	Signalled bool `json:"signalled,omitempty"`
}

type podRef struct {
	Name string    `json:"name"`
	UID  types.UID `json:"uid"`
}

// trackedClaim is a prepared claim being sampled.
type trackedClaim struct {
	rec     usageRecord
	devices []trackedDevice
	dirty   bool
	// unattributed is set once a sample was dropped because a process on
	// a shared GPU could not be told to be the claim's or another's.
	unattributed bool
}

type trackedDevice struct {
	uuid string
	// shared: others may use the GPU, so only the claim's processes count.
	shared bool
}

// usageSampler holds the runs of prepared claims and the published runs'
// queue.
type usageSampler struct {
	cfg      UsageConfig
	interval time.Duration
	dir      string

	mu      sync.Mutex
	claims  map[string]*trackedClaim
	ended   map[string]usageRecord
	readers map[string]*deviceReader
	// lastPersist is when the dirty records were last written.
	lastPersist time.Time
	nvmlReady   bool

	queue workqueue.TypedRateLimitingInterface[string]
}

func newUsageSampler(cfg UsageConfig, stateDir string) *usageSampler {
	interval := cfg.Interval
	if interval <= 0 {
		interval = DefaultUsageInterval
	}
	return &usageSampler{
		cfg: cfg, interval: interval, dir: filepath.Join(stateDir, usageDir),
		claims: map[string]*trackedClaim{}, ended: map[string]usageRecord{}, readers: map[string]*deviceReader{},
		queue: workqueue.NewTypedRateLimitingQueueWithConfig(
			workqueue.NewTypedItemExponentialFailureRateLimiter[string](time.Second, 5*time.Minute),
			workqueue.TypedRateLimitingQueueConfig[string]{Name: "prism-usage-publish"}),
	}
}

// trackUsage starts sampling the claims a prepare completed. It does no I/O
// on the prepare path: the records are written by the next persist, which
// it asks for at once, so that a restart knows the claim's profile.
func (d *Driver) trackUsage(ctx context.Context, claims []*resourceapi.ResourceClaim, done []checkpoint.Claim) {
	u := d.usage
	if u == nil {
		return
	}
	now := d.clock.Now()
	u.mu.Lock()
	defer u.mu.Unlock()
	for _, rec := range done {
		i := slices.IndexFunc(claims, func(c *resourceapi.ResourceClaim) bool { return string(c.UID) == rec.UID })
		if i < 0 {
			continue
		}
		claim := claims[i]
		r := usageRecord{
			Claim:     prismv1alpha1.ClaimReference{Namespace: claim.Namespace, Name: claim.Name, UID: claim.UID},
			UpdatedAt: now,
		}
		// An invalid annotation names none; plan logged why.
		r.Profile, _ = prismv1alpha1.ProfileName(claim.Annotations)
		for _, ref := range claim.Status.ReservedFor {
			if ref.Resource == "pods" && ref.APIGroup == "" {
				r.Pods = append(r.Pods, podRef{Name: ref.Name, UID: ref.UID})
			}
		}
		u.claims[rec.UID] = d.newTrackedClaim(r, rec)
	}
	// Written on the next cycle rather than after 30 s.
	u.lastPersist = time.Time{}
	klog.FromContext(ctx).V(4).Info("Sampling the usage of prepared claims", "claims", len(done))
}

// newTrackedClaim completes a record with what the checkpoint says of the
// claim's GPUs: which are shared, the share and the model.
func (d *Driver) newTrackedClaim(r usageRecord, rec checkpoint.Claim) *trackedClaim {
	t := &trackedClaim{rec: r, dirty: true}
	for _, dev := range rec.Devices {
		g, ok := d.device(dev.Name)
		if !ok {
			continue
		}
		if r.ProductName == "" {
			t.rec.ProductName = g.ProductName
		}
		// A share of the whole GPU (what a claim naming no amount gets
		// where GPUs are published shareable) has the GPU alone: its
		// figures are the claim's, and it is no share to outgrow.
		partial, _ := d.sharedDevice([]checkpoint.Device{dev})
		t.devices = append(t.devices, trackedDevice{uuid: g.UUID, shared: partial != ""})
		if partial != "" && dev.ShareID != "" && t.rec.Share == nil && dev.Sharing != nil {
			t.rec.Share = &usage.Share{ComputePercent: dev.Sharing.ComputePercent, MemoryBytes: dev.Sharing.MemoryShareBytes}
		}
	}
	return t
}

// releaseUsage ends the runs of unprepared claims and queues their
// publishing; the unprepare does not wait for it.
func (d *Driver) releaseUsage(ctx context.Context, uids []string) {
	u := d.usage
	if u == nil {
		return
	}
	now := d.clock.Now()
	u.mu.Lock()
	var ended []string
	for _, uid := range uids {
		t, ok := u.claims[uid]
		if !ok {
			continue
		}
		delete(u.claims, uid)
		d.metrics.usage.forget(t.rec.Claim)
		t.rec.EndedAt = &now
		u.ended[uid] = t.rec
		ended = append(ended, uid)
	}
	u.mu.Unlock()
	for _, uid := range ended {
		u.queue.Add(uid)
	}
	if len(ended) > 0 {
		klog.FromContext(ctx).V(4).Info("Queued the usage of unprepared claims for publishing", "claims", len(ended))
	}
}

// loadUsage reads the records a stopped plugin left: a run of a claim
// still prepared goes on; one whose claim is gone (unprepared while the
// record was not yet marked ended) is queued for publishing, as is one
// marked ended. Prepared claims without a record are sampled from now on.
func (d *Driver) loadUsage(ctx context.Context) {
	u := d.usage
	logger := klog.FromContext(ctx)
	entries, err := os.ReadDir(u.dir)
	if err != nil && !errors.Is(err, fs.ErrNotExist) {
		logger.Error(err, "Reading the usage records a stopped plugin left; their runs are lost", "dir", u.dir)
	}
	u.mu.Lock()
	defer u.mu.Unlock()
	for _, e := range entries {
		uid, ok := strings.CutSuffix(e.Name(), ".json")
		if !ok || e.IsDir() {
			// Temporary files of a write that was cut short.
			_ = os.Remove(filepath.Join(u.dir, e.Name()))
			continue
		}
		var r usageRecord
		data, err := os.ReadFile(filepath.Join(u.dir, e.Name()))
		if err == nil {
			err = json.Unmarshal(data, &r)
		}
		if err != nil || string(r.Claim.UID) != uid {
			logger.Error(err, "Dropping an unreadable usage record", "file", e.Name())
			_ = os.Remove(filepath.Join(u.dir, e.Name()))
			continue
		}
		r.Profile = validProfile(logger, r.Claim, r.Profile)
		if rec, prepared := d.checkpoint.Get(uid); prepared && r.EndedAt == nil && rec.State == checkpoint.PrepareCompleted {
			u.claims[uid] = d.newTrackedClaim(r, rec)
			continue
		}
		if r.EndedAt == nil {
			r.EndedAt = ptrTime(r.UpdatedAt)
		}
		u.ended[uid] = r
		u.queue.Add(uid)
	}
	d.checkpoint.Range(func(c *checkpoint.Claim) bool {
		if _, ok := u.claims[c.UID]; ok || c.State != checkpoint.PrepareCompleted {
			return true
		}
		if _, ok := u.ended[c.UID]; ok {
			return true
		}
		r := usageRecord{Claim: prismv1alpha1.ClaimReference{Namespace: c.Namespace, Name: c.Name, UID: types.UID(c.UID)}, UpdatedAt: d.clock.Now()}
		if c.Profiling != nil {
			r.Profile = validProfile(logger, r.Claim, c.Profiling.Profile)
		}
		logger.Info("Prepared claim has no usage record, as after an upgrade: sampling it from now on", "claim", klog.KRef(c.Namespace, c.Name), "profile", r.Profile)
		u.claims[c.UID] = d.newTrackedClaim(r, *c)
		return true
	})
	if len(u.claims)+len(u.ended) > 0 {
		logger.Info("Recovered usage records", "sampling", len(u.claims), "toPublish", len(u.ended))
	}
}

func ptrTime(t time.Time) *time.Time { return &t }

// validProfile checks a profile name read back from disk (a usage record,
// the checkpoint, a report job), which a plugin that did not yet check the
// annotation at prepare may have written: an invalid one names none, and
// is logged only as the error quotes it.
func validProfile(logger klog.Logger, claim prismv1alpha1.ClaimReference, name string) string {
	valid, err := prismv1alpha1.ParseProfileName(name)
	if err != nil {
		logger.Info("Recorded profile of a claim is invalid: nothing of the claim is written to a WorkloadProfile", "claim", klog.KRef(claim.Namespace, claim.Name), "err", err)
	}
	return valid
}

// persistUsage writes the records changed since the last write, at most
// every usagePersistEvery unless forced, and the records of claims that
// ended and wait to be published.
func (d *Driver) persistUsage(ctx context.Context, force bool) {
	u := d.usage
	now := d.clock.Now()
	u.mu.Lock()
	if !force && now.Sub(u.lastPersist) < usagePersistEvery {
		u.mu.Unlock()
		return
	}
	u.lastPersist = now
	var write []usageRecord
	for _, t := range u.claims {
		if t.dirty {
			t.dirty = false
			t.rec.UpdatedAt = now
			write = append(write, t.rec)
		}
	}
	u.mu.Unlock()
	for _, r := range write {
		if err := u.write(r); err != nil {
			klog.FromContext(ctx).Error(err, "Writing a claim's usage record; a restart would lose its run since the last write", "claim", klog.KRef(r.Claim.Namespace, r.Claim.Name))
		}
	}
}

// write replaces the claim's record atomically: a crash leaves the old
// record or the new one, never half of one.
func (u *usageSampler) write(r usageRecord) error {
	if err := os.MkdirAll(u.dir, 0o750); err != nil {
		return err
	}
	data, err := json.Marshal(r)
	if err != nil {
		return err
	}
	if err := atomicfile.WriteFile(filepath.Join(u.dir, string(r.Claim.UID)+".json"), data, 0o600); err != nil {
		return fmt.Errorf("write usage record of claim %s: %w", r.Claim.UID, err)
	}
	return nil
}

func (u *usageSampler) remove(uid string) error {
	err := os.Remove(filepath.Join(u.dir, uid+".json"))
	if errors.Is(err, fs.ErrNotExist) {
		return nil
	}
	return err
}

// startUsage samples every interval and publishes ended runs, until ctx
// ends; the records stay on disk for the next start.
func (d *Driver) startUsage(ctx context.Context) {
	if d.usage == nil {
		return
	}
	d.startUsagePublishing(ctx)
	go func() {
		ticker := d.clock.NewTicker(d.usage.interval)
		defer ticker.Stop()
		defer d.usage.shutdownNVML(ctx)
		for {
			select {
			case <-ctx.Done():
				d.persistUsage(context.WithoutCancel(ctx), true)
				return
			case <-ticker.C():
				d.sampleUsage(ctx)
				d.persistUsage(ctx, false)
			}
		}
	}()
}
