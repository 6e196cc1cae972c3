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

package cmdgroup

import (
	"bytes"
	"strings"
	"testing"

	"github.com/spf13/cobra"
)

// explain runs prismctl with args, where explain is a group of one
// subcommand, claim, and returns what it printed.
func explain(args ...string) (string, error) {
	sub := &cobra.Command{Use: "claim", RunE: func(cmd *cobra.Command, _ []string) error {
		cmd.Print("claim ran")
		return nil
	}}
	root := &cobra.Command{Use: "prismctl", SilenceUsage: true, SilenceErrors: true}
	root.AddCommand(New("explain", "Explain things", sub))
	var out bytes.Buffer
	root.SetOut(&out)
	root.SetErr(&out)
	root.SetArgs(args)
	err := root.Execute()
	return out.String(), err
}

func TestGroupRunsSubcommands(t *testing.T) {
	for _, tc := range []struct {
		name    string
		args    []string
		wantOut string
	}{
		{name: "subcommand runs", args: []string{"explain", "claim"}, wantOut: "claim ran"},
		{name: "no subcommand prints help", args: []string{"explain"}, wantOut: "Available Commands:"},
	} {
		out, err := explain(tc.args...)
		if err != nil || !strings.Contains(out, tc.wantOut) {
			t.Errorf("%s: output %q, error %v; want output containing %q", tc.name, out, err, tc.wantOut)
		}
	}
}

func TestGroupRejectsUnknownSubcommands(t *testing.T) {
	for _, tc := range []struct {
		name    string
		args    []string
		wantErr string
	}{
		{name: "unknown subcommand fails", args: []string{"explain", "foo"}, wantErr: `unknown command "foo" for "prismctl explain"`},
		{name: "extra argument fails", args: []string{"explain", "foo", "bar"}, wantErr: `unknown command "foo"`},
	} {
		if _, err := explain(tc.args...); err == nil || !strings.Contains(err.Error(), tc.wantErr) {
			t.Errorf("%s: error %v, want %q", tc.name, err, tc.wantErr)
		}
	}
}
