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

// Command prismctl is the Prism command-line client.
package main

import (
	"context"
	"fmt"
	"os"
	"os/signal"

	"github.com/spf13/cobra"

	"github.com/prismgpu/prism/pkg/envflag"
	"github.com/prismgpu/prism/pkg/logging"
	"github.com/prismgpu/prism/pkg/prismctl/explaincmd"
	"github.com/prismgpu/prism/pkg/prismctl/getcmd"
	"github.com/prismgpu/prism/pkg/prismctl/profilecmd"
	"github.com/prismgpu/prism/pkg/prismctl/simulatecmd"
	"github.com/prismgpu/prism/pkg/version"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt)
	defer stop()
	logs := logging.NewOptions()
	root := &cobra.Command{
		Use:           "prismctl",
		Short:         "Prism GPU allocation client",
		Version:       version.Get().String(),
		SilenceUsage:  true,
		SilenceErrors: true,
		PersistentPreRunE: func(cmd *cobra.Command, _ []string) error {
			if err := envflag.Apply(cmd.Root().PersistentFlags(), os.LookupEnv); err != nil {
				return err
			}
			return logs.Apply()
		},
	}
	root.SetVersionTemplate("prismctl {{.Version}}\n")
	// client-go logs through klog: -v=6 shows every API call prismctl makes.
	logs.AddFlags(root.PersistentFlags())
	envflag.Bind(root.PersistentFlags(), "PRISM_", map[string]string{"v": "PRISM_VERBOSITY"})
	root.AddCommand(profilecmd.NewCommand(), explaincmd.NewCommand(), getcmd.NewCommand(), simulatecmd.NewCommand())
	if err := root.ExecuteContext(ctx); err != nil {
		fmt.Fprintln(os.Stderr, "prismctl:", err)
		os.Exit(1)
	}
}
