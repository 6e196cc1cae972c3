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

// The daemon and its clients speak in lines over the control socket. A
// control client sends a command line and reads one reply. A CUDA client
// sends attachCommand and reads attachReplies: one with Waiting set while
// it is queued, then the last. It stays connected while it is a client of
// the server; closing the connection is leaving.

// reply is the daemon's answer to one command line.
type reply struct {
	Lines  []string `json:"lines,omitempty"`
	Failed bool     `json:"failed,omitempty"`
}

// attachCommand, followed by how long the client waits for a server of
// its UID, is a CUDA client's request for a server. It is the stand-in's
// own, not a documented command.
const attachCommand = "fake_cuda_client_attach"

// attachReply is the daemon's answer to attachCommand.
type attachReply struct {
	// Waiting: the client is queued behind a server of another UID.
	Waiting bool `json:"waiting,omitempty"`
	// Waited: it was, before this reply.
	Waited bool `json:"waited,omitempty"`
	// TimedOut: it was for as long as it would wait; no server.
	TimedOut bool   `json:"timedOut,omitempty"`
	Error    string `json:"error,omitempty"`

	Server int    `json:"server,omitempty"`
	UID    int    `json:"uid"`
	Limits limits `json:"limits"`
	// Shm is the name of the server's file in /dev/shm and Token what it
	// holds.
	Shm   string `json:"shm,omitempty"`
	Token string `json:"token,omitempty"`
}
