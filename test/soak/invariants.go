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

package soak

import (
	"context"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"sort"
	"strings"
	"time"

	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/sets"
	"sigs.k8s.io/controller-runtime/pkg/client"

	gpuv1alpha1 "github.com/prismgpu/prism/api/gpu/v1alpha1"
	prismv1alpha1 "github.com/prismgpu/prism/api/prism/v1alpha1"
	"github.com/prismgpu/prism/demo/bed"
	"github.com/prismgpu/prism/internal/plugin/cdi"
	"github.com/prismgpu/prism/internal/plugin/checkpoint"
	"github.com/prismgpu/prism/internal/plugin/profiling"
)

// Settling: what a deleted claim leaves on its node may take this long to
// go, and a finished run's WorkloadProfile this long to be written.
const (
	settleWithin  = 2 * time.Minute
	publishWithin = 3 * time.Minute
)

// checkAll checks the invariants after a fault; final also reads the
// checkpoints and waits for every finished run's profile.
func (s *soak) checkAll(ctx context.Context, after string, final bool) {
	s.checkAllocations(ctx, after)
	s.checkLeftovers(ctx, after, final)
	s.checkProfiles(ctx, after, final)
}

// checkAllocations: no device is allocated beyond its capacity. A claim
// that consumed no capacity holds its device whole.
func (s *soak) checkAllocations(ctx context.Context, after string) {
	var claims *resourceapi.ResourceClaimList
	var slices *resourceapi.ResourceSliceList
	if err := retry(ctx, time.Minute, func() error {
		var err error
		if claims, err = s.client.ResourceV1().ResourceClaims("").List(ctx, metav1.ListOptions{}); err != nil {
			return err
		}
		slices, err = s.client.ResourceV1().ResourceSlices().List(ctx, metav1.ListOptions{})
		return err
	}); err != nil {
		s.violate(after, "api", "list claims and slices: %v", err)
		return
	}
	for _, v := range overAllocated(slices.Items, claims.Items) {
		s.violate(after, "allocation", "%s", v)
	}
}

// overAllocated lists the devices allocated beyond their memory, or held
// whole by one claim and by another too. A result that consumed no
// capacity holds its device whole.
func overAllocated(slices []resourceapi.ResourceSlice, claims []resourceapi.ResourceClaim) []string {
	memory := gpuv1alpha1.MemoryCapacity.Qualified()
	capacity := map[string]resource.Quantity{}
	for _, sl := range slices {
		if sl.Spec.Driver != gpuv1alpha1.DriverName {
			continue
		}
		for _, d := range sl.Spec.Devices {
			capacity[sl.Spec.Pool.Name+"/"+d.Name] = d.Capacity[memory].Value
		}
	}
	type use struct {
		memory  resource.Quantity
		whole   bool
		holders []string
	}
	uses := map[string]*use{}
	for _, c := range claims {
		if c.Status.Allocation == nil {
			continue
		}
		for _, r := range c.Status.Allocation.Devices.Results {
			if r.Driver != gpuv1alpha1.DriverName {
				continue
			}
			key := r.Pool + "/" + r.Device
			u := uses[key]
			if u == nil {
				u = &use{}
				uses[key] = u
			}
			take, ok := r.ConsumedCapacity[memory]
			if !ok {
				take, u.whole = capacity[key], true
			}
			u.memory.Add(take)
			u.holders = append(u.holders, c.Namespace+"/"+c.Name)
		}
	}
	var out []string
	for key, u := range uses {
		total, known := capacity[key]
		if !known {
			continue // a device republished under another name; the next check sees it
		}
		if u.memory.Cmp(total) > 0 || (u.whole && len(u.holders) > 1) {
			out = append(out, fmt.Sprintf("device %s allocated %s of its %s memory, to %s", key, &u.memory, &total, strings.Join(u.holders, ", ")))
		}
	}
	sort.Strings(out)
	return out
}

