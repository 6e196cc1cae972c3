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

package checkpoint

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"time"

	"k8s.io/klog/v2"
	"k8s.io/utils/clock"

	"github.com/prismgpu/prism/internal/atomicfile"
)

const (
	// DefaultFileName is the checkpoint's file name inside its directory.
	DefaultFileName = "checkpoint.json"
	// DefaultBootIDPath is where Linux exposes the ID of the current boot.
	DefaultBootIDPath = "/proc/sys/kernel/random/boot_id"

	currentVersion = "v2"
	versionV1      = "v1"
	checksumPrefix = "sha256:"
)

// Options configure a Store. The zero value is usable.
type Options struct {
	// FileName defaults to DefaultFileName.
	FileName string
	// BootIDPath defaults to DefaultBootIDPath.
	BootIDPath string
	// Clock names moved-aside files. Defaults to the real clock.
	Clock clock.PassiveClock
	// Observe, when set, is told how long each step of a write took, with
	// the context of the change: StepEncode, StepAppend and StepFsync for a
	// change appended to the journal, StepCompact for a whole rewrite.
	Observe func(ctx context.Context, step string, d time.Duration)

	// fs lets tests fail individual steps of a write.
	fs fileSystem
}

// Recovered reports what Open had to do to make the checkpoint usable. The
// zero value means the file was loaded as it was, or did not exist.
type Recovered struct {
	// Corruption is set when the file was unusable and moved aside; the
	// store then starts empty.
	Corruption *CorruptionError
	// MigratedFrom is the version the file was converted from, if any.
	MigratedFrom string
	// BootIDChanged is true when the node rebooted since the last write.
	BootIDChanged bool
	// Invalidated lists, sorted, the claims downgraded from
	// PrepareCompleted to PrepareStarted because of a reboot.
	Invalidated []string
	// TornEntryBytes is the size of a last journal entry that was cut
	// short (a power loss during an append) and dropped; the file has been
	// rewritten without it.
	TornEntryBytes int
}

// CorruptionReason classifies an unusable checkpoint.
type CorruptionReason string

const (
	ReasonMalformed        CorruptionReason = "Malformed"
	ReasonChecksumMismatch CorruptionReason = "ChecksumMismatch"
	ReasonUnknownVersion   CorruptionReason = "UnknownVersion"
	ReasonInvalidData      CorruptionReason = "InvalidData"
)

// CorruptionError describes a checkpoint that was moved aside.
type CorruptionError struct {
	Path    string
	MovedTo string
	Reason  CorruptionReason
	Err     error
}

func (e *CorruptionError) Error() string {
	return fmt.Sprintf("checkpoint %s is unusable (%s), moved to %s: %v", e.Path, e.Reason, e.MovedTo, e.Err)
}

func (e *CorruptionError) Unwrap() error { return e.Err }

// Steps of a write, as reported to Options.Observe.
const (
	StepEncode  = "encode"
	StepAppend  = "append"
	StepFsync   = "fsync"
	StepCompact = "compact"
)

// compactFloor is how large the journal may grow before the file is
// rewritten, whatever the snapshot's size: small enough to replay in a
// millisecond, large enough that a node with few claims rewrites rarely.
const compactFloor = 256 << 10

// Store holds the checkpoint in memory and persists every change.
type Store struct {
	path    string
	bootID  string
	fs      fileSystem
	observe func(ctx context.Context, step string, d time.Duration)

	// journal is the file opened for appending changes, or nil when the
	// next change must rewrite it whole: after Open and Reload, after a
	// failed write, and once the journal outgrew the snapshot. seq numbers
	// the appended changes since the last rewrite.
	journal       atomicfile.File
	journalBytes  int64
	snapshotBytes int64
	seq           int64

	// updateMu serialises Update so that only one write is in flight and
	// data can be read without mu while it is held.
	updateMu sync.Mutex
	// mu guards the data pointer. Readers never wait for an fsync because
	// data is only swapped after the write has finished.
	mu   sync.RWMutex
	data *Data
}

// payload is what the checksum covers: Data's fields, inline, after the
// boot ID. The boot ID lives here rather than in Data because callers must
// not change it.
type payload struct {
	BootID string `json:"bootID,omitempty"`
	Data
}

