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

// Package profilewrites is the validating webhook for the kubelet plugin's
// WorkloadProfile writes, and the index of which node runs claims of which
// profile that it checks them against.
package profilewrites

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"

	admissionv1 "k8s.io/api/admission/v1"
	"k8s.io/apimachinery/pkg/api/equality"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/klog/v2"

	prismv1alpha1 "github.com/prismgpu/prism/api/prism/v1alpha1"
	"github.com/prismgpu/prism/internal/controller/webhook"
)

// NodeNameExtra is the user extra a pod's bound ServiceAccount token
// carries: the node the pod runs on.
const NodeNameExtra = "authentication.kubernetes.io/node-name"

// New returns the validating webhook for the kubelet
// plugin's WorkloadProfile writes. A plugin may create a profile with an
// empty spec and write its status, and only for a profile that a claim on
// its own node names: a compromised node can then misreport the workloads
// it runs, but not steer the rewrite of anyone else's claims. synced says
// when claims has seen every claim (nil: from the start); a write it does
// not find writable before waits for it.
func New(claims *ProfileClaims, synced *webhook.Synced, metrics *webhook.Metrics) (http.Handler, error) {
	if claims == nil || metrics == nil {
		return nil, errors.New("profile write check needs the claims and metrics")
	}
	c := &profileWriteCheck{claims: claims, synced: synced, metrics: metrics}
	return webhook.ReviewHandler(c.review, webhook.Deny), nil
}

type profileWriteCheck struct {
	claims  *ProfileClaims
	synced  *webhook.Synced
	metrics *webhook.Metrics
}

// notSyncedRetry is when the plugin's client may try a write again that
// was denied because the claims had not synced; client-go retries it
// itself after that long, and the plugin's publish queue retries it
// besides.
const notSyncedRetry = 1 // second

func (c *profileWriteCheck) review(ctx context.Context, req *admissionv1.AdmissionRequest) *admissionv1.AdmissionResponse {
	reason, err := c.deny(ctx, req)
	if err != nil {
		klog.FromContext(ctx).Info("Denying WorkloadProfile write by the kubelet plugin until the controller has read every ResourceClaim", "user", req.UserInfo.Username, "err", err)
		return &admissionv1.AdmissionResponse{Allowed: false, Result: &metav1.Status{
			Status: metav1.StatusFailure, Code: http.StatusServiceUnavailable, Reason: metav1.StatusReasonServiceUnavailable,
			Message: "prism-controller is starting and cannot yet tell which nodes run claims of this profile; retry: " + err.Error(),
			Details: &metav1.StatusDetails{RetryAfterSeconds: notSyncedRetry},
		}}
	}
	if reason == "" {
		return webhook.Allowed()
	}
	c.metrics.Denied("WorkloadProfile/plugin")
	klog.FromContext(ctx).Info("Denying WorkloadProfile write by the kubelet plugin", "user", req.UserInfo.Username, "reason", reason)
	status := apierrors.NewForbidden(prismv1alpha1.GroupVersion.WithResource("workloadprofiles").GroupResource(), req.Name, errors.New(reason)).Status()
	return &admissionv1.AdmissionResponse{Allowed: false, Result: &status}
}

// deny returns why a write is refused, or "" where it is not; an error
// where the claims had not synced by the review's deadline, so that
// neither can be told.
func (c *profileWriteCheck) deny(ctx context.Context, req *admissionv1.AdmissionRequest) (string, error) {
	nodes := req.UserInfo.Extra[NodeNameExtra]
	if len(nodes) != 1 || nodes[0] == "" {
		return "the request carries no node name: the Prism kubelet plugin must use the bound ServiceAccount token of a pod scheduled to a node", nil
	}
	node := nodes[0]
	switch {
	case req.Operation == admissionv1.Create && req.SubResource == "":
		wp := &prismv1alpha1.WorkloadProfile{}
		if err := json.Unmarshal(req.Object.Raw, wp); err != nil {
			return fmt.Sprintf("decoding WorkloadProfile: %v", err), nil
		}
		if !equality.Semantic.DeepEqual(wp.Spec, prismv1alpha1.WorkloadProfileSpec{}) {
			return "the kubelet plugin may only create WorkloadProfiles with an empty spec; the spec is the user's", nil
		}
	case req.Operation == admissionv1.Update && req.SubResource == "status":
	default:
		return fmt.Sprintf("the kubelet plugin may only create WorkloadProfiles and update their status, not %s %s", req.Operation, subresourceOrObject(req.SubResource)), nil
	}
	// Before the claims have synced, only a yes is an answer: the index
	// only grows while the informer lists the claims, and a claim that
	// leaves a node keeps it writable for claimMemory, so a node writable
	// now is writable in the whole index. A no waits for the whole index.
	writable := c.claims.Writable(req.Namespace, req.Name, node)
	if !writable && !c.synced.HasSynced() {
		if err := webhook.WaitSynced(ctx, c.synced); err != nil {
			return "", err
		}
		writable = c.claims.Writable(req.Namespace, req.Name, node)
	}
	if !writable {
		return fmt.Sprintf("node %s runs no ResourceClaim in namespace %s annotated %s=%s", node, req.Namespace, prismv1alpha1.ProfileAnnotation, req.Name), nil
	}
	return "", nil
}

func subresourceOrObject(sub string) string {
	if sub == "" {
		return "the object"
	}
	return "the " + sub + " subresource"
}
