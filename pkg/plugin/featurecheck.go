package plugin

import (
	"context"
	"fmt"
	"slices"
	"time"

	corev1 "k8s.io/api/core/v1"
	resourceapi "k8s.io/api/resource/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/klog/v2"
)

// defaultFeatureCheckTimeout is how long published fields may take to appear
// in the API before they count as dropped; the slice controller writes
// within seconds.
const defaultFeatureCheckTimeout = time.Minute

// Event reasons of apiFeatures, named so that operators' alerts and the
// docs' Event table can rely on them.
const (
	EventReasonDeviceTaintsDropped       = "DeviceTaintsDropped"
	EventReasonConsumableCapacityDropped = "ConsumableCapacityDropped"
)

// apiFeature is a field of a published device that an API server drops,
// without an error, where the feature gate behind it is off: off by default
// on the older releases Prism supports, so the cluster silently behaves as
// if the plugin had never published it.
type apiFeature struct {
	gate   string // the feature gate to enable; also the metric's label
	reason string // the Event's reason
	// lost says what the cluster does without the field, for the log line
	// and the Event.
	lost string
	uses func(resourceapi.Device) bool
}

var apiFeatures = [...]apiFeature{
	{
		gate: "DRADeviceTaints", reason: EventReasonDeviceTaintsDropped,
		lost: "the taints Prism set on unhealthy GPUs, so they stay schedulable",
		uses: func(d resourceapi.Device) bool { return len(d.Taints) > 0 },
	},
	{
		gate: "DRAConsumableCapacity", reason: EventReasonConsumableCapacityDropped,
		lost: "the GPUs' shareable memory (--consumable-capacity), so every claim is given whole GPUs",
		uses: func(d resourceapi.Device) bool {
			return d.AllowMultipleAllocations != nil && *d.AllowMultipleAllocations
		},
	},
}

// checkFeaturesKept starts a read-back for every feature the published
// devices use and no earlier read-back has settled.
func (d *Driver) checkFeaturesKept(ctx context.Context, published []resourceapi.Device) {
	for i, f := range apiFeatures {
		if slices.ContainsFunc(published, f.uses) {
			go d.checkFeatureKept(ctx, i, published)
		}
	}
}

// checkFeatureKept reads back the node's slices after devices using feature
// i were published, and says once, loudly, when the API server dropped the
// field. The slice controller writes asynchronously, so a slice without the
// field only counts once it has failed to appear for featureCheckTimeout.
// One check per feature runs at a time, and none once a verdict was reached.
func (d *Driver) checkFeatureKept(ctx context.Context, i int, published []resourceapi.Device) {
	f := apiFeatures[i]
	if !d.featureCheck[i].CompareAndSwap(false, true) {
		return
	}
	logger := klog.FromContext(ctx).WithValues("featureGate", f.gate)
	want := map[string]bool{}
	for _, dev := range published {
		if f.uses(dev) {
			want[dev.Name] = true
		}
	}
	var missing []string
	kept := false
	err := wait.PollUntilContextTimeout(ctx, d.featureCheckInterval, d.featureCheckTimeout, true, func(ctx context.Context) (bool, error) {
		slices, err := d.cfg.KubeClient.ResourceV1().ResourceSlices().List(ctx, metav1.ListOptions{
			FieldSelector: fields.Set{resourceapi.ResourceSliceSelectorNodeName: d.cfg.NodeName, resourceapi.ResourceSliceSelectorDriver: DriverName}.String(),
		})
		if err != nil {
			logger.V(2).Info("Reading back the ResourceSlice to check what the API server kept", "err", err)
			return false, nil
		}
		missing = nil
		for _, s := range slices.Items {
			if s.Spec.NodeName == nil || *s.Spec.NodeName != d.cfg.NodeName || s.Spec.Driver != DriverName {
				continue
			}
			for _, dev := range s.Spec.Devices {
				switch {
				case !want[dev.Name]:
				case f.uses(dev):
					kept = true
				default:
					missing = append(missing, dev.Name)
				}
			}
		}
		return kept, nil
	})
	switch {
	case kept:
		logger.V(2).Info("The API server keeps what the feature gate governs")
		d.metrics.apiFeatureDropped.WithLabelValues(f.gate).Set(0)
		return
	case ctx.Err() != nil || len(missing) == 0:
		// No verdict: stopping, the API unreachable, or the slice not
		// written yet. The next publication checks again.
		logger.V(2).Info("No verdict on whether the API server keeps what the feature gate governs", "err", err)
		d.featureCheck[i].Store(false)
		return
	}
	msg := fmt.Sprintf("The API server dropped %s: enable the %s feature gate on the API server and the scheduler (off by default before Kubernetes 1.36)", f.lost, f.gate)
	logger.Error(nil, msg, "devices", missing)
	d.metrics.apiFeatureDropped.WithLabelValues(f.gate).Set(1)
	d.recorder.Eventf(d.nodeRef(), corev1.EventTypeWarning, f.reason, "%s; devices %v", msg, missing)
}
