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

package v1alpha1_test

import (
	"testing"

	"github.com/google/go-cmp/cmp"
	"k8s.io/apimachinery/pkg/api/resource"

	gpuv1alpha1 "github.com/prismgpu/prism/api/gpu/v1alpha1"
	"github.com/prismgpu/prism/api/prism/v1alpha1"
)

func TestNewGrantedShare(t *testing.T) {
	for _, tc := range []struct {
		name  string
		share gpuv1alpha1.Share
		want  *v1alpha1.GrantedShare
	}{
		{"compute and memory", gpuv1alpha1.Share{ComputePercent: 45, MemoryBytes: 8 << 30},
			&v1alpha1.GrantedShare{ComputePercent: 45, Memory: resource.NewQuantity(8<<30, resource.BinarySI)}},
		// A memory of 0 names no amount: the status leaves it out rather
		// than record a share of no memory.
		{"compute alone", gpuv1alpha1.Share{ComputePercent: 30}, &v1alpha1.GrantedShare{ComputePercent: 30}},
		{"memory alone", gpuv1alpha1.Share{MemoryBytes: 20 << 30},
			&v1alpha1.GrantedShare{Memory: resource.NewQuantity(20<<30, resource.BinarySI)}},
		{"no amounts", gpuv1alpha1.Share{}, &v1alpha1.GrantedShare{}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if diff := cmp.Diff(tc.want, v1alpha1.NewGrantedShare(tc.share)); diff != "" {
				t.Errorf("granted share (-want +got):\n%s", diff)
			}
		})
	}
}
