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

package main

import (
	"bufio"
	"encoding/json"
	"fmt"
	"io"
	"strings"
)

// runControlClient sends each line of stdin to the daemon as a command
// and prints its replies.
func runControlClient(pipeDir string, stdin io.Reader, stdout, stderr io.Writer) int {
	c, err := dialControl(pipeDir)
	if err != nil {
		fmt.Fprintf(stderr, "Cannot find MPS control daemon process: %v\n", err)
		return 1
	}
	defer c.Close()
	replies := json.NewDecoder(c)
	failed := false
	lines := bufio.NewScanner(stdin)
	for lines.Scan() {
		line := strings.TrimSpace(lines.Text())
		if line == "" {
			continue
		}
		var rep reply
		if _, err := fmt.Fprintln(c, line); err != nil {
			fmt.Fprintf(stderr, "Cannot find MPS control daemon process: %v\n", err)
			return 1
		}
		if err := replies.Decode(&rep); err != nil {
			fmt.Fprintf(stderr, "Cannot find MPS control daemon process: no reply to %q: %v\n", line, err)
			return 1
		}
		for _, l := range rep.Lines {
			fmt.Fprintln(stdout, l)
		}
		failed = failed || rep.Failed
	}
	if err := lines.Err(); err != nil {
		fmt.Fprintf(stderr, "fake-mps-control: %v\n", err)
		return 1
	}
	if failed {
		return 1
	}
	return 0
}
