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

package scenario

import (
	"context"
	"fmt"
	"sort"
	"strconv"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	resourceapi "k8s.io/api/resource/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/wait"

	gpuv1alpha1 "github.com/prismgpu/prism/api/gpu/v1alpha1"
	"github.com/prismgpu/prism/demo/bed"
	"github.com/prismgpu/prism/internal/plugin"
)

// fault is an Xid the runner raised and the taint the plugin put on the
// device for it.
type fault struct {
	node, pool, device string
	xid                int
	taint              resourceapi.DeviceTaint
	tainted            time.Time
}

func (f *fault) id() string { return f.pool + "/" + f.device }

// nodeDevices are the devices of a node's Prism ResourceSlices and their
// pool. A node with GPUs in MIG mode publishes several slices: its whole
// GPUs, its counter sets, and each partitioned GPU's devices.
func (r *runner) nodeDevices(ctx context.Context, node string) (string, []resourceapi.Device, error) {
	list, err := r.client.ResourceV1().ResourceSlices().List(ctx, metav1.ListOptions{
		FieldSelector: resourceapi.ResourceSliceSelectorDriver + "=" + gpuv1alpha1.DriverName + "," + resourceapi.ResourceSliceSelectorNodeName + "=" + node,
	})
	if err != nil {
		return "", nil, err
	}
	if len(list.Items) == 0 {
		return "", nil, fmt.Errorf("no %s ResourceSlice for node %s", gpuv1alpha1.DriverName, node)
	}
	var devices []resourceapi.Device
	for _, s := range list.Items {
		devices = append(devices, s.Spec.Devices...)
	}
	return list.Items[0].Spec.Pool.Name, devices, nil
}

// prismTaint is the health taint of a device in the node's slices, if any.
func (r *runner) prismTaint(ctx context.Context, node, device string) (string, *resourceapi.DeviceTaint, error) {
	pool, devices, err := r.nodeDevices(ctx, node)
	if err != nil {
		return "", nil, err
	}
	for _, d := range devices {
		if d.Name != device {
			continue
		}
		for i := range d.Taints {
			if d.Taints[i].Key == plugin.TaintKey {
				return pool, &d.Taints[i], nil
			}
		}
		return pool, nil, nil
	}
	return "", nil, fmt.Errorf("node %s publishes no device %s", node, device)
}

func (r *runner) faultsFile(node string) (string, error) {
	if p, ok := r.env.FaultsFiles[node]; ok {
		return p, nil
	}
	if sd, ok := r.env.StateDirs[node]; ok {
		return bed.FaultsFile(sd), nil
	}
	return "", fmt.Errorf("no --simulated-faults file known for node %s", node)
}

// raiseXID plays a failing GPU ("<node>/<gpu index>/<xid>"): it appends
// the Xid to the node's --simulated-faults file, where the plugin's NVML
// mock raises it as an event, and waits for the plugin to taint the device.
func (r *runner) raiseXID(ctx context.Context, spec string) (*fault, error) {
	parts := strings.Split(spec, "/")
	if len(parts) != 3 {
		return nil, fmt.Errorf("%q is not <node>/<gpu index>/<xid>", spec)
	}
	idx, err1 := strconv.Atoi(parts[1])
	xid, err2 := strconv.Atoi(parts[2])
	if err1 != nil || err2 != nil {
		return nil, fmt.Errorf("%q is not <node>/<gpu index>/<xid>", spec)
	}
	f := &fault{node: parts[0], device: fmt.Sprintf("gpu-%d", idx), xid: xid}
	path, err := r.faultsFile(f.node)
	if err != nil {
		return nil, err
	}
	start := time.Now()
	if err := bed.AppendFault(path, idx, xid); err != nil {
		return nil, err
	}
	r.logf("  stand-in for a failing GPU: Xid %d on %s GPU %d (appended to %s)", xid, f.node, idx, path)
	var lastErr error
	err = wait.PollUntilContextTimeout(ctx, 200*time.Millisecond, taintTimeout, true, func(ctx context.Context) (bool, error) {
		pool, t, err := r.prismTaint(ctx, f.node, f.device)
		lastErr = err
		if err != nil || t == nil || t.Value != fmt.Sprintf("xid-%d", xid) {
			return false, nil
		}
		f.pool, f.taint, f.tainted = pool, *t, time.Now()
		return true, nil
	})
	if err != nil {
		return nil, fmt.Errorf("the plugin did not taint %s/%s for Xid %d (is it fatal?): %v (last: %v)", f.node, f.device, xid, err, lastErr)
	}
	r.logf("  prism-kubelet-plugin tainted %s %s=%s:%s after %s", f.device, f.taint.Key, f.taint.Value, f.taint.Effect, time.Since(start).Round(100*time.Millisecond))
	return f, nil
}

// waitRecovered waits for the plugin to lift the fault's taint once the GPU
// has been quiet for --health-recover-after.
func (r *runner) waitRecovered(ctx context.Context, f *fault) (string, error) {
	err := wait.PollUntilContextTimeout(ctx, 250*time.Millisecond, recoverTimeout, true, func(ctx context.Context) (bool, error) {
		_, t, err := r.prismTaint(ctx, f.node, f.device)
		return err == nil && t == nil, nil
	})
	if err != nil {
		return "", fmt.Errorf("taint %s on %s still there %s after it was set: %v", f.taint.Value, f.id(), time.Since(f.tainted).Round(time.Second), err)
	}
	d := time.Since(f.tainted).Round(time.Second)
	r.logf("  taint %s on %s gone after %s without a new fault", f.taint.Value, f.id(), d)
	return fmt.Sprintf("%s healthy again after %s", f.device, d), nil
}