type envelope struct {
	Version  string          `json:"version"`
	Checksum string          `json:"checksum"`
	Data     json.RawMessage `json:"data,omitempty"`
	// PreparedClaims is only present in v1 files.
	PreparedClaims json.RawMessage `json:"preparedClaims,omitempty"`
}

type v1Claim struct {
	Namespace string     `json:"namespace"`
	Name      string     `json:"name"`
	Devices   []v1Device `json:"devices"`
}

type v1Device struct {
	Pool         string   `json:"pool"`
	Device       string   `json:"device"`
	CDIDeviceIDs []string `json:"cdiDeviceIDs"`
}

// Open loads the checkpoint in dir, creating dir if needed. An unusable
// file is not an error: it is moved aside and reported in Recovered. Errors
// are returned only when the directory or file cannot be accessed at all.
func Open(ctx context.Context, dir string, opts Options) (*Store, Recovered, error) {
	logger := klog.FromContext(ctx)
	var rec Recovered
	if opts.FileName == "" {
		opts.FileName = DefaultFileName
	}
	if opts.BootIDPath == "" {
		opts.BootIDPath = DefaultBootIDPath
	}
	if opts.Clock == nil {
		opts.Clock = clock.RealClock{}
	}
	if opts.fs == nil {
		opts.fs = osFS{}
	}
	if err := os.MkdirAll(dir, 0o750); err != nil {
		return nil, rec, fmt.Errorf("creating checkpoint directory: %w", err)
	}
	s := &Store{
		path:    filepath.Join(dir, opts.FileName),
		fs:      opts.fs,
		observe: opts.Observe,
		data:    &Data{Claims: map[string]Claim{}},
	}
	s.removeTempFiles(logger)

	bootID, err := readBootID(opts.BootIDPath)
	if err != nil {
		logger.Error(err, "Boot ID unknown, prepared claims will not be invalidated after a reboot")
	}
	s.bootID = bootID

	raw, err := os.ReadFile(s.path)
	switch {
	case errors.Is(err, fs.ErrNotExist):
		logger.V(2).Info("No checkpoint, starting empty", "path", s.path)
		return s, rec, nil
	case err != nil:
		return nil, rec, fmt.Errorf("reading checkpoint: %w", err)
	}

	p, migratedFrom, torn, reason, err := decode(raw)
	if err != nil {
		movedTo := s.path + ".corrupt-" + opts.Clock.Now().UTC().Format("20060102T150405.000000000Z")
		if rerr := s.fs.Rename(s.path, movedTo); rerr != nil {
			return nil, rec, fmt.Errorf("moving aside unusable checkpoint (%v): %w", err, rerr)
		}
		if serr := s.fs.SyncDir(dir); serr != nil {
			logger.Error(serr, "Syncing checkpoint directory after moving a corrupt checkpoint aside")
		}
		rec.Corruption = &CorruptionError{Path: s.path, MovedTo: movedTo, Reason: reason, Err: err}
		return s, rec, nil
	}
	rec.MigratedFrom = migratedFrom
	rec.TornEntryBytes = torn

	if p.BootID != "" && bootID != "" && p.BootID != bootID {
		rec.BootIDChanged = true
		for _, uid := range slices.Sorted(maps.Keys(p.Claims)) {
			if c := p.Claims[uid]; c.State == PrepareCompleted {
				c.State = PrepareStarted
				p.Claims[uid] = c
				rec.Invalidated = append(rec.Invalidated, uid)
			}
		}
	}
	if p.Claims == nil {
		p.Claims = map[string]Claim{}
	}
	data := &p.Data
	// Persist the outcome now so that it does not depend on the next
	// Update, and so a downgrade is not repeated by every restart.
	// A torn entry must go before anything is appended after it.
	if rec.MigratedFrom != "" || rec.BootIDChanged || rec.TornEntryBytes > 0 {
		if err := s.compact(ctx, data); err != nil {
			return nil, rec, fmt.Errorf("persisting recovered checkpoint: %w", err)
		}
	}
	s.data = data
	logger.V(2).Info("Loaded checkpoint", "path", s.path, "claims", len(data.Claims),
		"migratedFrom", rec.MigratedFrom, "bootIDChanged", rec.BootIDChanged)
	return s, rec, nil
}

