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
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"
)

// command is one of the control daemon's commands: its arguments' names,
// for their count and the usage line, and what it does with them, d.mu
// held.
type command struct {
	args []string
	run  func(d *daemon, args []string) ([]string, error)
}

// commands are those nvidia-cuda-mps-control(1) documents that the
// stand-in models, spelt as there.
var commands = map[string]command{
	"quit": {run: func(*daemon, []string) ([]string, error) { return nil, nil }},
	"start_server": {args: []string{"-uid", "UID"}, run: func(d *daemon, args []string) ([]string, error) {
		uid, err := strconv.Atoi(args[1])
		if args[0] != "-uid" || err != nil || uid < 0 {
			return nil, fmt.Errorf("invalid arguments %q: want -uid UID", strings.Join(args, " "))
		}
		if s := d.server; s != nil {
			return nil, fmt.Errorf("an MPS server is already running: %d, of UID %d", s.id, s.uid)
		}
		s, err := d.startServer(uid)
		if err != nil {
			return nil, err
		}
		d.server = s
		return nil, nil
	}},
	"get_server_list": {run: func(d *daemon, _ []string) ([]string, error) {
		if d.server == nil {
			return nil, nil
		}
		return []string{strconv.Itoa(d.server.id)}, nil
	}},
	"get_client_list": {args: []string{"SERVER"}, run: func(d *daemon, args []string) ([]string, error) {
		s, err := d.serverByID(args[0])
		if err != nil {
			return nil, err
		}
		var pids []int
		for w := range s.clients {
			pids = append(pids, w.pid)
		}
		slices.Sort(pids)
		var out []string
		for _, pid := range pids {
			out = append(out, strconv.Itoa(pid))
		}
		return out, nil
	}},
	"set_default_active_thread_percentage": {args: []string{"P"}, run: func(d *daemon, args []string) ([]string, error) {
		return nil, setPercentage(&d.defaults, args[0])
	}},
	"get_default_active_thread_percentage": {run: func(d *daemon, _ []string) ([]string, error) {
		return []string{formatPercentage(d.defaults.ActiveThreadPercentage)}, nil
	}},
	"set_active_thread_percentage": {args: []string{"SERVER", "P"}, run: func(d *daemon, args []string) ([]string, error) {
		s, err := d.serverByID(args[0])
		if err != nil {
			return nil, err
		}
		return nil, setPercentage(&s.limits, args[1])
	}},
	"get_active_thread_percentage": {args: []string{"SERVER"}, run: func(d *daemon, args []string) ([]string, error) {
		s, err := d.serverByID(args[0])
		if err != nil {
			return nil, err
		}
		return []string{formatPercentage(s.limits.ActiveThreadPercentage)}, nil
	}},
	"set_default_device_pinned_mem_limit": {args: []string{"DEV", "VALUE"}, run: func(d *daemon, args []string) ([]string, error) {
		return nil, setPinned(&d.defaults, args[0], args[1])
	}},
	"get_default_device_pinned_mem_limit": {args: []string{"DEV"}, run: func(d *daemon, args []string) ([]string, error) {
		return getPinned(d.defaults, args[0])
	}},
	"set_device_pinned_mem_limit": {args: []string{"SERVER", "DEV", "VALUE"}, run: func(d *daemon, args []string) ([]string, error) {
		s, err := d.serverByID(args[0])
		if err != nil {
			return nil, err
		}
		return nil, setPinned(&s.limits, args[1], args[2])
	}},
	"get_device_pinned_mem_limit": {args: []string{"SERVER", "DEV"}, run: func(d *daemon, args []string) ([]string, error) {
		s, err := d.serverByID(args[0])
		if err != nil {
			return nil, err
		}
		return getPinned(s.limits, args[1])
	}},
}

// execute runs one command line and says whether it was quit.
func (d *daemon) execute(line string) (rep reply, quit bool) {
	words := strings.Fields(line)
	if len(words) == 0 {
		return reply{}, false
	}
	cmd, ok := commands[words[0]]
	var out []string
	var err error
	switch {
	case !ok:
		err = fmt.Errorf("unknown command %q", words[0])
	case len(words)-1 != len(cmd.args):
		err = fmt.Errorf("usage: %s", strings.Join(append(words[:1:1], cmd.args...), " "))
	default:
		d.mu.Lock()
		out, err = cmd.run(d, words[1:])
		d.mu.Unlock()
	}
	if err != nil {
		return reply{Lines: []string{"Error: " + err.Error()}, Failed: true}, false
	}
	return reply{Lines: out}, words[0] == "quit"
}

// serverByID is the running server if id is its ID.
func (d *daemon) serverByID(id string) (*server, error) {
	if s := d.server; s != nil && strconv.Itoa(s.id) == id {
		return s, nil
	}
	return nil, errors.New("no MPS server with ID " + id)
}

func setPercentage(l *limits, arg string) error {
	p, err := parsePercentage(arg)
	if err != nil {
		return err
	}
	l.ActiveThreadPercentage = p
	return nil
}

func setPinned(l *limits, dev, value string) error {
	d, err := parseDevice(dev)
	if err != nil {
		return err
	}
	b, err := parseBytes(value)
	if err != nil {
		return err
	}
	l.PinnedMem[d] = b
	return nil
}

func getPinned(l limits, dev string) ([]string, error) {
	d, err := parseDevice(dev)
	if err != nil {
		return nil, err
	}
	return []string{formatMiB(l.PinnedMem[d])}, nil
}
