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

// Package cdi writes one transient CDI spec per prepared claim. The
// container runtime resolves the IDs the kubelet plugin returns from
// NodePrepareResources against these files when it creates containers.
package cdi

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"

	"k8s.io/klog/v2"
	cdiapi "tags.cncf.io/container-device-interface/pkg/cdi"
	"tags.cncf.io/container-device-interface/pkg/parser"
	cdispec "tags.cncf.io/container-device-interface/specs-go"
)

const (
	// Vendor and Class make up the kind of the per-claim specs. The vendor
	// is distinct from the node-wide nvidia.com/gpu specs so that the two
	// never collide.
	Vendor = "k8s.gpu.prism.dev"
	Class  = "claim"
	Kind   = Vendor + "/" + Class

	// DefaultRoot is the CDI directory for dynamically generated specs; it
	// takes precedence over /etc/cdi and is cleared on reboot.
	DefaultRoot = "/var/run/cdi"

	// ClaimUIDEnvVar tells the workload which claim its GPUs belong to.
	ClaimUIDEnvVar = "PRISM_CLAIM_UID"
	// VisibleDevicesEnvVar is read by CUDA tooling and by NVIDIA's runtime
	// hooks.
	VisibleDevicesEnvVar = "NVIDIA_VISIBLE_DEVICES"

	specExt = ".json"
)

// Claim UIDs become part of a file name, so anything but a UUID-like token
// is refused.
var claimUIDRE = regexp.MustCompile(`^[A-Za-z0-9][A-Za-z0-9-]{0,62}$`)

// Device is one device allocated to a claim on this node.
type Device struct {
	// Name is the device name from the allocation result, for example
	// "gpu-0". It becomes part of the CDI device name.
	Name string
	// UUID is the GPU's UUID. The NVML source looks the device up by it.
	UUID string
	// Minor is N in /dev/nvidiaN. The simulated source uses it.
	Minor int
	// Edits are appended to this device's edits, for example a memory
	// limit for one shared GPU.
	Edits *cdispec.ContainerEdits
	// MIG is set for a MIG device: UUID is then the MIG device's and Minor
	// the parent GPU's.
	MIG *MIGDevice
}

// Claim is a claim's share of the node's devices.
type Claim struct {
	UID     string
	Devices []Device
	// Edits apply to every container that uses any device of the claim,
	// for example profiling mounts and environment.
	Edits *cdispec.ContainerEdits
}

// EditSource produces the node-specific part of the edits: device nodes,
// driver libraries and hooks. It separates real nodes from simulated ones.
type EditSource interface {
	// CommonEdits are needed by every container with any GPU.
	CommonEdits(ctx context.Context) (*cdispec.ContainerEdits, error)
	// DeviceEdits expose one GPU.
	DeviceEdits(ctx context.Context, device Device) (*cdispec.ContainerEdits, error)
}

// Options configure a Writer.
type Options struct {
	// Root is the CDI spec directory. Defaults to DefaultRoot.
	Root string
	// Source provides the device and driver edits. Required.
	Source EditSource
	// Roots map the host paths a spec names to where this process sees
	// them, for the device node existence check. The zero value suits a
	// process in the host's mount namespace.
	Roots Roots
}

// Writer writes and removes per-claim CDI specs.
type Writer struct {
	root   string
	roots  Roots
	source EditSource
	cache  *cdiapi.Cache
}

// NewWriter returns a Writer for the given options.
func NewWriter(opts Options) (*Writer, error) {
	if opts.Source == nil {
		return nil, errors.New("creating CDI writer: no edit source")
	}
	if opts.Root == "" {
		opts.Root = DefaultRoot
	}
	// Auto-refresh would start a file watcher; the writer never reads specs
	// back through the cache.
	cache, err := cdiapi.NewCache(cdiapi.WithSpecDirs(opts.Root), cdiapi.WithAutoRefresh(false))
	if err != nil {
		return nil, fmt.Errorf("creating CDI cache for %s: %w", opts.Root, err)
	}
	return &Writer{root: opts.Root, roots: opts.Roots.resolve(), source: opts.Source, cache: cache}, nil
}

