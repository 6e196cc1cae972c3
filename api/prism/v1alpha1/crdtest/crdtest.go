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

// Package crdtest checks WorkloadProfiles against the CRD manifest under
// deployments/crds the way the API server does, so that a test or a fuzz
// target fails on an object the API server would refuse to store. Only
// tests import it.
package crdtest

import (
	"context"
	"encoding/json"
	"os"
	"path/filepath"
	"runtime"
	"testing"

	"k8s.io/apiextensions-apiserver/pkg/apis/apiextensions"
	apiextensionsv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"
	structuralschema "k8s.io/apiextensions-apiserver/pkg/apiserver/schema"
	"k8s.io/apiextensions-apiserver/pkg/apiserver/schema/listtype"
	schemaobjectmeta "k8s.io/apiextensions-apiserver/pkg/apiserver/schema/objectmeta"
	"k8s.io/apiextensions-apiserver/pkg/apiserver/validation"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	utiljson "k8s.io/apimachinery/pkg/util/json"
	"k8s.io/apimachinery/pkg/util/validation/field"
	"sigs.k8s.io/yaml"

	"github.com/prismgpu/prism/api/prism/v1alpha1"
)

// Path is the generated manifest, found from this file so that the tests
// of every package read the same one.
var Path = func() string {
	_, file, _, _ := runtime.Caller(0)
	return filepath.Join(filepath.Dir(file), "..", "..", "..", "..", "deployments", "crds", "prism.dev_workloadprofiles.yaml")
}()

// Load reads the manifest at Path, refusing fields it does not know.
func Load(tb testing.TB) *apiextensionsv1.CustomResourceDefinition {
	tb.Helper()
	b, err := os.ReadFile(Path)
	if err != nil {
		tb.Fatal(err)
	}
	crd := &apiextensionsv1.CustomResourceDefinition{}
	if err := yaml.UnmarshalStrict(b, crd); err != nil {
		tb.Fatal(err)
	}
	if len(crd.Spec.Versions) != 1 || crd.Spec.Versions[0].Schema == nil {
		tb.Fatalf("%s: want one version with a schema", Path)
	}
	return crd
}

// Validator checks objects against one version's schema as the API server
// does before it stores a custom resource: the OpenAPI schema (types,
// maxLength, pattern, enum, minimum, maxItems ...), the metadata of the
// object, and the list types (map keys and set items unique).
type Validator struct {
	schema     validation.SchemaValidator
	structural *structuralschema.Structural
}

// NewValidator returns a Validator for the manifest at Path. It fails the
// test if the schema holds CEL rules (x-kubernetes-validations), which
// this Validator does not run: it would then admit what the API server
// refuses.
func NewValidator(tb testing.TB) *Validator {
	tb.Helper()
	return NewValidatorFor(tb, Load(tb))
}

// NewValidatorFor returns a Validator for crd's only version.
func NewValidatorFor(tb testing.TB, crd *apiextensionsv1.CustomResourceDefinition) *Validator {
	tb.Helper()
	internal := &apiextensions.JSONSchemaProps{}
	if err := apiextensionsv1.Convert_v1_JSONSchemaProps_To_apiextensions_JSONSchemaProps(crd.Spec.Versions[0].Schema.OpenAPIV3Schema, internal, nil); err != nil {
		tb.Fatal(err)
	}
	schema, _, err := validation.NewSchemaValidator(internal)
	if err != nil {
		tb.Fatal(err)
	}
	structural, err := structuralschema.NewStructural(internal)
	if err != nil {
		tb.Fatal(err)
	}
	hasRules := false
	visitor := structuralschema.Visitor{
		Structural: func(s *structuralschema.Structural) bool {
			hasRules = hasRules || len(s.XValidations) > 0
			return false
		},
		NestedValueValidation: func(vv *structuralschema.NestedValueValidation) bool {
			hasRules = hasRules || len(vv.XValidations) > 0
			return false
		},
	}
	visitor.Visit(structural)
	if hasRules {
		tb.Fatal("the CRD has x-kubernetes-validations rules, which crdtest does not run yet: add the CEL validator to Validate")
	}
	return &Validator{schema: schema, structural: structural}
}

// Validate returns what the API server would refuse in obj, an object as
// it decodes JSON (numbers that are integers as int64).
func (v *Validator) Validate(obj map[string]any) field.ErrorList {
	errs := validation.ValidateCustomResource(nil, obj, v.schema)
	errs = append(errs, schemaobjectmeta.Validate(context.Background(), nil, obj, v.structural, false)...)
	return append(errs, listtype.ValidateListSetsAndMaps(nil, v.structural, obj)...)
}

// ValidateProfile validates wp as the API server would receive it: in
// JSON, with its apiVersion and kind set.
func (v *Validator) ValidateProfile(tb testing.TB, wp *v1alpha1.WorkloadProfile) field.ErrorList {
	tb.Helper()
	wp = wp.DeepCopy()
	wp.TypeMeta = metav1.TypeMeta{APIVersion: v1alpha1.GroupVersion.String(), Kind: "WorkloadProfile"}
	b, err := json.Marshal(wp)
	if err != nil {
		tb.Fatal(err)
	}
	// As the API server decodes: integers stay int64, where encoding/json
	// would make them float64.
	var obj map[string]any
	if err := utiljson.Unmarshal(b, &obj); err != nil {
		tb.Fatal(err)
	}
	return v.Validate(obj)
}

// ValidateStatus validates st as the status of a WorkloadProfile ml/w.
func (v *Validator) ValidateStatus(tb testing.TB, st v1alpha1.WorkloadProfileStatus) field.ErrorList {
	tb.Helper()
	return v.ValidateProfile(tb, &v1alpha1.WorkloadProfile{ObjectMeta: metav1.ObjectMeta{Namespace: "ml", Name: "w"}, Status: st})
}
