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

// Package validate is the validating webhook for GpuConfig parameters (and
// their sharing strategy where a request asks for a share of a GPU) and
// the prism.dev/profile annotation in ResourceClaims and
// ResourceClaimTemplates and for WorkloadProfile specs, with warnings for a
// prism.dev/profile annotation where nothing reads it.
package validate

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"regexp"

	admissionv1 "k8s.io/api/admission/v1"
	resourceapi "k8s.io/api/resource/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/util/sets"
	"k8s.io/apimachinery/pkg/util/validation/field"
	"k8s.io/klog/v2"

	gpuv1alpha1 "github.com/prismgpu/prism/api/gpu/v1alpha1"
	prismv1alpha1 "github.com/prismgpu/prism/api/prism/v1alpha1"
	"github.com/prismgpu/prism/internal/controller/webhook"
	"github.com/prismgpu/prism/internal/explain"
	"github.com/prismgpu/prism/pkg/rewrite"
)

// MaxProfileMinMemory bounds spec.minMemory. No GPU comes close; a larger
// value is a unit mistake (1T instead of 1Ti is fine, 1P is not).
var MaxProfileMinMemory = resource.MustParse("1Ti")

var (
	claimGK         = schema.GroupKind{Group: resourceapi.GroupName, Kind: "ResourceClaim"}
	claimTemplateGK = schema.GroupKind{Group: resourceapi.GroupName, Kind: "ResourceClaimTemplate"}
	podGK           = schema.GroupKind{Kind: "Pod"}
	profileGK       = prismv1alpha1.GroupVersion.WithKind("WorkloadProfile").GroupKind()

	// computeCapabilityRE matches the CRD's pattern; it is checked here too
	// because a CRD installed from an older manifest may lack it.
	computeCapabilityRE = regexp.MustCompile(prismv1alpha1.ComputeCapabilityPattern)

	policies = sets.New(string(prismv1alpha1.PolicyPerformance), string(prismv1alpha1.PolicyEconomy), string(prismv1alpha1.PolicyLoadAware))
	sharings = sets.New(string(prismv1alpha1.SharingExclusive), string(prismv1alpha1.SharingFractional))
)

// New returns the validating webhook for GpuConfig parameters and the
// prism.dev/profile annotation in ResourceClaims and ResourceClaimTemplates,
// and for WorkloadProfile specs. Catching a bad GpuConfig here turns a pod
// stuck in ContainerCreating into an error at kubectl apply, and a profile
// name that is no name into the same error rather than a claim that is
// neither rewritten nor profiled. It also warns, without denying, about a
// prism.dev/profile annotation where nothing reads it: on a template's own
// metadata or on a Pod.
func New(metrics *webhook.Metrics) (http.Handler, error) {
	if metrics == nil {
		return nil, errors.New("validator needs metrics")
	}
	v := &validator{metrics: metrics}
	return webhook.ReviewHandler(v.review, webhook.Deny), nil
}

type validator struct {
	metrics *webhook.Metrics
}

func (v *validator) review(ctx context.Context, req *admissionv1.AdmissionRequest) *admissionv1.AdmissionResponse {
	if req.Operation != admissionv1.Create && req.Operation != admissionv1.Update {
		return webhook.Allowed()
	}
	gk := schema.GroupKind{Group: req.Kind.Group, Kind: req.Kind.Kind}
	var (
		errs     field.ErrorList
		warnings []string
		err      error
	)
	switch gk {
	case claimGK:
		claim := &resourceapi.ResourceClaim{}
		if err = json.Unmarshal(req.Object.Raw, claim); err == nil {
			errs = validateDeviceConfigs(claim.Spec.Devices.Config, field.NewPath("spec", "devices", "config"))
			errs = append(errs, validateShareStrategies(req, &claim.Spec, func(old *resourceapi.ResourceClaim) *resourceapi.ResourceClaimSpec { return &old.Spec },
				field.NewPath("spec", "devices", "config"))...)
			errs = append(errs, validateProfileAnnotation(req, claim.Annotations, func(old *resourceapi.ResourceClaim) map[string]string { return old.Annotations },
				field.NewPath("metadata", "annotations"))...)
		}
	case claimTemplateGK:
		tmpl := &resourceapi.ResourceClaimTemplate{}
		if err = json.Unmarshal(req.Object.Raw, tmpl); err == nil {
			errs = validateDeviceConfigs(tmpl.Spec.Spec.Devices.Config, field.NewPath("spec", "spec", "devices", "config"))
			errs = append(errs, validateShareStrategies(req, &tmpl.Spec.Spec, func(old *resourceapi.ResourceClaimTemplate) *resourceapi.ResourceClaimSpec { return &old.Spec.Spec },
				field.NewPath("spec", "spec", "devices", "config"))...)
			errs = append(errs, validateProfileAnnotation(req, tmpl.Spec.ObjectMeta.Annotations, func(old *resourceapi.ResourceClaimTemplate) map[string]string { return old.Spec.ObjectMeta.Annotations },
				field.NewPath("spec", "metadata", "annotations"))...)
			warnings = appendWarning(warnings, explain.MisplacedOnTemplate(tmpl))
		}
	case podGK:
		pod := &metav1.PartialObjectMetadata{}
		if err = json.Unmarshal(req.Object.Raw, pod); err == nil {
			warnings = appendWarning(warnings, explain.MisplacedOnPod(pod))
		}
	case profileGK:
		wp := &prismv1alpha1.WorkloadProfile{}
		if err = json.Unmarshal(req.Object.Raw, wp); err == nil {
			errs, warnings = validateProfileSpec(ctx, &wp.Spec, field.NewPath("spec"))
		}
	default:
		return webhook.Allowed()
	}
	if err != nil {
		// The API server decoded the object before us, so this is a
		// version skew in a field we do not look at. The kubelet plugin
		// still validates the config when it prepares the claim.
		klog.FromContext(ctx).Error(err, "Decoding object, admitting it without validation")
		return &admissionv1.AdmissionResponse{Allowed: true, Warnings: []string{"prism: object not validated: " + err.Error()}}
	}
	if len(errs) == 0 {
		return &admissionv1.AdmissionResponse{Allowed: true, Warnings: warnings}
	}
	v.metrics.Denied(gk.Kind)
	status := apierrors.NewInvalid(gk, req.Name, errs).Status()
	klog.FromContext(ctx).V(2).Info("Denying object", "message", status.Message)
	return &admissionv1.AdmissionResponse{Allowed: false, Result: &status, Warnings: warnings}
}

