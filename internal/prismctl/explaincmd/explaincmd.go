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

// Package explaincmd implements `prismctl explain claim`: how every GPU in
// the cluster fares against a ResourceClaim's selectors, and why.
package explaincmd

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"

	gpuv1alpha1 "github.com/prismgpu/prism/api/gpu/v1alpha1"
	prismv1alpha1 "github.com/prismgpu/prism/api/prism/v1alpha1"

	"github.com/spf13/cobra"
	resourceapi "k8s.io/api/resource/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apimachinery/pkg/util/sets"
	"k8s.io/client-go/kubernetes"

	"github.com/prismgpu/prism/internal/explain"
	"github.com/prismgpu/prism/internal/prismctl/cmdgroup"
	"github.com/prismgpu/prism/internal/prismctl/kubeconfig"
	"github.com/prismgpu/prism/pkg/rewrite"
)

// NewCommand returns the `explain` command with its `claim` subcommand.
func NewCommand() *cobra.Command {
	return kubeconfig.Command(kubeconfig.Clientset, newCommand)
}

func newCommand(newClient kubeconfig.ClientFunc[kubernetes.Interface]) *cobra.Command {
	var namespace, output string
	var wide bool
	claim := &cobra.Command{
		Use:   "claim NAME",
		Short: "Show which GPUs satisfy a ResourceClaim, and which selector rules out the others",
		Long: `Evaluates the claim's selectors (those of its device class first, then its
own; for a prioritized list each alternative in order) against every device
published by the ` + gpuv1alpha1.DriverName + ` driver, with the CEL library the
scheduler uses. The device the scheduler allocated is marked with "*".
HELD BY names the other claims a device is allocated to, whole or with
their share of its memory. The claim's prism.dev/rewrite annotation is
spelled out above the table; -o json prints it as JSON instead, and
nothing else.

A matching device that is free may still sit on a node the pod cannot use,
or lack the capacity left for a share.`,
		Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			if output != "text" && output != "json" {
				return fmt.Errorf("--output must be text or json, not %q", output)
			}
			cs, defaultNS, err := newClient()
			if err != nil {
				return err
			}
			ns := namespace
			if ns == "" {
				ns = defaultNS
			}
			if ns == "" {
				ns = "default"
			}
			if output == "json" {
				return writePlan(cmd.Context(), cmd.OutOrStdout(), cs, ns, args[0])
			}
			return run(cmd.Context(), cmd.OutOrStdout(), cs, ns, args[0], wide)
		},
	}
	claim.Flags().StringVarP(&namespace, "namespace", "n", "", "Namespace of the claim (default: the kubeconfig's).")
	claim.Flags().BoolVar(&wide, "wide", false, "Print selectors in verdicts in full.")
	claim.Flags().StringVarP(&output, "output", "o", "text", "Text for the plan in words and the verdict table, or json for the rewrite plan alone.")
	return cmdgroup.New("explain", "Explain device allocation decisions", claim)
}

func run(ctx context.Context, out io.Writer, cs kubernetes.Interface, namespace, name string, wide bool) error {
	claim, err := cs.ResourceV1().ResourceClaims(namespace).Get(ctx, name, metav1.GetOptions{})
	if err != nil {
		return fmt.Errorf("getting ResourceClaim %s/%s: %w", namespace, name, err)
	}
	slices, err := cs.ResourceV1().ResourceSlices().List(ctx, metav1.ListOptions{
		FieldSelector: fields.OneTermEqualSelector("spec.driver", gpuv1alpha1.DriverName).String(),
	})
	if err != nil {
		return fmt.Errorf("listing ResourceSlices of %s: %w", gpuv1alpha1.DriverName, err)
	}
	classes, err := deviceClasses(ctx, cs, claim)
	if err != nil {
		return err
	}
	// Who holds which device needs every claim; a user who may not list
	// them all still gets the verdicts.
	var holders map[explain.DeviceID][]explain.Holder
	claims, err := cs.ResourceV1().ResourceClaims("").List(ctx, metav1.ListOptions{})
	if err != nil {
		fmt.Fprintf(out, "Note:     holders unknown, listing ResourceClaims: %v\n", err)
	} else {
		holders = explain.Holders(claims.Items)
	}

	fmt.Fprintf(out, "Claim:    %s/%s\n", claim.Namespace, claim.Name)
	switch p, err := prismv1alpha1.ProfileName(claim.Annotations); {
	case err != nil:
		fmt.Fprintf(out, "Profile:  none, %v\n", err)
	case p != "":
		fmt.Fprintf(out, "Profile:  %s\n", p)
	default:
		for _, note := range misplacedProfile(ctx, cs, claim) {
			fmt.Fprintf(out, "Note:     %s\n", note)
		}
	}
	if plan := claim.Annotations[rewrite.AnnotationKey]; plan != "" {
		for _, n := range explain.PlanNotes(plan) {
			fmt.Fprintf(out, "%-9s %s\n", n.Label+":", n.Text)
		}
	}
	rows := explain.Explain(ctx, claim, slices.Items, classes, holders)
	if claim.Status.Allocation == nil {
		fmt.Fprintln(out, "Allocated: not yet")
	}
	// A partition is named by its profile and where it sits, which the
	// device name only hints at.
	for _, r := range rows {
		if r.Allocated != "" && r.Partition != "" {
			fmt.Fprintf(out, "Allocated: %s: MIG partition %s of %s on %s (%s)\n", r.Allocated, r.Partition, r.Product, r.Node, r.Device)
		}
	}
	fmt.Fprintln(out)
	if len(rows) == 0 {
		_, err := fmt.Fprintf(out, "No devices published by %s.\n", gpuv1alpha1.DriverName)
		return err
	}
	return explain.WriteTable(out, rows, wide)
}

