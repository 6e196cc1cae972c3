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

// Package envflag gives every command-line flag an environment variable,
// so that a DaemonSet or Deployment can configure a binary through env and
// an operator can still override any of it on the command line.
package envflag

import (
	"errors"
	"fmt"
	"maps"
	"os"
	"slices"
	"strings"

	"github.com/spf13/pflag"
)

// annotation is the pflag annotation key that records a flag's variable,
// so that help output, Apply and tests all read the same mapping.
const annotation = "prism.dev/env"

// Bind gives every flag of fs an environment variable: names[flag] where
// given (for names that predate this package, such as NODE_NAME), else
// prefix plus the flag name in upper case with dashes as underscores. Flags
// in skip get none. The variable is appended to the flag's help text.
// Call it after all flags are defined; a flag added later has no variable.
func Bind(fs *pflag.FlagSet, prefix string, names map[string]string, skip ...string) {
	fs.VisitAll(func(f *pflag.Flag) {
		for _, s := range skip {
			if f.Name == s {
				return
			}
		}
		name, ok := names[f.Name]
		if !ok {
			name = prefix + strings.ToUpper(strings.ReplaceAll(f.Name, "-", "_"))
		}
		// SetAnnotation only fails for an unknown flag name, and f is known.
		_ = fs.SetAnnotation(f.Name, annotation, []string{name})
		f.Usage = fmt.Sprintf("%s (env %s)", f.Usage, name)
	})
}

// Name returns the environment variable of a flag, or "" when it has none.
func Name(f *pflag.Flag) string {
	if v := f.Annotations[annotation]; len(v) == 1 {
		return v[0]
	}
	return ""
}

// Apply sets every flag that was not given on the command line from its
// variable, when that is set and not empty. Call it after fs.Parse, so
// that the command line wins without list flags appending to the env value.
// A value that does not parse is an error naming the variable, the value
// and the flag: a typo such as PRISM_PROFILING=off must stop the start-up
// rather than leave the default in force.
func Apply(fs *pflag.FlagSet, lookup func(string) (string, bool)) error {
	var err error
	fs.VisitAll(func(f *pflag.Flag) {
		name := Name(f)
		if err != nil || name == "" || f.Changed {
			return
		}
		value, ok := lookup(name)
		if !ok || value == "" {
			return
		}
		if setErr := fs.Set(f.Name, value); setErr != nil {
			err = fmt.Errorf("environment variable %s=%q is not a valid value for --%s: %w", name, value, f.Name, setErr)
		}
	})
	return err
}

// Parse parses the command line, then applies the environment to the flags
// it left unset.
func Parse(fs *pflag.FlagSet, args []string, lookup func(string) (string, bool)) error {
	if err := fs.Parse(args); err != nil {
		return err
	}
	return Apply(fs, lookup)
}

// ParseCommandLine parses the process's command line and environment into
// fs, as a binary's main does: --help exits 0, and a flag or variable that
// does not parse exits as ExitIfInvalid does.
func ParseCommandLine(fs *pflag.FlagSet) {
	if err := Parse(fs, os.Args[1:], os.LookupEnv); err != nil {
		if errors.Is(err, pflag.ErrHelp) {
			os.Exit(0)
		}
		ExitIfInvalid(fs, err)
	}
}

// ExitIfInvalid ends a binary that cannot start as configured, when err is
// not nil: the error goes to stderr after the binary's name (the name of
// fs), and the status is 2, as for a flag that does not parse.
func ExitIfInvalid(fs *pflag.FlagSet, err error) {
	if err != nil {
		fmt.Fprintln(os.Stderr, fs.Name()+":", err)
		os.Exit(2)
	}
}

// Check says what is wrong with the variables of fs: a flag without one
// (other than those in noEnv, which must have none), a flag whose variable
// is not the one want pins for it, two flags reading one variable, and a
// pinned variable no flag reads. A renamed variable silently stops
// configuring what it did, so binaries pin the names a chart or an
// operator's manifests use.
func Check(fs *pflag.FlagSet, want map[string]string, noEnv ...string) error {
	var errs []error
	seen := map[string]string{}
	fs.VisitAll(func(f *pflag.Flag) {
		name := Name(f)
		switch {
		case slices.Contains(noEnv, f.Name):
			if name != "" {
				errs = append(errs, fmt.Errorf("--%s reads %s but must read no variable", f.Name, name))
			}
			return
		case name == "":
			errs = append(errs, fmt.Errorf("--%s has no environment variable", f.Name))
		case want[f.Name] != "" && name != want[f.Name]:
			errs = append(errs, fmt.Errorf("--%s reads %s, want %s", f.Name, name, want[f.Name]))
		case seen[name] != "":
			errs = append(errs, fmt.Errorf("--%s and --%s both read %s", f.Name, seen[name], name))
		}
		seen[name] = f.Name
	})
	for _, flag := range slices.Sorted(maps.Keys(want)) {
		if _, ok := seen[want[flag]]; !ok {
			errs = append(errs, fmt.Errorf("no flag reads %s (--%s)", want[flag], flag))
		}
	}
	return errors.Join(errs...)
}
