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
	"flag"
	"fmt"
	"os"
	"os/signal"

	"github.com/spf13/cobra"
	"github.com/spf13/pflag"
	"k8s.io/klog/v2"

	"github.com/prismgpu/prism/internal/envflag"
	"github.com/prismgpu/prism/internal/prismctl/explaincmd"
	"github.com/prismgpu/prism/internal/prismctl/getcmd"
	"github.com/prismgpu/prism/internal/prismctl/profilecmd"
	"github.com/prismgpu/prism/internal/prismctl/simulatecmd"
	"github.com/prismgpu/prism/internal/version"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt)
	defer stop()
	if err := newRootCommand().ExecuteContext(ctx); err != nil {
		fmt.Fprintln(os.Stderr, "prismctl:", err)
		os.Exit(1)
	}
}

func newRootCommand() *cobra.Command {
	root := &cobra.Command{
		Use:           "prismctl",
		Short:         "Prism GPU allocation client",
		Version:       version.Get().String(),
		SilenceUsage:  true,
		SilenceErrors: true,
		PersistentPreRunE: func(cmd *cobra.Command, _ []string) error {
			return envflag.Apply(cmd.Root().PersistentFlags(), os.LookupEnv)
		},
	}
	root.SetVersionTemplate("prismctl {{.Version}}\n")
	addVerbosityFlag(root.PersistentFlags())
	envflag.Bind(root.PersistentFlags(), "PRISM_", map[string]string{"v": "PRISM_VERBOSITY"})
	root.AddCommand(profilecmd.NewCommand(), explaincmd.NewCommand(), getcmd.NewCommand(), simulatecmd.NewCommand())
	return root
}

// addVerbosityFlag adds klog's -v and none of the logging options a server
// has (formats, split streams, buffers, feature gates): client-go logs
// through klog, and a client needs only to turn that up.
func addVerbosityFlag(fs *pflag.FlagSet) {
	klogFlags := flag.NewFlagSet("klog", flag.ContinueOnError)
	klog.InitFlags(klogFlags)
	v := pflag.PFlagFromGoFlag(klogFlags.Lookup("v"))
	v.Shorthand = "v"
	v.Usage = "log verbosity, 0 by default; 6 shows every API call prismctl makes"
	fs.AddFlag(v)
}