// SpecFileName is the name of the spec file of a claim.
func SpecFileName(claimUID string) string {
	return cdiapi.GenerateTransientSpecName(Vendor, Class, claimUID) + specExt
}

// DeviceID is the fully-qualified CDI device ID of a claim's device.
func DeviceID(claimUID, deviceName string) string {
	return parser.QualifiedName(Vendor, Class, claimUID+"-"+deviceName)
}

// WriteClaimSpec writes the spec of a claim and returns the CDI device IDs,
// in the order of claim.Devices. Writing the same claim again replaces the
// file with identical content and returns the same IDs.
func (w *Writer) WriteClaimSpec(ctx context.Context, claim Claim) ([]string, error) {
	logger := klog.FromContext(ctx)
	spec, ids, err := w.buildSpec(ctx, claim)
	if err != nil {
		return nil, fmt.Errorf("building CDI spec for claim %s: %w", claim.UID, err)
	}
	// A spec that names a missing node lets the runtime fail the container
	// much later with an error that points nowhere near the driver.
	if err := w.checkDeviceNodes(spec); err != nil {
		return nil, fmt.Errorf("refusing to write CDI spec for claim %s: %w", claim.UID, err)
	}
	version, err := cdispec.MinimumRequiredVersion(spec)
	if err != nil {
		return nil, fmt.Errorf("determining CDI spec version for claim %s: %w", claim.UID, err)
	}
	spec.Version = version
	name := SpecFileName(claim.UID)
	if err := w.cache.WriteSpec(spec, name); err != nil {
		return nil, fmt.Errorf("writing CDI spec %s: %w", filepath.Join(w.root, name), err)
	}
	logger.V(4).Info("Wrote CDI spec", "claimUID", claim.UID, "path", filepath.Join(w.root, name), "version", version, "devices", ids)
	return ids, nil
}

// RemoveClaimSpec removes the spec of a claim. A missing spec is not an
// error, so unprepare can be retried.
func (w *Writer) RemoveClaimSpec(ctx context.Context, claimUID string) error {
	if err := validateClaimUID(claimUID); err != nil {
		return fmt.Errorf("removing CDI spec: %w", err)
	}
	if err := w.cache.RemoveSpec(SpecFileName(claimUID)); err != nil {
		return fmt.Errorf("removing CDI spec of claim %s: %w", claimUID, err)
	}
	klog.FromContext(ctx).V(4).Info("Removed CDI spec", "claimUID", claimUID)
	return nil
}

// ListClaimSpecs returns the UIDs of all claims with a spec in the root,
// sorted, so that specs without a checkpoint entry can be removed on
// startup.
func (w *Writer) ListClaimSpecs(ctx context.Context) ([]string, error) {
	entries, err := os.ReadDir(w.root)
	if errors.Is(err, os.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("listing CDI specs in %s: %w", w.root, err)
	}
	prefix := strings.TrimSuffix(SpecFileName("x"), "x"+specExt)
	var uids []string
	for _, e := range entries {
		name := e.Name()
		if !e.Type().IsRegular() || !strings.HasPrefix(name, prefix) {
			continue
		}
		// The library may have written YAML if an older release chose it.
		uid, ok := strings.CutSuffix(strings.TrimPrefix(name, prefix), specExt)
		if !ok {
			uid, ok = strings.CutSuffix(strings.TrimPrefix(name, prefix), ".yaml")
		}
		if !ok || validateClaimUID(uid) != nil {
			klog.FromContext(ctx).V(4).Info("Ignoring unexpected file in CDI root", "name", name)
			continue
		}
		uids = append(uids, uid)
	}
	slices.Sort(uids)
	return slices.Compact(uids), nil
}

