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

package logging

import (
	"bytes"
	"encoding/json"
	"strings"
	"testing"

	"github.com/spf13/pflag"
	logsapi "k8s.io/component-base/logs/api/v1"
	"k8s.io/klog/v2"
)

// applyFlags parses args into fresh Options and installs the logger with
// both streams captured; the global logger is restored when the test ends.
func applyFlags(t *testing.T, args ...string) (*bytes.Buffer, error) {
	t.Helper()
	o := NewOptions()
	fs := pflag.NewFlagSet("test", pflag.ContinueOnError)
	o.AddFlags(fs)
	if err := fs.Parse(args); err != nil {
		return nil, err
	}
	var out bytes.Buffer
	err := o.apply(&logsapi.LoggingOptions{ErrorStream: &out, InfoStream: &out})
	t.Cleanup(func() {
		if err := logsapi.ResetForTest(nil); err != nil {
			t.Errorf("reset logging: %v", err)
		}
	})
	return &out, err
}

func TestJSONFormatWritesJSONLines(t *testing.T) {
	out, err := applyFlags(t, "--logging-format=json", "-v=2")
	if err != nil {
		t.Fatal(err)
	}
	klog.LoggerWithName(klog.Background(), "prism-test").V(2).Info("Prepared claim", "claim", "default/train")
	klog.Background().V(3).Info("Above the verbosity")
	klog.Flush()

	lines := strings.Split(strings.TrimSpace(out.String()), "\n")
	if len(lines) != 1 {
		t.Fatalf("got %d log lines, want 1:\n%s", len(lines), out)
	}
	var entry map[string]any
	if err := json.Unmarshal([]byte(lines[0]), &entry); err != nil {
		t.Fatalf("log line %q is not JSON: %v", lines[0], err)
	}
	for key, want := range map[string]any{"msg": "Prepared claim", "claim": "default/train", "logger": "prism-test", "v": float64(2)} {
		if entry[key] != want {
			t.Errorf("entry[%q] = %v, want %v (line %s)", key, entry[key], want, lines[0])
		}
	}
}

func TestFlags(t *testing.T) {
	for _, tc := range []struct {
		name    string
		args    []string
		wantErr string
	}{
		{name: "defaults", args: nil},
		{name: "text with vmodule", args: []string{"--logging-format=text", "--vmodule=driver*=5", "-v=4"}},
		{name: "contextual logging can be turned off", args: []string{"--feature-gates=ContextualLogging=false"}},
		{name: "an unknown format", args: []string{"--logging-format=xml"}, wantErr: "xml"},
		{name: "an unknown feature gate", args: []string{"--feature-gates=NoSuchGate=true"}, wantErr: "NoSuchGate"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := applyFlags(t, tc.args...)
			if tc.wantErr == "" && err != nil {
				t.Fatalf("error = %v", err)
			}
			if tc.wantErr != "" && (err == nil || !strings.Contains(err.Error(), tc.wantErr)) {
				t.Fatalf("error = %v, want one containing %q", err, tc.wantErr)
			}
		})
	}
}
