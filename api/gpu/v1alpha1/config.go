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
	"bytes"
	"errors"
	"fmt"
	"regexp"
	"strings"

	"k8s.io/apimachinery/pkg/util/sets"
	"k8s.io/apimachinery/pkg/util/validation/field"
	"sigs.k8s.io/json"
)

const (
	// MaxParametersSize matches the API server's limit on opaque parameters;
	// anything larger cannot have come from a valid claim.
	MaxParametersSize = 10 * 1024

	// MaxMetrics bounds the profiler command line and the per-kernel replay
	// cost: every metric can add a replay pass.
	MaxMetrics = 64
	// MaxMetricNameLength is far above the longest ncu metric name.
	MaxMetricNameLength = 128
	// MinLaunchCount and MaxLaunchCount bound how many kernel launches are
	// profiled; each one is replayed several times, so large values stall
	// the workload.
	MinLaunchCount = 1
	MaxLaunchCount = 1000
	// MaxKernelFilterLength bounds the kernel filter.
	MaxKernelFilterLength = 256

	// KernelFilterRegexPrefix selects regular expression matching, as on the
	// ncu command line.
	KernelFilterRegexPrefix = "regex:"
)

var (
	metricNameRE = regexp.MustCompile(`^[a-z0-9_.]+$`)

	// The filter is passed to ncu as an argument. The character set is kept
	// free of everything a shell or glob would interpret (quotes, $, `, \,
	// ;, &, |, <, >, parentheses, brackets, *, ?, ~, #, =, whitespace), so
	// that even a careless consumer that goes through a shell cannot be
	// injected, and the first character may not be '-' so that the value can
	// never be taken for an option. The price is that only a small regex
	// subset (., + and literal text) is expressible.
	kernelFilterBodyRE = regexp.MustCompile(`^[A-Za-z0-9_.:+][A-Za-z0-9_.:+-]*$`)

	supportedStrategies = sets.New(ExclusiveSharing, TimeSlicingSharing)
	supportedIntervals  = sets.New(DefaultTimeSlice, ShortTimeSlice, MediumTimeSlice, LongTimeSlice)
	supportedSets       = sets.New(BasicProfilingSet, DetailedProfilingSet, FullProfilingSet, RooflineProfilingSet)
)

// Default returns the configuration that applies when a claim carries no
// GpuConfig: an exclusive GPU, no profiling.
func Default() *GpuConfig {
	c := &GpuConfig{}
	c.SetDefaults()
	return c
}

// SetDefaults fills in unset fields. It is idempotent.
func (c *GpuConfig) SetDefaults() {
	c.APIVersion = SchemeGroupVersion.String()
	c.Kind = GpuConfigKind

	if c.Sharing == nil {
		c.Sharing = &GpuSharing{}
	}
	if c.Sharing.Strategy == "" {
		c.Sharing.Strategy = ExclusiveSharing
	}
	if c.Sharing.Strategy == TimeSlicingSharing && c.Sharing.TimeSlicing == nil {
		c.Sharing.TimeSlicing = &TimeSlicingConfig{}
	}
	if ts := c.Sharing.TimeSlicing; ts != nil && ts.Interval == "" {
		ts.Interval = DefaultTimeSlice
	}

	if p := c.Profiling; p != nil {
		// "metrics: []" and an absent list mean the same; normalising keeps
		// a decoded config equal to its own re-encoding.
		if len(p.Metrics) == 0 {
			p.Metrics = nil
		}
		if p.Enabled {
			if p.Set == "" && len(p.Metrics) == 0 {
				p.Set = BasicProfilingSet
			}
			if p.LaunchCount == nil {
				one := int32(MinLaunchCount)
				p.LaunchCount = &one
			}
		}
	}
}

// Validate checks a configuration. Field paths are relative to the opaque
// parameters object, which is what the user wrote.
func (c *GpuConfig) Validate() error {
	var errs field.ErrorList
	if c.APIVersion != SchemeGroupVersion.String() {
		errs = append(errs, field.NotSupported(field.NewPath("apiVersion"), c.APIVersion, []string{SchemeGroupVersion.String()}))
	}
	if c.Kind != GpuConfigKind {
		errs = append(errs, field.NotSupported(field.NewPath("kind"), c.Kind, []string{GpuConfigKind}))
	}
	errs = append(errs, validateSharing(c.Sharing, field.NewPath("sharing"))...)
	errs = append(errs, validateProfiling(c.Profiling, field.NewPath("profiling"))...)
	return errs.ToAggregate()
}