// Get returns a copy of the claim with the given UID.
func (s *Store) Get(uid string) (Claim, bool) {
	s.mu.RLock()
	defer s.mu.RUnlock()
	c, ok := s.data.Claims[uid]
	if !ok {
		return Claim{}, false
	}
	return c.clone(), true
}

// Taints returns a copy of the GPUs' health taints by device name.
func (s *Store) Taints() map[string]Taint {
	s.mu.RLock()
	defer s.mu.RUnlock()
	return maps.Clone(s.data.Taints)
}

// MPSDaemons returns a copy of the recorded MPS control daemons by GPU UUID.
func (s *Store) MPSDaemons() map[string]MPSDaemon {
	s.mu.RLock()
	defer s.mu.RUnlock()
	return maps.Clone(s.data.MPSDaemons)
}

// List returns copies of all claims, sorted by UID.
func (s *Store) List() []Claim {
	s.mu.RLock()
	defer s.mu.RUnlock()
	out := make([]Claim, 0, len(s.data.Claims))
	for _, uid := range slices.Sorted(maps.Keys(s.data.Claims)) {
		out = append(out, s.data.Claims[uid].clone())
	}
	return out
}

// Range calls fn with each claim, in no particular order, until fn returns
// false. Unlike List it copies nothing, for checks that run on every
// prepare: fn must not change or keep the claim, nor write to the store.
func (s *Store) Range(fn func(*Claim) bool) {
	s.mu.RLock()
	defer s.mu.RUnlock()
	for _, c := range s.data.Claims {
		if !fn(&c) {
			return
		}
	}
}

// Update applies fn to a copy of the data and rewrites the whole file with
// the result, fsynced. If fn fails, the result is invalid or cannot be
// written, the error is returned and the store keeps its previous content.
// Changes to a few claims are cheaper with PutClaims and DeleteClaims.
func (s *Store) Update(ctx context.Context, fn func(*Data) error) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	s.updateMu.Lock()
	defer s.updateMu.Unlock()

	next := s.data.clone()
	if err := fn(next); err != nil {
		return err
	}
	if next.Claims == nil {
		next.Claims = map[string]Claim{}
	}
	if err := next.validate(); err != nil {
		return fmt.Errorf("refusing to persist invalid checkpoint: %w", err)
	}
	return s.replace(ctx, next)
}

// PutClaims records claims, replacing those with the same UIDs, as one
// change. With sync the change is fsynced before PutClaims returns; without
// it, it survives a crash of the process but maybe not a power loss. The
// plugin skips the fsync for PrepareStarted, whose loss only leaves a CDI
// spec behind that start-up reconciliation removes, and which a reboot
// makes stale anyway.
func (s *Store) PutClaims(ctx context.Context, sync bool, claims ...Claim) error {
	set := make(map[string]*Claim, len(claims))
	for _, c := range claims {
		c = c.clone()
		set[c.UID] = &c
	}
	return s.change(ctx, sync, set)
}

// DeleteClaims removes claims as one change; unknown UIDs are ignored. sync
// is as for PutClaims.
func (s *Store) DeleteClaims(ctx context.Context, sync bool, uids ...string) error {
	set := make(map[string]*Claim, len(uids))
	for _, uid := range uids {
		set[uid] = nil
	}
	return s.change(ctx, sync, set)
}

// change persists set (a nil claim deletes) by appending it to the journal,
// or by rewriting the file when there is no journal to append to. Memory
// is changed only once the write has succeeded.
func (s *Store) change(ctx context.Context, sync bool, set map[string]*Claim) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	changed := &Data{Claims: map[string]Claim{}}
	for uid, c := range set {
		if c != nil {
			changed.Claims[uid] = *c
		} else if uid == "" {
			return errors.New("refusing to persist invalid checkpoint: claim with empty UID")
		}
	}
	if err := changed.validate(); err != nil {
		return fmt.Errorf("refusing to persist invalid checkpoint: %w", err)
	}
	s.updateMu.Lock()
	defer s.updateMu.Unlock()

	if s.journal == nil || s.journalBytes >= max(compactFloor, s.snapshotBytes) {
		// A copy of every field, so that a field added to Data survives
		// the rewrite; only Claims changes, so only it is cloned.
		next := *s.data
		next.Claims = maps.Clone(s.data.Claims)
		apply(next.Claims, set)
		return s.replace(ctx, &next)
	}
	if err := s.append(ctx, set, sync); err != nil {
		// The file may now end in part of the change: rewrite it whole next
		// time, from memory, which still holds the state before the change.
		s.closeJournal()
		return fmt.Errorf("writing checkpoint %s: %w", s.path, err)
	}
	// Readers only ever copy claims out under the read lock, so the map
	// can change in place.
	s.mu.Lock()
	apply(s.data.Claims, set)
	s.mu.Unlock()
	return nil
}

