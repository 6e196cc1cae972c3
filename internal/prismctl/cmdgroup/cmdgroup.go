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

// Package cmdgroup builds prismctl's parent commands, those that only hold
// subcommands (explain, get, profile).
package cmdgroup

import "github.com/spf13/cobra"

// New returns a parent command that fails on anything that is not one of
// its subcommands. Cobra treats a command without Run as help-only: it
// prints the help and exits 0 whatever follows, so a script that typed
// `prismctl explain clam` would carry on as if it had an answer.
func New(use, short string, subcommands ...*cobra.Command) *cobra.Command {
	cmd := &cobra.Command{
		Use:   use,
		Short: short,
		// NoArgs reports `unknown command "clam" for "prismctl explain"`.
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			return cmd.Help()
		},
	}
	cmd.AddCommand(subcommands...)
	return cmd
}