// checkLeftovers: once settled, no CDI spec, report directory or queued
// collection on a node belongs to a claim that no longer exists, nor, when
// final, a checkpoint entry. The plugin is running, so its checkpoint is
// read from a copy.
func (s *soak) checkLeftovers(ctx context.Context, after string, final bool) {
	var left []string
	deadline := time.Now().Add(settleWithin)
	for {
		live, err := s.liveClaims(ctx)
		if err != nil {
			s.violate(after, "api", "list claims: %v", err)
			return
		}
		left = left[:0]
		for _, n := range s.cluster.Nodes() {
			held := slices.Concat(preparedUIDs(filepath.Join(n.Dir, "cdi"), s.bed.StateDirs[n.Name]), mpsHeld(s.bed.StateDirs[n.Name]))
			if final {
				claims, daemons, err := readCheckpoint(ctx, s.bed.StateDirs[n.Name])
				if err != nil {
					left = append(left, fmt.Sprintf("unreadable checkpoint on %s: %v", n.Name, err))
				}
				for _, c := range claims {
					held = append(held, prepared{"checkpoint entry " + c.Namespace + "/" + c.Name, c.UID})
				}
				for key := range daemons {
					held = append(held, prepared{"checkpoint record of MPS daemon " + key, shareDaemonClaim(key)})
				}
			}
			for _, p := range held {
				if !live.Has(p.uid) {
					left = append(left, fmt.Sprintf("%s on %s (claim %s)", p.what, n.Name, p.uid))
				}
			}
		}
		if len(left) == 0 || time.Now().After(deadline) || !sleep(ctx, 2*time.Second) {
			break
		}
	}
	for _, l := range left {
		s.violate(after, "leftover", "%s outlived its claim by %s", l, settleWithin)
	}
}

func (s *soak) liveClaims(ctx context.Context) (sets.Set[string], error) {
	live := sets.New[string]()
	err := retry(ctx, time.Minute, func() error {
		list, err := s.client.ResourceV1().ResourceClaims("").List(ctx, metav1.ListOptions{})
		if err != nil {
			return err
		}
		live.Clear()
		for _, c := range list.Items {
			live.Insert(string(c.UID))
		}
		return nil
	})
	return live, err
}

type prepared struct{ what, uid string }

// claimUID matches the UIDs the API server gives objects.
var claimUID = regexp.MustCompile(`^[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}$`)

// preparedUIDs are the claims a node holds something for: a CDI spec in
// cdiRoot, or a report directory under the plugin's state directory.
func preparedUIDs(cdiRoot, stateDir string) []prepared {
	var out []prepared
	prefix, suffix, _ := strings.Cut(cdi.SpecFileName("UID"), "UID")
	specs, _ := os.ReadDir(cdiRoot)
	for _, e := range specs {
		if uid, ok := strings.CutPrefix(e.Name(), prefix); ok {
			if uid, ok := strings.CutSuffix(uid, suffix); ok {
				out = append(out, prepared{"CDI spec", uid})
			}
		}
	}
	// ClaimDir is <state>/<profiles>/<uid>/<out>; beside the claims'
	// directories, collect holds the collections still queued, each for a
	// claim already gone, and archive the reports kept on purpose.
	profiles := filepath.Dir(filepath.Dir(profiling.ClaimDir(stateDir, "UID")))
	dirs, _ := os.ReadDir(profiles)
	for _, e := range dirs {
		if claimUID.MatchString(e.Name()) && e.IsDir() {
			out = append(out, prepared{"report directory", e.Name()})
		}
	}
	queued, _ := os.ReadDir(filepath.Join(profiles, "collect"))
	for _, e := range queued {
		out = append(out, prepared{"queued collection " + e.Name(), "none"})
	}
	return out
}

// mpsHeld are the claims whose shares' MPS daemons a node still has: a
// daemon directory under the plugin's state directory, or a daemon or
// server process whose pipe directory is one.
func mpsHeld(stateDir string) []prepared {
	var out []prepared
	dirs, _ := os.ReadDir(filepath.Join(stateDir, "mps"))
	for _, e := range dirs {
		if e.IsDir() && !strings.HasPrefix(e.Name(), ".") {
			out = append(out, prepared{"MPS daemon directory " + e.Name(), shareDaemonClaim(e.Name())})
		}
	}
	procs, _ := bed.MPSProcesses(stateDir)
	for pid, pipeDir := range procs {
		key := filepath.Base(filepath.Dir(pipeDir))
		out = append(out, prepared{fmt.Sprintf("MPS process %d of daemon %s", pid, key), shareDaemonClaim(key)})
	}
	return out
}

