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
	"errors"
	"fmt"
	"time"

	resourceapi "k8s.io/api/resource/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/klog/v2"

	"github.com/prismgpu/prism/internal/plugin/checkpoint"
	"github.com/prismgpu/prism/internal/plugin/profiling"
)

// reconcile makes the CDI specs on disk agree with the checkpoint after a
// restart: a claim whose prepare never completed is rolled back (the kubelet
// retries it and gets the same IDs), a completed claim whose spec is missing
// gets it rewritten, and a spec that no claim owns is removed, so no device
// stays blocked by an orphan, unless keepUnowned says the owners could not
// be looked up.
func (s *deviceState) reconcile(ctx context.Context, keepUnowned bool) error {
	logger := klog.FromContext(ctx)
	var errs []error
	onDisk, err := s.cdi.ListClaimSpecs(ctx)
	if err != nil {
		return fmt.Errorf("list CDI specs: %w", err)
	}
	present := map[string]bool{}
	for _, uid := range onDisk {
		present[uid] = true
	}
	owned := map[string]bool{}
	for _, c := range s.checkpoint.List() {
		switch c.State {
		case checkpoint.PrepareStarted:
			logger.Info("Rolling back an interrupted prepare", "claim", c.Namespace+"/"+c.Name, "uid", c.UID)
			// Instances first: once the record is gone, nothing says they
			// are Prism's to destroy.
			if err := s.partitions.destroy(ctx, c); err != nil {
				errs = append(errs, fmt.Errorf("roll back MIG instances of claim %s: %w", c.UID, err))
				continue
			}
			if err := s.cdi.RemoveClaimSpec(ctx, c.UID); err != nil {
				errs = append(errs, err)
				continue
			}
			if err := s.forget(ctx, c.UID); err != nil {
				errs = append(errs, err)
				continue
			}
			s.metrics.checkpointRecover.WithLabelValues("rolled-back").Inc()
		case checkpoint.PrepareCompleted:
			owned[c.UID] = true
			if present[c.UID] {
				// Specs are written by rename, so one that exists is whole.
				continue
			}
			logger.Info("Rewriting a missing CDI spec", "claim", c.Namespace+"/"+c.Name, "uid", c.UID)
			s.metrics.checkpointRecover.WithLabelValues("spec-rewritten").Inc()
			if err := s.writeSpec(ctx, c); err != nil {
				errs = append(errs, fmt.Errorf("rewrite CDI spec of claim %s: %w", c.UID, err))
				continue
			}
		}
	}
	for _, uid := range onDisk {
		if owned[uid] {
			continue
		}
		if keepUnowned {
			logger.Info("Keeping a CDI spec the checkpoint does not explain", "uid", uid)
			continue
		}
		logger.Info("Removing orphaned CDI spec", "uid", uid)
		if err := s.cdi.RemoveClaimSpec(ctx, uid); err != nil {
			errs = append(errs, err)
			continue
		}
		s.metrics.checkpointRecover.WithLabelValues("orphan-removed").Inc()
	}
	s.partitions.reportForeign(ctx)
	s.updateGauges()
	return errors.Join(errs...)
}

// defaultAPIBackoff waits about a minute in all for the API server: long
// enough for a control plane restarting with the node, short enough that the
// startup probe is not exhausted.
var defaultAPIBackoff = wait.Backoff{Duration: time.Second, Factor: 2, Jitter: 0.1, Steps: 6}

// adoptSpecs rebuilds the records of a lost checkpoint from what survived
// it: each CDI spec names its claim's UID, and the claim in the API server
// says which devices and configuration it was prepared with. Adopting the
// specs rather than deleting them keeps running pods' containers able to
// restart and keeps their GPUs guarded. Specs whose claim is gone are left
// to reconcile, which removes them as orphans. An error means the claims
// could not be read, and the specs' fate is unknown.
func (s *deviceState) adoptSpecs(ctx context.Context) error {
	logger := klog.FromContext(ctx)
	onDisk, err := s.cdi.ListClaimSpecs(ctx)
	if err != nil {
		return fmt.Errorf("list CDI specs: %w", err)
	}
	var unowned []string
	for _, uid := range onDisk {
		if _, ok := s.checkpoint.Get(uid); !ok {
			unowned = append(unowned, uid)
		}
	}
	if len(unowned) == 0 {
		return nil
	}
	var claims *resourceapi.ResourceClaimList
	attempt := 0
	err = wait.ExponentialBackoffWithContext(ctx, s.apiBackoff, func(ctx context.Context) (bool, error) {
		attempt++
		claims, err = s.kube.ResourceV1().ResourceClaims("").List(ctx, metav1.ListOptions{})
		if err != nil {
			logger.Info("Waiting for the API server to rebuild the checkpoint from CDI specs", "attempt", attempt, "specs", len(unowned), "err", err.Error())
			return false, nil
		}
		return true, nil
	})
	if err != nil {
		return fmt.Errorf("list claims of %d CDI specs after %d attempts: %w", len(unowned), attempt, err)
	}
	byUID := map[string]*resourceapi.ResourceClaim{}
	for i := range claims.Items {
		byUID[string(claims.Items[i].UID)] = &claims.Items[i]
	}
	err = s.checkpoint.Update(ctx, func(data *checkpoint.Data) error {
		for _, uid := range unowned {
			claim, ok := byUID[uid]
			if !ok {
				continue
			}
			rec, err := s.plan(ctx, claim)
			if err != nil {
				logger.Info("Not adopting a CDI spec", "claim", klog.KObj(claim), "reason", err.Error())
				continue
			}
			rec.State = checkpoint.PrepareCompleted
			data.Claims[uid] = rec
			s.metrics.checkpointRecover.WithLabelValues("adopted").Inc()
			logger.Info("Adopted a prepared claim from its CDI spec", "claim", klog.KObj(claim))
		}
		return nil
	})
	if err != nil {
		return fmt.Errorf("record adopted claims: %w", err)
	}
	return nil
}

// releaseStale undoes what prepare did for a claim the kubelet will never
// unprepare. Its report directory is discarded: nobody is left to publish
// it to.
func (s *deviceState) releaseStale(ctx context.Context, c checkpoint.Claim) error {
	return s.guard.exclusive(ctx, func() error {
		rec, ok := s.checkpoint.Get(c.UID)
		if !ok {
			return nil // the other instance of a rolling update released it
		}
		if err := s.cdi.RemoveClaimSpec(ctx, c.UID); err != nil {
			return err
		}
		// As in unprepare, the MIG instances go before the record: once it
		// is forgotten nothing says they are Prism's, and they would block
		// their partitions for good. A failure keeps the record, so that
		// the next sweep tries again.
		if err := s.partitions.destroy(ctx, rec); err != nil {
			return err
		}
		if err := s.timeSlices.set(ctx, rec, map[string]bool{c.UID: true}); err != nil {
			klog.FromContext(ctx).Error(err, "Resetting time slices of a stale claim")
		}
		if rec.Profiling != nil && s.profiler.cfg != nil {
			if err := profiling.DiscardClaimDir(s.profiler.cfg.Options.StateDir, c.UID); err != nil {
				klog.FromContext(ctx).Error(err, "Removing the report directory of a stale claim")
			}
		}
		return s.forget(ctx, c.UID)
	})
}