func validateSharing(s *GpuSharing, path *field.Path) field.ErrorList {
	var errs field.ErrorList
	if s == nil {
		return nil
	}
	if !supportedStrategies.Has(s.Strategy) {
		errs = append(errs, field.NotSupported(path.Child("strategy"), s.Strategy, sets.List(supportedStrategies)))
	}
	if s.TimeSlicing != nil {
		tsPath := path.Child("timeSlicing")
		if s.Strategy != TimeSlicingSharing {
			errs = append(errs, field.Forbidden(tsPath, fmt.Sprintf("may only be set when strategy is %s", TimeSlicingSharing)))
		}
		if !supportedIntervals.Has(s.TimeSlicing.Interval) {
			errs = append(errs, field.NotSupported(tsPath.Child("interval"), s.TimeSlicing.Interval, sets.List(supportedIntervals)))
		}
	}
	if l := s.ComputeLimitPercent; l != nil {
		limitPath := path.Child("computeLimitPercent")
		switch {
		case *l < 1 || *l > MaxComputePercent:
			errs = append(errs, field.Invalid(limitPath, *l, fmt.Sprintf("must be between 1 and %d", MaxComputePercent)))
		case s.Strategy.ShareConflict() != nil:
			errs = append(errs, field.Forbidden(limitPath, fmt.Sprintf("is a share's limit, and a share cannot take strategy %s", s.Strategy)))
		}
	}
	return errs
}

func validateProfiling(p *GpuProfiling, path *field.Path) field.ErrorList {
	var errs field.ErrorList
	if p == nil {
		return nil
	}
	// Values are checked even while profiling is disabled: a config that is
	// only switched off must still be safe to switch on.
	if p.Set != "" && len(p.Metrics) > 0 {
		errs = append(errs, field.Invalid(path.Child("metrics"), p.Metrics, "may not be combined with set"))
	}
	if p.Set != "" && !supportedSets.Has(p.Set) {
		errs = append(errs, field.NotSupported(path.Child("set"), p.Set, sets.List(supportedSets)))
	}
	if len(p.Metrics) > MaxMetrics {
		errs = append(errs, field.TooMany(path.Child("metrics"), len(p.Metrics), MaxMetrics))
	}
	seen := sets.New[string]()
	for i, m := range p.Metrics {
		mPath := path.Child("metrics").Index(i)
		switch {
		case len(m) > MaxMetricNameLength:
			errs = append(errs, field.TooLong(mPath, m, MaxMetricNameLength))
		case !metricNameRE.MatchString(m):
			errs = append(errs, field.Invalid(mPath, m, "must consist of lower case letters, digits, '_' and '.'"))
		case seen.Has(m):
			errs = append(errs, field.Duplicate(mPath, m))
		}
		seen.Insert(m)
	}
	if p.LaunchCount != nil && (*p.LaunchCount < MinLaunchCount || *p.LaunchCount > MaxLaunchCount) {
		errs = append(errs, field.Invalid(path.Child("launchCount"), *p.LaunchCount,
			fmt.Sprintf("must be between %d and %d", MinLaunchCount, MaxLaunchCount)))
	}
	if p.KernelFilter != "" {
		kfPath := path.Child("kernelFilter")
		body := strings.TrimPrefix(p.KernelFilter, KernelFilterRegexPrefix)
		switch {
		case len(p.KernelFilter) > MaxKernelFilterLength:
			errs = append(errs, field.TooLong(kfPath, p.KernelFilter, MaxKernelFilterLength))
		case !kernelFilterBodyRE.MatchString(body):
			errs = append(errs, field.Invalid(kfPath, p.KernelFilter,
				"must be a kernel name, optionally prefixed with \"regex:\", using only letters, digits and '_', '.', ':', '+', '-', and not starting with '-'"))
		}
	}
	return errs
}

// Decode strictly decodes, defaults and validates opaque parameters. Unknown
// or duplicate fields, a foreign apiVersion or kind and invalid values are
// all errors, and the messages are meant to be shown to the claim's author.
func Decode(raw []byte) (*GpuConfig, error) {
	if len(raw) > MaxParametersSize {
		return nil, fmt.Errorf("GpuConfig is %d bytes, more than the limit of %d", len(raw), MaxParametersSize)
	}
	if len(bytes.TrimSpace(raw)) == 0 {
		return nil, errors.New("GpuConfig is empty")
	}

	// The type is checked first so that a config meant for another driver or
	// version gets that explanation instead of a list of unknown fields.
	var tm struct {
		APIVersion string `json:"apiVersion"`
		Kind       string `json:"kind"`
	}
	if err := json.UnmarshalCaseSensitivePreserveInts(raw, &tm); err != nil {
		return nil, fmt.Errorf("GpuConfig is not a JSON object: %w", err)
	}
	if tm.APIVersion != SchemeGroupVersion.String() {
		return nil, fmt.Errorf("unsupported apiVersion %q: expected %q", tm.APIVersion, SchemeGroupVersion.String())
	}
	if tm.Kind != GpuConfigKind {
		return nil, fmt.Errorf("unsupported kind %q for apiVersion %s: expected %q", tm.Kind, tm.APIVersion, GpuConfigKind)
	}

	cfg := &GpuConfig{}
	strictErrs, err := json.UnmarshalStrict(raw, cfg)
	if err != nil {
		return nil, fmt.Errorf("decoding GpuConfig: %w", err)
	}
	if len(strictErrs) > 0 {
		msgs := make([]string, 0, len(strictErrs))
		for _, e := range strictErrs {
			msgs = append(msgs, e.Error())
		}
		return nil, fmt.Errorf("decoding GpuConfig: %s", strings.Join(msgs, ", "))
	}

	cfg.SetDefaults()
	if err := cfg.Validate(); err != nil {
		return nil, fmt.Errorf("invalid GpuConfig: %w", err)
	}
	return cfg, nil
}
