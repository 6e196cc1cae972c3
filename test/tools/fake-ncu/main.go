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

// Command fake-ncu stands in for Nsight Compute's ncu where there is no GPU.
// It accepts the options Prism's profiling shim passes, writes ==PROF==
// lines to --log-file, runs the target with its arguments, then prints a
// recorded CSV report to stdout, as ncu prints results after the
// application exits, and exits with the target's status.
//
// Environment:
//
//	PRISM_FAKE_NCU_REPORT  file whose content is printed as the report
//	                       (default: a vector-add raw-page report)
//	PRISM_FAKE_NCU_MARKER  file to which every invocation appends its
//	                       arguments, one per line, then a "--end--" line
//	PRISM_FAKE_NCU_ERROR   an ncu error code such as ERR_NVGPUCTRPERM: log it
//	                       and print no report, as ncu does when profiling
//	                       is not permitted
package main

import (
	_ "embed"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"strings"
)

//go:embed vectoradd_raw.csv
var defaultReport []byte

// Version is what "ncu --version" prints: that of the ncu that captured
// the default report.
const version = `NVIDIA (R) Nsight Compute Command Line Profiler
Copyright (c) 2018-2025 NVIDIA Corporation
Version 2025.3.1.0 (build 36398880) (public-release)
`

// Options that take a value; every other option is a flag.
var valued = map[string]bool{
	"--page": true, "--metrics": true, "--launch-count": true, "-c": true,
	"--kernel-name": true, "-k": true, "--log-file": true, "--set": true,
	"--section": true, "--target-processes": true, "--launch-skip": true, "-s": true,
	"--clock-control": true,
}

var flags = map[string]bool{"--csv": true}

type invocation struct {
	logFile string
	target  []string
}

func main() {
	os.Exit(run(os.Args[1:], os.Stdout, os.Stderr))
}

func run(args []string, stdout, stderr io.Writer) int {
	if len(args) == 1 && (args[0] == "--version" || args[0] == "-v") {
		fmt.Fprint(stdout, version)
		return 0
	}
	inv, err := parse(args)
	if err != nil {
		fmt.Fprintf(stderr, "==ERROR== %v\n", err)
		return 1
	}
	if err := mark(args); err != nil {
		fmt.Fprintf(stderr, "==ERROR== fake-ncu marker: %v\n", err)
		return 1
	}
	log := stdout
	if inv.logFile != "" {
		f, err := os.Create(inv.logFile)
		if err != nil {
			fmt.Fprintf(stderr, "==ERROR== Failed to open log file %s: %v\n", inv.logFile, err)
			return 1
		}
		defer f.Close() //nolint:errcheck // best effort, like ncu's own log
		log = f
	}

	cmd := exec.Command(inv.target[0], inv.target[1:]...)
	cmd.Stdin, cmd.Stdout, cmd.Stderr = os.Stdin, os.Stdout, os.Stderr
	if err := cmd.Start(); err != nil {
		fmt.Fprintf(log, "==ERROR== Failed to launch process %s: %v\n", inv.target[0], err)
		return 1
	}
	fmt.Fprintf(log, "==PROF== Connected to process %d (%s)\n", cmd.Process.Pid, inv.target[0])
	errCode := os.Getenv("PRISM_FAKE_NCU_ERROR")
	if errCode != "" {
		fmt.Fprintf(log, "==ERROR== %s - The user does not have permission to access NVIDIA GPU Performance Counters on the target device 0.\n", errCode)
	} else {
		fmt.Fprintf(log, "==PROF== Profiling \"vectorAdd\" - 0: 0%%....50%%....100%% - 9 passes\n")
	}
	waitErr := cmd.Wait()
	fmt.Fprintf(log, "==PROF== Disconnected from process %d\n", cmd.Process.Pid)

	if errCode == "" {
		report := defaultReport
		if path := os.Getenv("PRISM_FAKE_NCU_REPORT"); path != "" {
			if report, err = os.ReadFile(path); err != nil {
				fmt.Fprintf(log, "==ERROR== fake-ncu: %v\n", err)
				return 1
			}
		}
		if _, err := stdout.Write(report); err != nil {
			fmt.Fprintf(log, "==ERROR== fake-ncu: writing report: %v\n", err)
		}
	}

	var exit *exec.ExitError
	switch {
	case errors.As(waitErr, &exit):
		return exit.ExitCode()
	case waitErr != nil:
		fmt.Fprintf(log, "==ERROR== %v\n", waitErr)
		return 1
	}
	return 0
}

// parse accepts ncu's "[options] program [program-arguments]" as well as an
// explicit "--" before the program.
func parse(args []string) (invocation, error) {
	var inv invocation
	for i := 0; i < len(args); i++ {
		a := args[i]
		switch {
		case a == "--":
			inv.target = args[i+1:]
		case valued[a]:
			if i+1 == len(args) {
				return inv, fmt.Errorf("option %s requires a value", a)
			}
			if a == "--log-file" {
				inv.logFile = args[i+1]
			}
			i++
			continue
		case flags[a]:
			continue
		case strings.HasPrefix(a, "-"):
			return inv, fmt.Errorf("unrecognised option '%s'", a)
		default:
			inv.target = args[i:]
		}
		break
	}
	if len(inv.target) == 0 {
		return inv, errors.New("no application specified")
	}
	return inv, nil
}

func mark(args []string) error {
	path := os.Getenv("PRISM_FAKE_NCU_MARKER")
	if path == "" {
		return nil
	}
	f, err := os.OpenFile(path, os.O_WRONLY|os.O_CREATE|os.O_APPEND, 0o644)
	if err != nil {
		return err
	}
	if _, err := fmt.Fprintf(f, "%s\n--end--\n", strings.Join(args, "\n")); err != nil {
		f.Close() //nolint:errcheck // the write error is the one to report
		return err
	}
	return f.Close()
}
