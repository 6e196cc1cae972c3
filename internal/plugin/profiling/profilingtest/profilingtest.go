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

// Package profilingtest lets tests publish profiles through a
// controller-runtime client, such as its fake with interceptors. Only tests
// import it, so controller-runtime stays out of the kubelet plugin.
package profilingtest

import (
	"context"

	"sigs.k8s.io/controller-runtime/pkg/client"

	prismv1alpha1 "github.com/prismgpu/prism/api/prism/v1alpha1"
)

// WorkloadProfiles adapts c, which must know the prism.dev/v1alpha1 types
// and treat status as a subresource, to profiling.WorkloadProfiles. It
// does not import package profiling, whose own tests use it.
func WorkloadProfiles(c client.Client) Profiles {
	return Profiles{c}
}

// Profiles implements profiling.WorkloadProfiles.
type Profiles struct{ c client.Client }

func (p Profiles) Get(ctx context.Context, namespace, name string) (*prismv1alpha1.WorkloadProfile, error) {
	wp := &prismv1alpha1.WorkloadProfile{}
	return wp, p.c.Get(ctx, client.ObjectKey{Namespace: namespace, Name: name}, wp)
}

func (p Profiles) Create(ctx context.Context, wp *prismv1alpha1.WorkloadProfile) error {
	return p.c.Create(ctx, wp)
}

func (p Profiles) UpdateStatus(ctx context.Context, wp *prismv1alpha1.WorkloadProfile) error {
	return p.c.Status().Update(ctx, wp)
}
