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
	"testing"
	"time"

	resourceapi "k8s.io/api/resource/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/kubernetes/fake"
	clienttesting "k8s.io/client-go/testing"
	"k8s.io/klog/v2/ktesting"
	"k8s.io/utils/ptr"

	"github.com/prometheus/client_golang/prometheus/testutil"

	gpuv1alpha1 "github.com/prismgpu/prism/api/gpu/v1alpha1"
)

// TestDeletedSliceIsPublishedAgain: a starting kubelet deletes its node's
// ResourceSlices; the plugin publishes again at once instead of waiting for
// the slice controller's sync delay. Slices of other nodes or drivers are
// not its business.
func TestDeletedSliceIsPublishedAgain(t *testing.T) {
	_, ctx := ktesting.NewTestContext(t)
	d := newTestDriver(t, "t4-2.yaml", t.TempDir())
	slices := d.cfg.KubeClient.ResourceV1().ResourceSlices()
	slice := func(name, node, driver string) *resourceapi.ResourceSlice {
		return &resourceapi.ResourceSlice{
			ObjectMeta: metav1.ObjectMeta{Name: name},
			Spec:       resourceapi.ResourceSliceSpec{Driver: driver, NodeName: ptr.To(node), Pool: resourceapi.ResourcePool{Name: node, ResourceSliceCount: 1}},
		}
	}
	for _, s := range []*resourceapi.ResourceSlice{
		slice("mine", testNode, gpuv1alpha1.DriverName),
		slice("other-node", "node-b", gpuv1alpha1.DriverName),
		slice("other-driver", testNode, "gpu.example.com"),
	} {
		if _, err := slices.Create(ctx, s, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	// The fake clientset drops what happens between the informer's list
	// and its watch: delete only once it watches.
	watching := make(chan struct{})
	var once sync.Once
	client := d.cfg.KubeClient.(*fake.Clientset)
	client.PrependWatchReactor("resourceslices", func(a clienttesting.Action) (bool, watch.Interface, error) {
		w, err := client.Tracker().Watch(a.GetResource(), a.GetNamespace())
		once.Do(func() { close(watching) })
		return true, w, err
	})
	d.pool.republishWithdrawnSlices(ctx)
	select {
	case <-watching:
	case <-time.After(10 * time.Second):
		t.Fatal("the informer never watched ResourceSlices")
	}
	pub := d.pool.publisher.(*recordingPublisher)
	before := pub.count()

	for _, name := range []string{"other-node", "other-driver", "mine"} {
		if err := slices.Delete(ctx, name, metav1.DeleteOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	if err := wait.PollUntilContextTimeout(ctx, 10*time.Millisecond, 10*time.Second, true, func(ctx context.Context) (bool, error) {
		return pub.count() > before, nil
	}); err != nil {
		t.Fatalf("deleted slice not published again: %d publishes before, %d after", before, pub.count())
	}
	// Events arrive in order: had the others counted, they would have by now.
	if got := testutil.ToFloat64(d.metrics.slicesRepublished); got != 1 {
		t.Errorf("prism_plugin_resourceslices_republished_total = %v, want 1", got)
	}
}
