package plugin

import (
	"context"
	"time"

	corev1 "k8s.io/api/core/v1"
	resourceapi "k8s.io/api/resource/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/klog/v2"
)

// defaultTaintCheckTimeout is how long published taints may take to appear
// in the API before they count as dropped; the slice controller writes
// within seconds.
const defaultTaintCheckTimeout = time.Minute

func hasTaints(devices []resourceapi.Device) bool {
	for _, d := range devices {
		if len(d.Taints) > 0 {
			return true
		}
	}
	return false
}

// checkTaintsKept reads back the node's slices after taints were published.
// On Kubernetes 1.34 and 1.35 the DRADeviceTaints feature is off by default
// and the API server drops device taints without an error, so a faulty GPU
// would be offered as if healthy: say so once, loudly. The slice controller
// writes asynchronously, so a slice without the taints only counts once the
// taints have failed to appear for taintCheckTimeout. One check runs at a
// time, and none once a verdict was reached.
func (d *Driver) checkTaintsKept(ctx context.Context, published []resourceapi.Device) {
	if !d.taintCheck.CompareAndSwap(false, true) {
		return
	}
	logger := klog.FromContext(ctx)
	want := map[string]bool{}
	for _, dev := range published {
		if len(dev.Taints) > 0 {
			want[dev.Name] = true
		}
	}
	var untainted []string
	kept := false
	err := wait.PollUntilContextTimeout(ctx, d.taintCheckInterval, d.taintCheckTimeout, true, func(ctx context.Context) (bool, error) {
		slices, err := d.cfg.KubeClient.ResourceV1().ResourceSlices().List(ctx, metav1.ListOptions{
			FieldSelector: fields.Set{resourceapi.ResourceSliceSelectorNodeName: d.cfg.NodeName, resourceapi.ResourceSliceSelectorDriver: DriverName}.String(),
		})
		if err != nil {
			logger.V(2).Info("Reading back the ResourceSlice to check its taints", "err", err)
			return false, nil
		}
		untainted = nil
		for _, s := range slices.Items {
			if s.Spec.NodeName == nil || *s.Spec.NodeName != d.cfg.NodeName || s.Spec.Driver != DriverName {
				continue
			}
			for _, dev := range s.Spec.Devices {
				switch {
				case !want[dev.Name]:
				case len(dev.Taints) > 0:
					kept = true
				default:
					untainted = append(untainted, dev.Name)
				}
			}
		}
		return kept, nil
	})
	switch {
	case kept:
		logger.V(2).Info("The API server keeps device taints")
		return
	case ctx.Err() != nil || len(untainted) == 0:
		// No verdict: stopping, the API unreachable, or the slice not
		// written yet. The next publication with taints checks again.
		logger.V(2).Info("No verdict on whether the API server keeps device taints", "err", err)
		d.taintCheck.Store(false)
		return
	}
	logger.Error(nil, "The API server dropped the taints of unhealthy GPUs, which stay schedulable: enable the DRADeviceTaints feature gate on the API server and scheduler (off by default on Kubernetes 1.34 and 1.35)", "devices", untainted)
	d.recorder.Eventf(d.nodeRef(), corev1.EventTypeWarning, "DeviceTaintsDropped",
		"The API server dropped the taints Prism set on unhealthy GPUs %v, so they stay schedulable; enable the DRADeviceTaints feature gate", untainted)
}
