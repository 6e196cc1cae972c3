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

package gpu

import (
	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/klog/v2"
	"k8s.io/utils/ptr"

	gpuv1alpha1 "github.com/prismgpu/prism/api/gpu/v1alpha1"
)

type namedAttribute struct {
	name  resourceapi.QualifiedName
	value resourceapi.DeviceAttribute
}

// attributeList collects a published device's attributes in priority
// order: if the API limit on attributes is ever reached, the ones at the
// end are dropped first. Empty strings and versions are left out.
type attributeList struct {
	// logger hears of the versions dropped because they do not parse.
	logger klog.Logger
	attrs  []namedAttribute
}

func (l *attributeList) add(name resourceapi.QualifiedName, v resourceapi.DeviceAttribute) {
	l.attrs = append(l.attrs, namedAttribute{name, v})
}

func (l *attributeList) str(id gpuv1alpha1.AttributeName, v string) {
	if v != "" {
		l.add(id.Qualified(), resourceapi.DeviceAttribute{StringValue: ptr.To(v)})
	}
}

func (l *attributeList) integer(id gpuv1alpha1.AttributeName, v int) {
	l.add(id.Qualified(), resourceapi.DeviceAttribute{IntValue: ptr.To(int64(v))})
}

func (l *attributeList) version(id gpuv1alpha1.AttributeName, v string) {
	if v == "" {
		return
	}
	sv, err := semverFromDotted(v)
	if err != nil {
		l.logger.Info("Dropping device attribute", "attribute", id, "value", v, "reason", err.Error())
		return
	}
	l.add(id.Qualified(), resourceapi.DeviceAttribute{VersionValue: ptr.To(sv)})
}

// figures adds what a whole GPU and a partition publish alike, in this
// order: the GPU's architecture and versions, the figures of d that a
// selector compares (a partition passes its own share, Partition.Figures),
// and the GPU's NUMA node and NVLink domain. fp16 is the FP16 tensor
// figure, when known, since a partition scales its parent's.
func (l *attributeList) figures(d Device, fp16 int, fp16Known bool) {
	l.str(gpuv1alpha1.ArchitectureAttribute, d.Architecture)
	l.version(gpuv1alpha1.CUDAComputeCapabilityAttribute, d.CUDAComputeCapability.String())
	l.version(gpuv1alpha1.DriverVersionAttribute, d.DriverVersion)
	l.version(gpuv1alpha1.CUDADriverVersionAttribute, d.CUDADriverVersion)
	if bw := d.MemoryBandwidthGBps(); bw > 0 {
		l.integer(gpuv1alpha1.MemoryBandwidthGBpsAttribute, bw)
		l.str(gpuv1alpha1.BandwidthClassAttribute, d.BandwidthClass())
	}
	if d.MultiprocessorCount > 0 {
		l.integer(gpuv1alpha1.MultiprocessorCountAttribute, d.MultiprocessorCount)
	}
	if f := d.FP32GFLOPS(); f > 0 {
		l.integer(gpuv1alpha1.FP32GFLOPSAttribute, f)
	}
	if fp16Known {
		l.integer(gpuv1alpha1.FP16TensorTFLOPSAttribute, fp16)
	}
	if d.NUMANode != nil {
		l.integer(gpuv1alpha1.NUMANodeAttribute, *d.NUMANode)
	}
	if d.NVLinkDomain != nil {
		l.integer(gpuv1alpha1.NVLinkDomainAttribute, *d.NVLinkDomain)
	}
}
