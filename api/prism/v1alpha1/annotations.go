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

package v1alpha1

import (
	"fmt"
	"strings"
	"unicode/utf8"

	"k8s.io/apimachinery/pkg/util/validation"
)

// ProfileAnnotation on a ResourceClaim names the WorkloadProfile, in the
// claim's namespace, that the rewrite webhook rewrites the claim for and
// that the kubelet plugin writes a profiled run of it to. The webhook, the
// plugin, the controller's fleet view and prismctl all read it from here,
// through ProfileName.
const ProfileAnnotation = "prism.dev/profile"

// MaxShownProfileBytes is how much of an invalid ProfileAnnotation value an
// InvalidProfileError quotes.
const MaxShownProfileBytes = 64

// ProfileName returns the WorkloadProfile that annotations name with
// ProfileAnnotation: "" and nil when they name none (no annotation, or an
// empty one), and "" and an *InvalidProfileError when the value is not a
// WorkloadProfile's name.
//
// Every reader of the annotation goes through here. The value is the
// claim's author's, as long as the API's 256 KiB of annotations allow, and
// it reaches logs, Events, caches and API requests: only a name the API
// could hold goes on, and an invalid value is shown only as the error
// quotes it.
func ProfileName(annotations map[string]string) (string, error) {
	return ParseProfileName(annotations[ProfileAnnotation])
}

// ParseProfileName checks a ProfileAnnotation value, or a profile name
// read back from where an earlier reader kept it, as ProfileName does.
// A WorkloadProfile's name is a DNS subdomain (RFC 1123) of at most 253
// characters, in the annotated object's own namespace: there is no
// namespace/name form.
func ParseProfileName(value string) (string, error) {
	if value == "" {
		return "", nil
	}
	var reasons []string
	if len(value) > validation.DNS1123SubdomainMaxLength {
		// The pattern would say the same of the value's start; the length
		// alone is the reason, without matching 256 KiB.
		reasons = []string{validation.MaxLenError(validation.DNS1123SubdomainMaxLength)}
	} else {
		reasons = validation.IsDNS1123Subdomain(value)
	}
	if len(reasons) > 0 {
		return "", &InvalidProfileError{Start: strings.Clone(truncateUTF8(value, MaxShownProfileBytes)), Length: len(value), Reasons: reasons}
	}
	return value, nil
}

// InvalidProfileError is a ProfileAnnotation value that is not a
// WorkloadProfile's name. It holds a copy of the value's start, never the
// value, so that keeping or printing the error costs little whatever the
// value's size.
//
// +kubebuilder:object:generate=false
type InvalidProfileError struct {
	// Start is the value's first MaxShownProfileBytes bytes at most, cut
	// at a character boundary.
	Start string
	// Length is the value's length in bytes.
	Length int
	// Reasons say what the API's name validation found wrong.
	Reasons []string
}

// Shown is the value as messages show it: quoted, and where it was cut,
// followed by its length.
func (e *InvalidProfileError) Shown() string {
	if len(e.Start) == e.Length {
		return fmt.Sprintf("%q", e.Start)
	}
	return fmt.Sprintf("%q... (%d bytes)", e.Start, e.Length)
}

func (e *InvalidProfileError) Error() string {
	return fmt.Sprintf("%s %s is not a WorkloadProfile name: %s", ProfileAnnotation, e.Shown(), strings.Join(e.Reasons, "; "))
}

// truncateUTF8 shortens s to at most n bytes without splitting a UTF-8
// sequence.
func truncateUTF8(s string, n int) string {
	if len(s) <= n {
		return s
	}
	for n > 0 && !utf8.RuneStart(s[n]) {
		n--
	}
	return s[:n]
}