// shareDaemonClaim is the UID of the claim whose share an MPS daemon key
// (<claim UID>-<device>) names; "none" for a key that names no claim, so
// that it is always left over.
func shareDaemonClaim(key string) string {
	if len(key) > 36 && claimUID.MatchString(key[:36]) && key[36] == '-' {
		return key[:36]
	}
	return "none"
}

// checkProfiles: every profiled run that finished at least publishWithin
// ago (every one, waiting up to publishWithin, when final) has its
// WorkloadProfile, carrying its report's digest.
func (s *soak) checkProfiles(ctx context.Context, after string, final bool) {
	deadline := time.Now().Add(publishWithin)
	for {
		s.mu.Lock()
		var due []finishedRun
		for _, r := range s.finished {
			if !s.reported["profile/"+r.profile] && (final || time.Since(r.at) > publishWithin) {
				due = append(due, r)
			}
		}
		s.mu.Unlock()
		type miss struct {
			run    finishedRun
			detail string
		}
		var missing []miss
		for _, r := range due {
			var wp prismv1alpha1.WorkloadProfile
			err := retry(ctx, time.Minute, func() error {
				return client.IgnoreNotFound(s.prism.Get(ctx, client.ObjectKey{Namespace: Namespace, Name: r.profile}, &wp))
			})
			got := ""
			if err == nil && wp.Status.Report != nil {
				got = wp.Status.Report.SHA256
			}
			if got == r.digest {
				s.mu.Lock()
				s.reported["profile/"+r.profile] = true
				s.res.ProfilesPublished++
				s.mu.Unlock()
				continue
			}
			missing = append(missing, miss{r, fmt.Sprintf("%s (report %.12s, profile has %.12s, %v)", r.profile, r.digest, got, err)})
		}
		if len(missing) == 0 {
			return
		}
		if !final || time.Now().After(deadline) || !sleep(ctx, 2*time.Second) {
			for _, m := range missing {
				s.violate(after, "profile", "finished run's report never reached its WorkloadProfile: %s", m.detail)
				s.mu.Lock()
				s.reported["profile/"+m.run.profile] = true
				s.mu.Unlock()
			}
			return
		}
	}
}

// readCheckpoint reads a copy of the plugin's checkpoint: its claims and
// its MPS daemons.
func readCheckpoint(ctx context.Context, stateDir string) ([]checkpoint.Claim, map[string]checkpoint.MPSDaemon, error) {
	tmp, err := os.MkdirTemp("", "prism-soak-checkpoint-")
	if err != nil {
		return nil, nil, err
	}
	defer os.RemoveAll(tmp)
	entries, err := os.ReadDir(stateDir)
	if err != nil {
		return nil, nil, err
	}
	for _, e := range entries {
		if !e.Type().IsRegular() {
			continue
		}
		if err := copyFile(filepath.Join(stateDir, e.Name()), filepath.Join(tmp, e.Name())); err != nil {
			return nil, nil, err
		}
	}
	store, rec, err := checkpoint.Open(ctx, tmp, checkpoint.Options{})
	if err != nil {
		return nil, nil, err
	}
	defer store.Close()
	if rec.Corruption != nil || rec.BootIDChanged {
		return nil, nil, fmt.Errorf("the checkpoint needed recovery: %+v", rec)
	}
	return store.List(), store.MPSDaemons(), nil
}

func copyFile(from, to string) error {
	in, err := os.Open(from)
	if err != nil {
		return err
	}
	defer in.Close()
	out, err := os.Create(to)
	if err != nil {
		return err
	}
	if _, err := io.Copy(out, in); err != nil {
		out.Close()
		return err
	}
	return out.Close()
}