// writePlan prints the claim's rewrite plan, its prism.dev/rewrite
// annotation, as indented JSON.
func writePlan(ctx context.Context, out io.Writer, cs kubernetes.Interface, namespace, name string) error {
	claim, err := cs.ResourceV1().ResourceClaims(namespace).Get(ctx, name, metav1.GetOptions{})
	if err != nil {
		return fmt.Errorf("getting ResourceClaim %s/%s: %w", namespace, name, err)
	}
	plan, ok := claim.Annotations[rewrite.AnnotationKey]
	if !ok {
		return fmt.Errorf("ResourceClaim %s/%s has no %s annotation: the webhook did not rewrite it", namespace, name, rewrite.AnnotationKey)
	}
	var buf bytes.Buffer
	if err := json.Indent(&buf, []byte(plan), "", "  "); err != nil {
		return fmt.Errorf("%s annotation of ResourceClaim %s/%s is not JSON: %w", rewrite.AnnotationKey, namespace, name, err)
	}
	buf.WriteByte('\n')
	_, err = buf.WriteTo(out)
	return err
}

// podClaimNameAnnotation on a claim made from a template names the pod's
// entry in spec.resourceClaims it was made for.
const podClaimNameAnnotation = "resource.kubernetes.io/pod-claim-name"

// misplacedProfile looks for a profile annotation where it does nothing,
// on the claim's pod or the template the claim was made from, and says so:
// the usual answer to "why was my claim not rewritten?". Lookups that fail
// leave nothing to say.
func misplacedProfile(ctx context.Context, cs kubernetes.Interface, claim *resourceapi.ResourceClaim) []string {
	owner := metav1.GetControllerOf(claim)
	if owner == nil || owner.Kind != "Pod" {
		return nil
	}
	pod, err := cs.CoreV1().Pods(claim.Namespace).Get(ctx, owner.Name, metav1.GetOptions{})
	if err != nil {
		return nil
	}
	var notes []string
	if note := explain.MisplacedOnPod(pod); note != "" {
		notes = append(notes, note)
	}
	for _, pc := range pod.Spec.ResourceClaims {
		if pc.Name != claim.Annotations[podClaimNameAnnotation] || pc.ResourceClaimTemplateName == nil {
			continue
		}
		tmpl, err := cs.ResourceV1().ResourceClaimTemplates(claim.Namespace).Get(ctx, *pc.ResourceClaimTemplateName, metav1.GetOptions{})
		if err != nil {
			break
		}
		if note := explain.MisplacedOnTemplate(tmpl); note != "" {
			notes = append(notes, note)
		}
	}
	return notes
}

// deviceClasses gets every class the claim refers to. A class that does
// not exist is left out; Explain reports it per device.
func deviceClasses(ctx context.Context, cs kubernetes.Interface, claim *resourceapi.ResourceClaim) ([]resourceapi.DeviceClass, error) {
	names := sets.New[string]()
	for _, r := range claim.Spec.Devices.Requests {
		if r.Exactly != nil {
			names.Insert(r.Exactly.DeviceClassName)
		}
		for _, s := range r.FirstAvailable {
			names.Insert(s.DeviceClassName)
		}
	}
	var out []resourceapi.DeviceClass
	for _, n := range sets.List(names) {
		c, err := cs.ResourceV1().DeviceClasses().Get(ctx, n, metav1.GetOptions{})
		switch {
		case apierrors.IsNotFound(err):
			continue
		case err != nil:
			return nil, fmt.Errorf("getting DeviceClass %s: %w", n, err)
		}
		out = append(out, *c)
	}
	return out, nil
}
