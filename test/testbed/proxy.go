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

package testbed

import (
	"errors"
	"io"
	"net"
	"sync"
)

// Proxy forwards TCP connections from a loopback address to a target, and
// can be cut: while cut it closes the connections it accepts and those it
// was forwarding, as a server that is down or unreachable would. A client
// pointed at it sees its server go away and come back without the server
// itself restarting.
type Proxy struct {
	// Addr is the proxy's host:port on 127.0.0.1.
	Addr   string
	target string
	l      net.Listener
	mu     sync.Mutex
	open   bool
	conns  map[net.Conn]struct{}
	done   sync.WaitGroup
}

// StartProxy listens on a free loopback port and forwards to target
// (host:port) while open.
func StartProxy(target string, open bool) (*Proxy, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, err
	}
	p := &Proxy{Addr: l.Addr().String(), target: target, l: l, open: open, conns: map[net.Conn]struct{}{}}
	p.done.Add(1)
	go p.serve()
	return p, nil
}

// SetOpen opens or cuts the proxy; cutting closes every connection.
func (p *Proxy) SetOpen(open bool) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.open = open
	if !open {
		for c := range p.conns {
			c.Close()
		}
		clear(p.conns)
	}
}

// SetTarget sends new connections to target (host:port), as a Service does
// once its endpoints change; connections already forwarded stay where they are.
func (p *Proxy) SetTarget(target string) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.target = target
}

// Close stops listening and closes every connection.
func (p *Proxy) Close() error {
	err := p.l.Close()
	p.SetOpen(false)
	p.done.Wait()
	return err
}

func (p *Proxy) serve() {
	defer p.done.Done()
	for {
		in, err := p.l.Accept()
		if errors.Is(err, net.ErrClosed) {
			return
		}
		if err != nil {
			continue
		}
		go p.forward(in)
	}
}

func (p *Proxy) forward(in net.Conn) {
	if !p.track(in) {
		in.Close()
		return
	}
	p.mu.Lock()
	target := p.target
	p.mu.Unlock()
	out, err := net.Dial("tcp", target)
	if err != nil || !p.track(out) {
		in.Close()
		if out != nil {
			out.Close()
		}
		return
	}
	var wg sync.WaitGroup
	wg.Add(2)
	pipe := func(dst, src net.Conn) {
		defer wg.Done()
		_, _ = io.Copy(dst, src)
		dst.Close()
		src.Close()
	}
	go pipe(out, in)
	go pipe(in, out)
	wg.Wait()
	p.mu.Lock()
	delete(p.conns, in)
	delete(p.conns, out)
	p.mu.Unlock()
}

// track records a connection to close when the proxy is cut, and says
// whether it is open.
func (p *Proxy) track(c net.Conn) bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	if !p.open {
		return false
	}
	p.conns[c] = struct{}{}
	return true
}
