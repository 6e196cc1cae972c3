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

package profiling

import (
	"context"
	"fmt"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/runtime/serializer"
	"k8s.io/client-go/rest"

	prismv1alpha1 "github.com/prismgpu/prism/api/prism/v1alpha1"
)

// WorkloadProfiles is all the Publisher asks of the API server. It is an
// interface so that tests can hand in a fake.
type WorkloadProfiles interface {
	Get(ctx context.Context, namespace, name string) (*prismv1alpha1.WorkloadProfile, error)
	// Create and UpdateStatus write wp back with what the server returned.
	Create(ctx context.Context, wp *prismv1alpha1.WorkloadProfile) error
	UpdateStatus(ctx context.Context, wp *prismv1alpha1.WorkloadProfile) error
}

const workloadProfiles = "workloadprofiles"

// NewWorkloadProfileClient returns a client-go REST client for
// WorkloadProfiles. The plugin uses it rather than controller-runtime's
// client: that one's packages, and the second copy of client-go's scheme
// its apiutil package builds at start-up, cost the plugin resident memory
// on every node for three calls per profiled claim.
func NewWorkloadProfileClient(cfg *rest.Config) (WorkloadProfiles, error) {
	scheme := runtime.NewScheme()
	if err := prismv1alpha1.AddToScheme(scheme); err != nil {
		return nil, fmt.Errorf("register WorkloadProfile types: %w", err)
	}
	// metav1.Status, for the API server's error responses.
	metav1.AddToGroupVersion(scheme, schema.GroupVersion{Version: "v1"})
	c := rest.CopyConfig(cfg)
	gv := prismv1alpha1.GroupVersion
	c.GroupVersion = &gv
	c.APIPath = "/apis"
	c.ContentType = runtime.ContentTypeJSON
	c.AcceptContentTypes = runtime.ContentTypeJSON
	c.NegotiatedSerializer = serializer.NewCodecFactory(scheme).WithoutConversion()
	if c.UserAgent == "" {
		c.UserAgent = rest.DefaultKubernetesUserAgent()
	}
	rc, err := rest.RESTClientFor(c)
	if err != nil {
		return nil, fmt.Errorf("create WorkloadProfile client: %w", err)
	}
	return &restProfiles{rc: rc}, nil
}

type restProfiles struct {
	rc *rest.RESTClient
}

func (r *restProfiles) Get(ctx context.Context, namespace, name string) (*prismv1alpha1.WorkloadProfile, error) {
	wp := &prismv1alpha1.WorkloadProfile{}
	err := r.rc.Get().Namespace(namespace).Resource(workloadProfiles).Name(name).Do(ctx).Into(wp)
	return wp, err
}

func (r *restProfiles) Create(ctx context.Context, wp *prismv1alpha1.WorkloadProfile) error {
	return r.rc.Post().Namespace(wp.Namespace).Resource(workloadProfiles).Body(wp).Do(ctx).Into(wp)
}

func (r *restProfiles) UpdateStatus(ctx context.Context, wp *prismv1alpha1.WorkloadProfile) error {
	return r.rc.Put().Namespace(wp.Namespace).Resource(workloadProfiles).Name(wp.Name).SubResource("status").Body(wp).Do(ctx).Into(wp)
}
