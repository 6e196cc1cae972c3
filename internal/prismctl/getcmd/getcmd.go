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

// Package getcmd implements `prismctl get gpus`: the fleet at a glance, one
// row per GPU with who holds it, from ResourceSlices and ResourceClaims.
package getcmd

import (
	"context"
	"fmt"
	"io"

	"github.com/spf13/cobra"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/client-go/kubernetes"

	gpuv1alpha1 "github.com/prismgpu/prism/api/gpu/v1alpha1"
	"github.com/prismgpu/prism/internal/explain"
	"github.com/prismgpu/prism/internal/prismctl/cmdgroup"
	"github.com/prismgpu/prism/internal/prismctl/kubeconfig"
)

// NewCommand returns the `get` command with its `gpus` subcommand.
func NewCommand() *cobra.Command {
	return kubeconfig.Command(kubeconfig.Clientset, newCommand)
}

// newCommand ignores the namespace newClient returns: GPUs are cluster-wide.
func newCommand(newClient kubeconfig.ClientFunc[kubernetes.Interface]) *cobra.Command {
	gpus := &cobra.Command{
		Use:   "gpus",
		Short: "List every GPU with its node, model, speed, memory, health taint and holders",
		Long: `Lists every GPU the ` + gpuv1alpha1.DriverName + ` driver publishes, one row per GPU:
its node, product, bandwidth class, memory bandwidth, FP32 peak, memory,
health taint, and the claims it is allocated to (the whole GPU, or their
share of its memory) with the pods those claims are reserved for. A GPU in
MIG mode is one row: MODE says how many of its memory slices held devices
occupy and how many of its partitions are still free, and HELD BY names
each partition held ("3g.20gb@0" is a 3g.20gb at memory slice 0).

Built from ResourceSlices and ResourceClaims alone; it needs list access to
both, cluster-wide.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			cs, _, err := newClient()
			if err != nil {
				return err
			}
			return listGPUs(cmd.Context(), cmd.OutOrStdout(), cs)
		},
	}
	return cmdgroup.New("get", "Display Prism resources", gpus)
}

func listGPUs(ctx context.Context, out io.Writer, cs kubernetes.Interface) error {
	slices, err := cs.ResourceV1().ResourceSlices().List(ctx, metav1.ListOptions{
		FieldSelector: fields.OneTermEqualSelector("spec.driver", gpuv1alpha1.DriverName).String(),
	})
	if err != nil {
		return fmt.Errorf("listing ResourceSlices of %s: %w", gpuv1alpha1.DriverName, err)
	}
	claims, err := cs.ResourceV1().ResourceClaims("").List(ctx, metav1.ListOptions{})
	if err != nil {
		return fmt.Errorf("listing ResourceClaims: %w", err)
	}
	gpus := explain.Fleet(slices.Items, explain.Holders(claims.Items))
	if len(gpus) == 0 {
		_, err := fmt.Fprintf(out, "No GPUs published by %s.\n", gpuv1alpha1.DriverName)
		return err
	}
	return explain.WriteFleet(out, gpus)
}
