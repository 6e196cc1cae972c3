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

// Package envflagtest runs a binary's flags, as envflag binds them, against
// start-ups given as a command line and an environment, for the binaries'
// tests.
package envflagtest

import (
	"maps"
	"strings"
	"testing"

	"github.com/spf13/pflag"

	"github.com/prismgpu/prism/internal/envflag"
)

// Case is one start-up: the command line and the environment, and either
// what the parsed options must satisfy or a part of the error that the
// start-up must stop with.
type Case[T any] struct {
	Name    string
	Args    []string
	Env     map[string]string
	Check   func(T) bool
	WantErr string
}

// Run parses each case into options that newFlags binds, as the binary's
// main does with envflag.Parse, in a subtest of its own.
func Run[T any](t *testing.T, newFlags func(*T) *pflag.FlagSet, cases []Case[T]) {
	t.Helper()
	for _, tc := range cases {
		t.Run(tc.Name, func(t *testing.T) {
			var o T
			err := envflag.Parse(newFlags(&o), tc.Args, Lookup(tc.Env))
			switch {
			case tc.WantErr != "":
				if err == nil || !strings.Contains(err.Error(), tc.WantErr) {
					t.Fatalf("error = %v, want one containing %s", err, tc.WantErr)
				}
			case err != nil:
				t.Fatal(err)
			case !tc.Check(o):
				t.Errorf("options = %+v", o)
			}
		})
	}
}

// shared are the variables of the flags that every daemon has: the logging
// flags and --kubeconfig.
var shared = map[string]string{
	"kubeconfig":     "KUBECONFIG",
	"logging-format": "PRISM_LOGGING_FORMAT",
	"v":              "PRISM_VERBOSITY",
	"vmodule":        "PRISM_VMODULE",
	"feature-gates":  "PRISM_FEATURE_GATES",
}

// Mirrors fails t unless every flag that newFlags binds reads a variable
// (see envflag.Check): the one want pins for it, or for a flag every daemon
// has, the one shared pins; --version reads none, since a stray variable
// must not turn start-up into printing the version.
func Mirrors[T any](t *testing.T, newFlags func(*T) *pflag.FlagSet, want map[string]string) {
	t.Helper()
	pins := maps.Clone(shared)
	maps.Copy(pins, want)
	if err := envflag.Check(newFlags(new(T)), pins, "version"); err != nil {
		t.Error(err)
	}
}

// Lookup reads env as os.LookupEnv reads the process's environment.
func Lookup(env map[string]string) func(string) (string, bool) {
	return func(name string) (string, bool) {
		v, ok := env[name]
		return v, ok
	}
}