func (w *Writer) buildSpec(ctx context.Context, claim Claim) (*cdispec.Spec, []string, error) {
	if err := validateClaimUID(claim.UID); err != nil {
		return nil, nil, err
	}
	if len(claim.Devices) == 0 {
		return nil, nil, errors.New("claim has no devices")
	}

	common, err := w.source.CommonEdits(ctx)
	if err != nil {
		return nil, nil, fmt.Errorf("getting common edits: %w", err)
	}
	uuids := make([]string, 0, len(claim.Devices))
	for _, d := range claim.Devices {
		if d.UUID != "" {
			uuids = append(uuids, d.UUID)
		}
	}
	own := &cdispec.ContainerEdits{Env: []string{ClaimUIDEnvVar + "=" + claim.UID}}
	if len(uuids) > 0 {
		// Spec-wide because every device of the claim would otherwise set
		// the same variable and only the last would survive. A container
		// that uses only some of the claim's requests therefore sees all the
		// claim's UUIDs here, but only its own device nodes.
		own.Env = append(own.Env, VisibleDevicesEnvVar+"="+strings.Join(uuids, ","))
	}
	spec := &cdispec.Spec{
		Kind:           Kind,
		ContainerEdits: mergeEdits(common, own, claim.Edits),
	}

	ids := make([]string, 0, len(claim.Devices))
	seen := map[string]bool{}
	for _, d := range claim.Devices {
		name := claim.UID + "-" + d.Name
		if err := parser.ValidateDeviceName(name); err != nil {
			return nil, nil, fmt.Errorf("device %q: %w", d.Name, err)
		}
		if seen[name] {
			return nil, nil, fmt.Errorf("device %q listed twice", d.Name)
		}
		seen[name] = true
		edits, err := w.source.DeviceEdits(ctx, d)
		if err != nil {
			return nil, nil, fmt.Errorf("getting edits for device %q: %w", d.Name, err)
		}
		spec.Devices = append(spec.Devices, cdispec.Device{Name: name, ContainerEdits: mergeEdits(edits, d.Edits)})
		ids = append(ids, DeviceID(claim.UID, d.Name))
	}
	return spec, ids, nil
}

func (w *Writer) checkDeviceNodes(spec *cdispec.Spec) error {
	var errs []error
	check := func(owner string, edits cdispec.ContainerEdits) {
		for _, n := range edits.DeviceNodes {
			p := n.HostPath
			if p == "" {
				p = n.Path
			}
			// The spec names the host path; this process may see it elsewhere.
			if _, err := os.Stat(w.roots.ContainerPath(p)); err != nil {
				errs = append(errs, fmt.Errorf("device node %s needed by %s: %w", p, owner, err))
			}
		}
	}
	check("all devices", spec.ContainerEdits)
	for _, d := range spec.Devices {
		check(d.Name, d.ContainerEdits)
	}
	return errors.Join(errs...)
}

func validateClaimUID(uid string) error {
	if !claimUIDRE.MatchString(uid) {
		return fmt.Errorf("invalid claim UID %q", uid)
	}
	return nil
}

// mergeEdits concatenates edits into a new value without aliasing the
// inputs' slices. For environment variables the last setting of a name
// wins and earlier ones are dropped, which is what the runtime would do
// anyway, but keeps the spec unambiguous.
func mergeEdits(parts ...*cdispec.ContainerEdits) cdispec.ContainerEdits {
	var out cdispec.ContainerEdits
	for _, p := range parts {
		if p == nil {
			continue
		}
		out.Env = append(out.Env, p.Env...)
		out.DeviceNodes = append(out.DeviceNodes, p.DeviceNodes...)
		out.NetDevices = append(out.NetDevices, p.NetDevices...)
		out.Hooks = append(out.Hooks, p.Hooks...)
		out.Mounts = append(out.Mounts, p.Mounts...)
		out.AdditionalGIDs = append(out.AdditionalGIDs, p.AdditionalGIDs...)
		if p.IntelRdt != nil {
			out.IntelRdt = p.IntelRdt
		}
	}
	out.Env = dedupeEnv(out.Env)
	return out
}

func dedupeEnv(env []string) []string {
	if len(env) == 0 {
		return nil
	}
	last := map[string]int{}
	for i, kv := range env {
		k, _, _ := strings.Cut(kv, "=")
		last[k] = i
	}
	out := make([]string, 0, len(last))
	for i, kv := range env {
		k, _, _ := strings.Cut(kv, "=")
		if last[k] == i {
			out = append(out, kv)
		}
	}
	return out
}
