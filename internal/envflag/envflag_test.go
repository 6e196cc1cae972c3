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

package envflag

import (
	"strings"
	"testing"
	"time"

	"github.com/spf13/pflag"
)

type settings struct {
	profiling bool
	grace     time.Duration
	retention int
	node      string
	sans      []string
}

func newFlags(s *settings) *pflag.FlagSet {
	fs := pflag.NewFlagSet("test", pflag.ContinueOnError)
	fs.BoolVar(&s.profiling, "profiling", true, "profile")
	fs.DurationVar(&s.grace, "stale-claim-grace", 2*time.Minute, "grace")
	fs.IntVar(&s.retention, "profile-retention", 20, "retention")
	fs.StringVar(&s.node, "node-name", "", "node")
	fs.StringSliceVar(&s.sans, "extra-sans", nil, "sans")
	fs.Bool("version", false, "version")
	Bind(fs, "PRISM_", map[string]string{"node-name": "NODE_NAME"}, "version")
	return fs
}

func TestApply(t *testing.T) {
	for _, tc := range []struct {
		name    string
		args    []string
		env     map[string]string
		want    settings
		wantErr string
	}{{
		name: "defaults when nothing is set",
		want: settings{profiling: true, grace: 2 * time.Minute, retention: 20},
	}, {
		name: "env sets flags without an explicit name",
		env:  map[string]string{"PRISM_PROFILING": "false", "PRISM_STALE_CLAIM_GRACE": "5s", "PRISM_PROFILE_RETENTION": "3", "PRISM_EXTRA_SANS": "a,b"},
		want: settings{profiling: false, grace: 5 * time.Second, retention: 3, sans: []string{"a", "b"}},
	}, {
		name: "explicit names are kept",
		env:  map[string]string{"NODE_NAME": "gpu-1", "PRISM_NODE_NAME": "ignored"},
		want: settings{profiling: true, grace: 2 * time.Minute, retention: 20, node: "gpu-1"},
	}, {
		name: "the command line wins, lists included",
		args: []string{"--profile-retention=7", "--extra-sans=c"},
		env:  map[string]string{"PRISM_PROFILE_RETENTION": "3", "PRISM_EXTRA_SANS": "a,b"},
		want: settings{profiling: true, grace: 2 * time.Minute, retention: 7, sans: []string{"c"}},
	}, {
		name: "an empty variable counts as unset",
		env:  map[string]string{"PRISM_PROFILING": ""},
		want: settings{profiling: true, grace: 2 * time.Minute, retention: 20},
	}, {
		name:    "a bool that does not parse stops the start-up",
		env:     map[string]string{"PRISM_PROFILING": "off"},
		wantErr: `environment variable PRISM_PROFILING="off" is not a valid value for --profiling`,
	}, {
		name:    "a duration that does not parse stops the start-up",
		env:     map[string]string{"PRISM_STALE_CLAIM_GRACE": "2 minutes"},
		wantErr: `environment variable PRISM_STALE_CLAIM_GRACE="2 minutes" is not a valid value for --stale-claim-grace`,
	}, {
		name: "skipped flags read no variable",
		env:  map[string]string{"PRISM_VERSION": "v1.2.3"},
		want: settings{profiling: true, grace: 2 * time.Minute, retention: 20},
	}} {
		t.Run(tc.name, func(t *testing.T) {
			var got settings
			fs := newFlags(&got)
			err := Parse(fs, tc.args, func(name string) (string, bool) { v, ok := tc.env[name]; return v, ok })
			if tc.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
					t.Fatalf("Apply() error = %v, want one containing %s", err, tc.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatalf("Apply() error = %v", err)
			}
			if got.profiling != tc.want.profiling || got.grace != tc.want.grace || got.retention != tc.want.retention ||
				got.node != tc.want.node || strings.Join(got.sans, ",") != strings.Join(tc.want.sans, ",") {
				t.Errorf("settings = %+v, want %+v", got, tc.want)
			}
		})
	}
}

func TestBindNamesAndDocumentsEveryFlag(t *testing.T) {
	fs := newFlags(&settings{})
	want := map[string]string{
		"profiling":         "PRISM_PROFILING",
		"stale-claim-grace": "PRISM_STALE_CLAIM_GRACE",
		"profile-retention": "PRISM_PROFILE_RETENTION",
		"node-name":         "NODE_NAME",
		"extra-sans":        "PRISM_EXTRA_SANS",
		"version":           "",
	}
	fs.VisitAll(func(f *pflag.Flag) {
		if got := Name(f); got != want[f.Name] {
			t.Errorf("Name(--%s) = %q, want %q", f.Name, got, want[f.Name])
		}
		if want[f.Name] != "" && !strings.HasSuffix(f.Usage, "(env "+want[f.Name]+")") {
			t.Errorf("usage of --%s = %q, does not name its variable", f.Name, f.Usage)
		}
	})
}

func TestCheck(t *testing.T) {
	flags := func(define func(fs *pflag.FlagSet)) *pflag.FlagSet {
		fs := pflag.NewFlagSet("test", pflag.ContinueOnError)
		define(fs)
		return fs
	}
	for _, tc := range []struct {
		name    string
		fs      *pflag.FlagSet
		want    map[string]string
		wantErr []string
	}{{
		name: "every flag mirrored as pinned",
		fs: flags(func(fs *pflag.FlagSet) {
			fs.String("node-name", "", "")
			fs.Int("port", 0, "")
			fs.Bool("version", false, "")
			Bind(fs, "PRISM_", map[string]string{"node-name": "NODE_NAME"}, "version")
		}),
		want: map[string]string{"node-name": "NODE_NAME", "port": "PRISM_PORT"},
	}, {
		name: "a flag defined after Bind, a renamed variable and a pin nobody reads",
		fs: flags(func(fs *pflag.FlagSet) {
			fs.String("node-name", "", "")
			Bind(fs, "PRISM_", nil)
			fs.Int("late", 0, "")
		}),
		want:    map[string]string{"node-name": "NODE_NAME", "gone": "PRISM_GONE"},
		wantErr: []string{"--late has no environment variable", "--node-name reads PRISM_NODE_NAME, want NODE_NAME", "no flag reads PRISM_GONE (--gone)"},
	}, {
		name: "two flags on one variable, and --version mirrored",
		fs: flags(func(fs *pflag.FlagSet) {
			fs.String("a", "", "")
			fs.String("b", "", "")
			fs.Bool("version", false, "")
			Bind(fs, "PRISM_", map[string]string{"a": "SHARED", "b": "SHARED"})
		}),
		wantErr: []string{"--b and --a both read SHARED", "--version reads PRISM_VERSION but must read no variable"},
	}} {
		t.Run(tc.name, func(t *testing.T) {
			err := Check(tc.fs, tc.want, "version")
			if len(tc.wantErr) == 0 {
				if err != nil {
					t.Fatalf("Check: %v", err)
				}
				return
			}
			if err == nil {
				t.Fatalf("Check found nothing, want %q", tc.wantErr)
			}
			for _, want := range tc.wantErr {
				if !strings.Contains(err.Error(), want) {
					t.Errorf("Check error lacks %q:\n%v", want, err)
				}
			}
		})
	}
}
