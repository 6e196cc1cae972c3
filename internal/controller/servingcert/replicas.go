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

package servingcert

import (
	"context"
	"fmt"

	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/sets"
	"k8s.io/client-go/kubernetes"
)

// ServiceReplicas returns a CABundleInjector.Replicas that lists the pods
// behind the webhook Service from its EndpointSlices. They hold starting
// and terminating pods too, which is what the bundle must trust: any pod
// the API server may still reach.
func ServiceReplicas(cs kubernetes.Interface, namespace, service string) func(context.Context) (sets.Set[string], error) {
	return func(ctx context.Context) (sets.Set[string], error) {
		list, err := cs.DiscoveryV1().EndpointSlices(namespace).List(ctx, metav1.ListOptions{LabelSelector: discoveryv1.LabelServiceName + "=" + service})
		if err != nil {
			return nil, fmt.Errorf("listing EndpointSlices of Service %s/%s: %w", namespace, service, err)
		}
		pods := sets.New[string]()
		for _, slice := range list.Items {
			for _, ep := range slice.Endpoints {
				if ep.TargetRef != nil && ep.TargetRef.Kind == "Pod" {
					pods.Insert(ep.TargetRef.Name)
				}
			}
		}
		return pods, nil
	}
}
