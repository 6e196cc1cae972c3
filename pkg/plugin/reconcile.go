package plugin

import (
	"context"
	"errors"
	"fmt"

	"k8s.io/klog/v2"

	"github.com/prismgpu/prism/pkg/checkpoint"
)

// reconcile makes the CDI specs on disk agree with the checkpoint after a
// restart: a claim whose prepare never completed is rolled back (the kubelet
// retries it and gets the same IDs), a completed claim whose spec is missing
// gets it rewritten, and a spec that no claim owns is removed, so no device
// stays blocked by an orphan.
func (d *Driver) reconcile(ctx context.Context) error {
	logger := klog.FromContext(ctx)
	var errs []error
	onDisk, err := d.cfg.CDI.ListClaimSpecs(ctx)
	if err != nil {
		return fmt.Errorf("list CDI specs: %w", err)
	}
	present := map[string]bool{}
	for _, uid := range onDisk {
		present[uid] = true
	}
	owned := map[string]bool{}
	for _, c := range d.checkpoint.List() {
		switch c.State {
		case checkpoint.PrepareStarted:
			logger.Info("Rolling back an interrupted prepare", "claim", c.Namespace+"/"+c.Name, "uid", c.UID)
			if err := d.cfg.CDI.RemoveClaimSpec(ctx, c.UID); err != nil {
				errs = append(errs, err)
				continue
			}
			if err := d.forget(ctx, c.UID); err != nil {
				errs = append(errs, err)
				continue
			}
			d.metrics.checkpointRecover.WithLabelValues("rolled-back").Inc()
		case checkpoint.PrepareCompleted:
			owned[c.UID] = true
			if present[c.UID] {
				// Specs are written by rename, so one that exists is whole.
				continue
			}
			logger.Info("Rewriting a missing CDI spec", "claim", c.Namespace+"/"+c.Name, "uid", c.UID)
			d.metrics.checkpointRecover.WithLabelValues("spec-rewritten").Inc()
			if err := d.writeSpec(ctx, c); err != nil {
				errs = append(errs, fmt.Errorf("rewrite CDI spec of claim %s: %w", c.UID, err))
				continue
			}
		}
	}
	for _, uid := range onDisk {
		if owned[uid] {
			continue
		}
		logger.Info("Removing orphaned CDI spec", "uid", uid)
		if err := d.cfg.CDI.RemoveClaimSpec(ctx, uid); err != nil {
			errs = append(errs, err)
			continue
		}
		d.metrics.checkpointRecover.WithLabelValues("orphan-removed").Inc()
	}
	d.updateGauges()
	return errors.Join(errs...)
}