// makeRoom ("<node>=<n>") deletes pods of earlier scenarios on node, newest
// first, until n of its GPUs are not allocated to any claim.
func (r *runner) makeRoom(ctx context.Context, spec string, mine map[string]bool) (string, error) {
	node, ns, ok := strings.Cut(spec, "=")
	want, err := strconv.Atoi(ns)
	if !ok || err != nil || want < 1 {
		return "", fmt.Errorf("%q is not <node>=<number of GPUs>", spec)
	}
	var deleted []string
	for {
		free, total, err := r.freeGPUs(ctx, node)
		if err != nil {
			return "", err
		}
		if want > total {
			return "", fmt.Errorf("node %s has %d GPUs, want %d free", node, total, want)
		}
		if free >= want {
			if len(deleted) == 0 {
				return "", nil
			}
			r.logf("  made room on %s: deleted earlier pods %s; %d of %d GPUs free", node, strings.Join(deleted, ", "), free, total)
			return fmt.Sprintf("made room on %s: deleted %s", node, strings.Join(deleted, ", ")), nil
		}
		pods, err := r.client.CoreV1().Pods(Namespace).List(ctx, metav1.ListOptions{FieldSelector: "spec.nodeName=" + node})
		if err != nil {
			return "", err
		}
		var victims []corev1.Pod
		for _, p := range pods.Items {
			if !mine[p.Name] && p.DeletionTimestamp == nil {
				victims = append(victims, p)
			}
		}
		if len(victims) == 0 {
			return "", fmt.Errorf("node %s has %d of %d GPUs free, want %d, and no earlier demo pod on it to delete", node, free, total, want)
		}
		sort.Slice(victims, func(i, j int) bool {
			ti, tj := victims[i].CreationTimestamp, victims[j].CreationTimestamp
			if !ti.Equal(&tj) {
				return tj.Before(&ti)
			}
			return victims[i].Name > victims[j].Name
		})
		if err := r.deletePodAndRelease(ctx, &victims[0]); err != nil {
			return "", err
		}
		deleted = append(deleted, victims[0].Name)
	}
}

// freeGPUs counts the node's whole GPUs that no claim holds, neither the
// GPU nor any of its MIG partitions.
func (r *runner) freeGPUs(ctx context.Context, node string) (free, total int, err error) {
	pool, devices, err := r.nodeDevices(ctx, node)
	if err != nil {
		return 0, 0, err
	}
	claims, err := r.client.ResourceV1().ResourceClaims("").List(ctx, metav1.ListOptions{})
	if err != nil {
		return 0, 0, err
	}
	byName := map[string]resourceapi.Device{}
	gpuOf := map[string]string{} // a whole GPU's uuid → its device name
	for _, d := range devices {
		byName[d.Name] = d
		if u := attr(d, gpuv1alpha1.UUIDAttribute); u != "" && attr(d, gpuv1alpha1.MIGProfileAttribute) == "" {
			gpuOf[u] = d.Name
		}
	}
	busy := map[string]bool{}
	for _, c := range claims.Items {
		if c.Status.Allocation == nil {
			continue
		}
		for _, res := range c.Status.Allocation.Devices.Results {
			if res.Driver != gpuv1alpha1.DriverName || res.Pool != pool {
				continue
			}
			name := res.Device
			if parent, ok := gpuOf[attr(byName[name], gpuv1alpha1.ParentUUIDAttribute)]; ok {
				name = parent
			}
			busy[name] = true
		}
	}
	for _, d := range devices {
		if attr(d, gpuv1alpha1.MIGProfileAttribute) != "" {
			continue
		}
		total++
		if !busy[d.Name] {
			free++
		}
	}
	return free, total, nil
}

// deletePodAndRelease deletes a pod and waits until its claims no longer
// hold devices for it: generated claims are gone, shared ones no longer
// list it (and are deallocated once no pod is left).
func (r *runner) deletePodAndRelease(ctx context.Context, pod *corev1.Pod) error {
	claims, err := r.podClaims(ctx, pod)
	if err != nil {
		return err
	}
	zero := int64(0)
	if err := r.client.CoreV1().Pods(Namespace).Delete(ctx, pod.Name, metav1.DeleteOptions{GracePeriodSeconds: &zero}); err != nil && !apierrors.IsNotFound(err) {
		return err
	}
	err = wait.PollUntilContextTimeout(ctx, 200*time.Millisecond, roomTimeout, true, func(ctx context.Context) (bool, error) {
		if _, err := r.client.CoreV1().Pods(Namespace).Get(ctx, pod.Name, metav1.GetOptions{}); !apierrors.IsNotFound(err) {
			return false, nil
		}
		for _, c := range claims {
			cur, err := r.client.ResourceV1().ResourceClaims(c.Namespace).Get(ctx, c.Name, metav1.GetOptions{})
			if apierrors.IsNotFound(err) || (err == nil && cur.UID != c.UID) {
				continue // gone with the pod
			}
			if err != nil {
				return false, nil
			}
			for _, ref := range cur.Status.ReservedFor {
				if ref.UID == pod.UID {
					return false, nil
				}
			}
			if len(cur.Status.ReservedFor) == 0 && cur.Status.Allocation != nil {
				return false, nil
			}
		}
		return true, nil
	})
	if err != nil {
		return fmt.Errorf("deleted pod %s, but its claims still hold GPUs: %w", pod.Name, err)
	}
	return nil
}