func appendWarning(warnings []string, w string) []string {
	if w == "" {
		return warnings
	}
	return append(warnings, "prism: "+w)
}

// validateDeviceConfigs decodes every opaque GpuConfig the way the kubelet
// plugin will.
func validateDeviceConfigs(configs []resourceapi.DeviceClaimConfiguration, path *field.Path) field.ErrorList {
	var errs field.ErrorList
	for i, c := range configs {
		if c.Opaque == nil || c.Opaque.Driver != gpuv1alpha1.DriverName {
			continue
		}
		p := path.Index(i).Child("opaque", "parameters")
		if _, err := gpuv1alpha1.Decode(c.Opaque.Parameters.Raw); err != nil {
			errs = append(errs, field.Invalid(p, field.OmitValueType{}, err.Error()))
		}
	}
	return errs
}

// validateProfileAnnotation refuses a prism.dev/profile that names no
// WorkloadProfile, where the claims read it: on a claim, and under a
// template's spec.metadata. The reason quotes at most 64 bytes of the
// value. An update is refused only where it changes the value: one that
// a claim already had (from before this check) must not keep its
// finalizers from being removed.
func validateProfileAnnotation[T any](req *admissionv1.AdmissionRequest, annotations map[string]string, oldAnnotations func(*T) map[string]string, path *field.Path) field.ErrorList {
	_, err := prismv1alpha1.ProfileName(annotations)
	if err == nil {
		return nil
	}
	if req.Operation == admissionv1.Update {
		old := new(T)
		if json.Unmarshal(req.OldObject.Raw, old) == nil && oldAnnotations(old)[prismv1alpha1.ProfileAnnotation] == annotations[prismv1alpha1.ProfileAnnotation] {
			return nil
		}
	}
	return field.ErrorList{field.Invalid(path.Key(prismv1alpha1.ProfileAnnotation), field.OmitValueType{}, err.Error())}
}

// validateProfileSpec checks what a user pins. Warnings are for specs that
// are valid but cannot be acted on, such as a memory floor above every
// GPU the rewrite knows.
func validateProfileSpec(ctx context.Context, spec *prismv1alpha1.WorkloadProfileSpec, path *field.Path) (field.ErrorList, []string) {
	var errs field.ErrorList
	if q := spec.MinMemory; q != nil {
		// Not q.Cmp: on "1E1111011110" it runs for minutes (see
		// BoundedValue).
		p := path.Child("minMemory")
		if q.Sign() <= 0 {
			errs = append(errs, field.Invalid(p, q.String(), "must be greater than zero"))
		} else if _, err := prismv1alpha1.BoundedValue(p, *q, MaxProfileMinMemory.Value()); err != nil {
			errs = append(errs, err)
		}
	}
	if cc := spec.MinComputeCapability; cc != "" && !computeCapabilityRE.MatchString(cc) {
		errs = append(errs, field.Invalid(path.Child("minComputeCapability"), cc, `must be "major.minor", for example "8.0"`))
	}
	if spec.Policy != "" && !policies.Has(string(spec.Policy)) {
		errs = append(errs, field.NotSupported(path.Child("policy"), spec.Policy, sets.List(policies)))
	}
	if spec.Sharing != "" && !sharings.Has(string(spec.Sharing)) {
		errs = append(errs, field.NotSupported(path.Child("sharing"), spec.Sharing, sets.List(sharings)))
	}
	if len(errs) > 0 {
		return errs, nil
	}
	// A dry run against a one-request claim finds floors the catalogue
	// cannot express, with pkg/rewrite's own wording.
	probe := &resourceapi.ResourceClaimSpec{Devices: resourceapi.DeviceClaim{Requests: []resourceapi.DeviceRequest{{
		Name:    "probe",
		Exactly: &resourceapi.ExactDeviceRequest{DeviceClassName: rewrite.DeviceClassName},
	}}}}
	_, _, err := rewrite.Rewrite(ctx, probe, rewrite.Profile{
		BoundType:            prismv1alpha1.BoundTypeMemoryBound,
		MinMemory:            spec.MinMemory,
		MinComputeCapability: spec.MinComputeCapability,
		Policy:               spec.Policy,
	})
	if err != nil {
		return nil, []string{fmt.Sprintf("claims that use this profile will not be rewritten: %v", err)}
	}
	return nil, nil
}
