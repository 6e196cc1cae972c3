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

// Package nodelabels keeps the labels that name a single-model GPU node's
// model and classes (rewrite.NodeLabels) on the Node objects, from the
// fleet prism-controller sees published. The pod webhook's preferred
// node-affinity terms select on them (docs/rewrite.md, "The preference as
// node affinity"). It owns only rewrite.NodeLabelKeys.
package nodelabels

import (
	"context"
	"encoding/json"
	"fmt"
	"maps"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes"
	"k8s.io/klog/v2"

	"github.com/prismgpu/prism/pkg/rewrite"
)

// Desired is, per node with Prism GPUs, the labels it should carry on
// fleet: rewrite.NodeLabels of its models. A node that is missing, or
// mixed, should carry none.
func Desired(nodeModels map[string][]string, fleet *rewrite.Fleet) map[string]map[string]string {
	out := make(map[string]map[string]string, len(nodeModels))
	for node, models := range nodeModels {
		if l := rewrite.NodeLabels(models, fleet); len(l) > 0 {
			out[node] = l
		}
	}
	return out
}

// Patch is the JSON merge patch that brings current's owned labels to
// desired, leaving every other label alone; nil when they agree.
func Patch(current, desired map[string]string) []byte {
	change := map[string]*string{}
	for _, k := range rewrite.NodeLabelKeys {
		want, wanted := desired[k]
		have, has := current[k]
		switch {
		case wanted && (!has || have != want):
			change[k] = &want
		case !wanted && has:
			change[k] = nil // a null in a merge patch removes the key
		}
	}
	if len(change) == 0 {
		return nil
	}
	patch, _ := json.Marshal(map[string]any{"metadata": map[string]any{"labels": change}})
	return patch
}

// TrimNode is a cache transform that keeps of a Node only its name and
// labels: the labeller reads nothing else, and a node's status (images,
// conditions) is most of its size.
func TrimNode(obj any) (any, error) {
	n, ok := obj.(*corev1.Node)
	if !ok {
		return obj, nil
	}
	return &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: n.Name, UID: n.UID, ResourceVersion: n.ResourceVersion, Labels: n.Labels}}, nil
}

// Source is what the labeller reads: the published fleet and the nodes.
type Source struct {
	// NodeModels and Fleet are fleet.View's.
	NodeModels func() map[string][]string
	Fleet      func() *rewrite.Fleet
	// Nodes lists the nodes (names and labels) from an informer cache.
	Nodes func(ctx context.Context) ([]corev1.Node, error)
}

// Labeller patches nodes until their owned labels are Desired.
type Labeller struct {
	Client kubernetes.Interface
	Source Source
	// Resync is how often every node is checked without a trigger, so that
	// a label someone removed comes back. Zero: one minute.
	Resync time.Duration
}

// settle is how long the labeller waits after a trigger for more: a node
// joining publishes its slice, and the fleet signals, within moments.
const settle = 500 * time.Millisecond

// Run reconciles on every trigger and every Resync until ctx is done.
func (l *Labeller) Run(ctx context.Context, trigger <-chan struct{}) {
	logger := klog.FromContext(ctx).WithName("nodelabels")
	ctx = klog.NewContext(ctx, logger)
	resync := l.Resync
	if resync == 0 {
		resync = time.Minute
	}
	t := time.NewTicker(resync)
	defer t.Stop()
	if err := l.Reconcile(ctx); err != nil {
		logger.Error(err, "Labelling GPU nodes, retrying at the next change or resync", "resync", resync)
	}
	for {
		select {
		case <-ctx.Done():
			return
		case <-trigger:
			select {
			case <-ctx.Done():
				return
			case <-time.After(settle):
			}
		case <-t.C:
		}
		if err := l.Reconcile(ctx); err != nil {
			logger.Error(err, "Labelling GPU nodes, retrying at the next change or resync", "resync", resync)
		}
	}
}

// Reconcile patches every node whose owned labels differ from Desired.
func (l *Labeller) Reconcile(ctx context.Context) error {
	logger := klog.FromContext(ctx)
	nodes, err := l.Source.Nodes(ctx)
	if err != nil {
		return fmt.Errorf("listing nodes: %w", err)
	}
	desired := Desired(l.Source.NodeModels(), l.Source.Fleet())
	var errs []error
	for _, n := range nodes {
		patch := Patch(n.Labels, desired[n.Name])
		if patch == nil {
			continue
		}
		if _, err := l.Client.CoreV1().Nodes().Patch(ctx, n.Name, types.MergePatchType, patch, metav1.PatchOptions{FieldManager: "prism-controller"}); err != nil {
			errs = append(errs, fmt.Errorf("patching labels of node %s: %w", n.Name, err))
			continue
		}
		logger.V(2).Info("Labelled GPU node", "node", n.Name, "labels", desired[n.Name], "patch", string(patch))
	}
	if len(errs) > 0 {
		return fmt.Errorf("%d of %d nodes: %w", len(errs), len(nodes), errs[0])
	}
	return nil
}

// Changed reports whether a node update touched an owned label, so that
// the labeller puts back what someone else changed.
func Changed(oldNode, newNode *corev1.Node) bool {
	owned := func(n *corev1.Node) map[string]string {
		m := map[string]string{}
		for _, k := range rewrite.NodeLabelKeys {
			if v, ok := n.Labels[k]; ok {
				m[k] = v
			}
		}
		return m
	}
	return !maps.Equal(owned(oldNode), owned(newNode))
}