func apply(claims map[string]Claim, set map[string]*Claim) {
	for uid, c := range set {
		if c == nil {
			delete(claims, uid)
		} else {
			claims[uid] = *c
		}
	}
}

func (s *Store) timed(ctx context.Context, step string, start time.Time) {
	if s.observe != nil {
		s.observe(ctx, step, time.Since(start))
	}
}

func (s *Store) append(ctx context.Context, set map[string]*Claim, sync bool) error {
	start := time.Now()
	line, err := encodeChange(change{Seq: s.seq + 1, Claims: set})
	if err != nil {
		return fmt.Errorf("encoding change: %w", err)
	}
	s.timed(ctx, StepEncode, start)
	start = time.Now()
	if _, err := s.journal.Write(line); err != nil {
		return fmt.Errorf("appending change: %w", err)
	}
	s.timed(ctx, StepAppend, start)
	if sync {
		start = time.Now()
		if err := s.journal.Sync(); err != nil {
			return fmt.Errorf("syncing appended change: %w", err)
		}
		s.timed(ctx, StepFsync, start)
	}
	s.seq++
	s.journalBytes += int64(len(line))
	klog.FromContext(ctx).V(5).Info("Appended to checkpoint", "claims", len(set), "seq", s.seq, "synced", sync)
	return nil
}

// replace rewrites the file with next, and makes next what readers see
// only once the write has succeeded: a failed write leaves memory as it was.
func (s *Store) replace(ctx context.Context, next *Data) error {
	if err := s.compact(ctx, next); err != nil {
		return err
	}
	s.mu.Lock()
	s.data = next
	s.mu.Unlock()
	return nil
}

// compact replaces the file with a snapshot of d, fsynced together with its
// directory, and opens the new file for appending. Appended changes rely on
// the rename being durable, so a rewrite is always synced.
func (s *Store) compact(ctx context.Context, d *Data) error {
	start := time.Now()
	s.closeJournal()
	content, err := encode(payload{BootID: s.bootID, Data: *d})
	if err != nil {
		return fmt.Errorf("encoding checkpoint: %w", err)
	}
	// A crash at any point leaves either the old or the new file in place,
	// never a mix. If the final directory sync fails the new file may
	// already be visible; memory then still holds the old state, and the
	// next successful write, which is a rewrite because a failed one leaves
	// no journal open, brings the two back together.
	if err := atomicfile.WriteFileFS(s.fs, s.path, content, 0o600); err != nil {
		return fmt.Errorf("writing checkpoint %s: %w", s.path, err)
	}
	s.snapshotBytes, s.journalBytes, s.seq = int64(len(content)), 0, 0
	if j, err := s.fs.OpenAppend(s.path); err != nil {
		// The snapshot is in place; the next change rewrites again.
		klog.FromContext(ctx).Error(err, "Opening the checkpoint for appending", "path", s.path)
	} else {
		s.journal = j
	}
	s.timed(ctx, StepCompact, start)
	klog.FromContext(ctx).V(5).Info("Rewrote checkpoint", "claims", len(d.Claims), "bytes", len(content), "duration", time.Since(start))
	return nil
}

func (s *Store) closeJournal() {
	if s.journal != nil {
		_ = s.journal.Close()
		s.journal = nil
	}
}

// Close releases the file the store appends to. The store stays usable:
// its next change rewrites the file.
func (s *Store) Close() {
	s.updateMu.Lock()
	defer s.updateMu.Unlock()
	s.closeJournal()
}

