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

package fleet

import (
	"context"
	"sync/atomic"
	"testing"
	"time"

	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/kubernetes/fake"
	"k8s.io/client-go/tools/cache"
)

// runInformer runs an informer of what the fake clientset's list and watch
// give, through transform, as controller-runtime would (with its namespace
// index), and returns it once the handler has seen the list and the
// informer has checked for resyncs. An informer passes an update whose
// resourceVersion did not change only to the handlers due to resync, and
// the handler is due for one hourly: it sees an update only where the
// transform kept the new resourceVersion.
func runInformer(t *testing.T, client *fake.Clientset, lw cache.ListWatch, example runtime.Object, transform cache.TransformFunc, handler cache.ResourceEventHandler) cache.SharedIndexInformer {
	t.Helper()
	const check = 10 * time.Millisecond
	informer := cache.NewSharedIndexInformer(cache.ToListWatcherWithWatchListSemantics(&lw, client), example, check,
		cache.Indexers{cache.NamespaceIndex: cache.MetaNamespaceIndexFunc})
	if err := informer.SetTransform(transform); err != nil {
		t.Fatal(err)
	}
	registration, err := informer.AddEventHandlerWithResyncPeriod(handler, time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	// Each check decides which handlers are due; until the first, all are.
	var resyncs atomic.Int32
	if _, err := informer.AddEventHandlerWithResyncPeriod(cache.ResourceEventHandlerFuncs{UpdateFunc: func(_, _ any) { resyncs.Add(1) }}, check); err != nil {
		t.Fatal(err)
	}
	go informer.RunWithContext(t.Context())
	waitFor(t, "synced", registration.HasSynced)
	waitFor(t, "a resync", func() bool { return resyncs.Load() > 0 })
	return informer
}

// waitFor waits until done, for at most 10 s.
func waitFor(t *testing.T, what string, done func() bool) {
	t.Helper()
	if err := wait.PollUntilContextTimeout(t.Context(), 10*time.Millisecond, 10*time.Second, true, func(context.Context) (bool, error) { return done(), nil }); err != nil {
		t.Fatalf("%s: %v", what, err)
	}
}
