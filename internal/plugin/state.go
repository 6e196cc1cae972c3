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
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/record"

	"github.com/prismgpu/prism/internal/plugin/cdi"
	"github.com/prismgpu/prism/internal/plugin/checkpoint"
	"github.com/prismgpu/prism/internal/plugin/usage/sampler"
)

// deviceState is what claims are prepared on, as the example driver's
// DeviceState: the checkpoint of prepared claims under its guard, the
// node's GPUs, the CDI specs, and the parts a claim's devices may need
// (MIG partitions, time slices, MPS shares, profiling, usage sampling).
// It plans a claim, checks it against the claims already prepared, writes
// its record and its spec, and undoes them; Driver adapts the kubelet's
// calls to it.
type deviceState struct {
	node       *corev1.ObjectReference
	kube       kubernetes.Interface
	cdi        *cdi.Writer
	checkpoint *checkpoint.Store
	// guard serialises the work on the checkpoint.
	guard *guard
	// gpus are the node's GPUs and their taints.
	gpus nodeGPUs
	// partitions creates and destroys MIG instances for claims.
	partitions *migPartitions
	// timeSlices sets the time slices claims ask for.
	timeSlices *timeSlices
	// shares runs the MPS control daemons of shared GPUs.
	shares *mpsShares
	// profiler profiles the claims that ask for it.
	profiler *profiler
	// usage samples prepared claims' GPUs; nil when off.
	usage    *sampler.Sampler
	recorder record.EventRecorder
	metrics  *Metrics
	// apiBackoff paces the retries of API calls that start-up waits for.
	apiBackoff wait.Backoff
}