// removeTempFiles deletes leftovers of writes interrupted by a crash.
func (s *Store) removeTempFiles(logger klog.Logger) {
	leftovers, err := atomicfile.Leftovers(s.path)
	if err != nil {
		return
	}
	for _, f := range leftovers {
		if err := s.fs.Remove(f); err != nil {
			logger.Error(err, "Removing leftover temporary checkpoint file", "path", f)
		}
	}
}

func readBootID(path string) (string, error) {
	raw, err := os.ReadFile(path)
	if err != nil {
		return "", fmt.Errorf("reading boot ID: %w", err)
	}
	id := strings.TrimSpace(string(raw))
	if id == "" {
		return "", fmt.Errorf("reading boot ID: %s is empty", path)
	}
	return id, nil
}

// encode writes the envelope by hand so that "data" is byte-for-byte what
// was hashed, and the payload is marshalled only once.
func encode(p payload) ([]byte, error) {
	data, err := json.Marshal(p)
	if err != nil {
		return nil, err
	}
	return seal(`"version":"`+currentVersion+`",`, "data", data), nil
}

// seal frames data as {<head>"checksum":"sha256:<hex>","<key>":<data>} and
// a newline.
func seal(head, key string, data []byte) []byte {
	sum := sha256.Sum256(data)
	var buf bytes.Buffer
	buf.Grow(len(data) + len(head) + len(key) + 96)
	buf.WriteString("{" + head + `"checksum":"` + checksumPrefix)
	buf.WriteString(hex.EncodeToString(sum[:]))
	buf.WriteString(`","` + key + `":`)
	buf.Write(data)
	buf.WriteString("}\n")
	return buf.Bytes()
}

// change is one appended journal entry: the claims it sets, with null for
// a removed claim. Seq counts the entries since the snapshot from 1, so that
// a lost or repeated entry shows.
type change struct {
	Seq    int64             `json:"seq"`
	Claims map[string]*Claim `json:"claims"`
}

type journalEntry struct {
	Checksum string          `json:"checksum"`
	Change   json.RawMessage `json:"change"`
}

// encodeChange writes one journal line, sealed like the snapshot.
func encodeChange(c change) ([]byte, error) {
	data, err := json.Marshal(c)
	if err != nil {
		return nil, err
	}
	return seal("", "change", data), nil
}

// decode reads the snapshot and replays the journal entries after it. It
// returns how many bytes of a torn last entry it dropped.
//
// An entry cut short at the end of the file, with no line end after it, is
// what a power loss during an append leaves. Its fsync never returned, so
// nothing was acknowledged after it, and the file before it is intact: the
// entry is dropped and the rest loaded. Any other entry that does not parse
// or fails its checksum makes the whole file unusable, because a change may
// have been acknowledged after it.
func decode(raw []byte) (payload, string, int, CorruptionReason, error) {
	dec := json.NewDecoder(bytes.NewReader(raw))
	p, migratedFrom, reason, err := decodeSnapshot(dec)
	if err != nil {
		return payload{}, "", 0, reason, err
	}
	torn := 0
	for seq := int64(1); ; seq++ {
		var entry journalEntry
		start := dec.InputOffset()
		err := dec.Decode(&entry)
		if errors.Is(err, io.EOF) {
			break
		}
		if n := tornTail(raw[start:]); err != nil && n > 0 {
			torn = n
			break
		}
		if err != nil {
			return payload{}, "", 0, ReasonMalformed, fmt.Errorf("parsing journal entry %d: %w", seq, err)
		}
		if err := verifyChecksum(entry.Change, entry.Checksum, checksumPrefix); err != nil {
			return payload{}, "", 0, ReasonChecksumMismatch, fmt.Errorf("journal entry %d: %w", seq, err)
		}
		var c change
		if err := json.Unmarshal(entry.Change, &c); err != nil {
			return payload{}, "", 0, ReasonMalformed, fmt.Errorf("parsing journal entry %d: %w", seq, err)
		}
		if c.Seq != seq {
			return payload{}, "", 0, ReasonInvalidData, fmt.Errorf("journal entry %d has sequence number %d", seq, c.Seq)
		}
		if p.Claims == nil {
			p.Claims = map[string]Claim{}
		}
		apply(p.Claims, c.Claims)
	}
	if err := p.validate(); err != nil {
		return payload{}, "", 0, ReasonInvalidData, err
	}
	return p, migratedFrom, torn, "", nil
}

