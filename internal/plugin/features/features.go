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

// Package features defines Prism's feature gates: one versioned gate per
// experimental behaviour, set with --feature-gates beside the logging gates
// of component-base. A gate starts Alpha and off, and is removed once its
// behaviour graduates.
package features

import (
	"k8s.io/apimachinery/pkg/util/version"
	"k8s.io/component-base/featuregate"
)

const (
	// MIGPartitions publishes, for every GPU in MIG mode, each MIG
	// partition it could be cut into as a device consuming the GPU's shared
	// counters, beside the whole GPU. It needs the DRAPartitionableDevices
	// gate of Kubernetes (on by default since 1.36). Off, GPUs in MIG mode
	// are published whole, as every GPU is.
	MIGPartitions featuregate.Feature = "MIGPartitions"
)

// specs are keyed by Prism's release: the version a stage began in.
//
// The gate they join is the logging options' gate, whose emulation version
// is the Kubernetes version component-base was built for (1.37 today), and
// a gate uses the latest spec not newer than that. Prism sets no emulation
// version of its own, so its 0.x releases always count as older: the
// latest spec listed applies, which is the stage of the running release.
var specs = map[featuregate.Feature]featuregate.VersionedSpecs{
	MIGPartitions: {
		{Version: version.MajorMinor(0, 1), Default: false, PreRelease: featuregate.Alpha},
	},
}

// AddFeatureGates registers Prism's gates. It fails only if one is already
// registered.
func AddFeatureGates(gates featuregate.MutableVersionedFeatureGate) error {
	return gates.AddVersioned(specs)
}