// tornTail returns the length of the entry that rest, the bytes from an
// unreadable entry to the end of the file, holds if it is one entry cut
// short (no line end follows it), and 0 otherwise.
func tornTail(rest []byte) int {
	rest = bytes.TrimLeft(rest, " \t\r\n")
	if bytes.IndexByte(rest, '\n') >= 0 {
		return 0
	}
	return len(rest)
}

func decodeSnapshot(dec *json.Decoder) (payload, string, CorruptionReason, error) {
	var env envelope
	if err := dec.Decode(&env); err != nil {
		return payload{}, "", ReasonMalformed, fmt.Errorf("parsing: %w", err)
	}
	switch env.Version {
	case currentVersion:
		if err := verifyChecksum(env.Data, env.Checksum, checksumPrefix); err != nil {
			return payload{}, "", ReasonChecksumMismatch, err
		}
		var p payload
		if err := json.Unmarshal(env.Data, &p); err != nil {
			return payload{}, "", ReasonMalformed, fmt.Errorf("parsing data: %w", err)
		}
		return p, "", "", nil
	case versionV1:
		if err := verifyChecksum(env.PreparedClaims, env.Checksum, ""); err != nil {
			return payload{}, "", ReasonChecksumMismatch, err
		}
		p, err := migrateV1(env.PreparedClaims)
		if err != nil {
			return payload{}, "", ReasonMalformed, err
		}
		return p, versionV1, "", nil
	default:
		return payload{}, "", ReasonUnknownVersion, fmt.Errorf("unknown version %q, expected %s or %s", env.Version, currentVersion, versionV1)
	}
}

func verifyChecksum(data json.RawMessage, checksum, prefix string) error {
	if len(data) == 0 {
		return errors.New("no data")
	}
	var compact bytes.Buffer
	if err := json.Compact(&compact, data); err != nil {
		return fmt.Errorf("compacting data: %w", err)
	}
	sum := sha256.Sum256(compact.Bytes())
	if want := prefix + hex.EncodeToString(sum[:]); checksum != want {
		return fmt.Errorf("checksum %q does not match content (%s)", checksum, want)
	}
	return nil
}

func migrateV1(raw json.RawMessage) (payload, error) {
	var old map[string]v1Claim
	if err := json.Unmarshal(raw, &old); err != nil {
		return payload{}, fmt.Errorf("parsing v1 claims: %w", err)
	}
	p := payload{Data: Data{Claims: make(map[string]Claim, len(old))}}
	for uid, oc := range old {
		c := Claim{UID: uid, Namespace: oc.Namespace, Name: oc.Name, State: PrepareCompleted}
		for _, od := range oc.Devices {
			c.Devices = append(c.Devices, Device{Pool: od.Pool, Name: od.Device, CDIDeviceIDs: od.CDIDeviceIDs})
		}
		p.Claims[uid] = c
	}
	return p, nil
}

// Reload replaces the in-memory state with the file's, for when another
// process may have written it: during a rolling update the old and the new
// plugin instance share the checkpoint, their calls ordered by a file lock.
// A missing file means empty; an unreadable one is an error and leaves the
// state as it was, because moving it aside is Open's decision alone.
func (s *Store) Reload(ctx context.Context) error {
	s.updateMu.Lock()
	defer s.updateMu.Unlock()
	// The other instance may have replaced the file this one appends to.
	s.closeJournal()
	raw, err := os.ReadFile(s.path)
	data := &Data{}
	switch {
	case errors.Is(err, fs.ErrNotExist):
	case err != nil:
		return fmt.Errorf("reloading checkpoint: %w", err)
	default:
		// A torn last entry is dropped here too: the next change after a
		// Reload rewrites the file whole.
		p, _, _, _, err := decode(raw)
		if err != nil {
			return fmt.Errorf("reloading checkpoint %s: %w", s.path, err)
		}
		data = &p.Data
	}
	if data.Claims == nil {
		data.Claims = map[string]Claim{}
	}
	s.mu.Lock()
	s.data = data
	s.mu.Unlock()
	return nil
}
