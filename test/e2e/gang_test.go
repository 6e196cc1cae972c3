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

package e2e

import (
	"context"
	"fmt"
	"maps"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	corev1 "k8s.io/api/core/v1"
	resourceapi "k8s.io/api/resource/v1"
	schedulingv1beta1 "k8s.io/api/scheduling/v1beta1"
	apimeta "k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/kubernetes"
	"k8s.io/utils/ptr"

	prismv1alpha1 "github.com/prismgpu/prism/api/prism/v1alpha1"
	"github.com/prismgpu/prism/demo/bed"
	"github.com/prismgpu/prism/pkg/rewrite"
	"github.com/prismgpu/prism/test/testbed"
)

// gangOptions turn on upstream's Workload API on every component: the
// GenericWorkload gate serves Workload and PodGroup in kube-apiserver
// (scheduling.k8s.io/v1beta1, off by default as new beta APIs are), enables
// the GangScheduling plugin in kube-scheduler's default profile, and starts
// the PodGroup protection controller in kube-controller-manager.
func gangOptions() testbed.Options {
	return testbed.Options{
		CRDDirs:       bed.CRDDirs(repoRoot),
		FeatureGates:  map[string]bool{"GenericWorkload": true},
		RuntimeConfig: []string{schedulingv1beta1.SchemeGroupVersion.String() + "=true"},
	}
}

// gangNode has eight GPUs of four models (demo/fleets/mixed.yaml), so that
// a profile has a choice and the webhook rewrites. With seven of them held,
// a gang of two one-GPU pods does not fit, though each of its pods alone
// would.
const gangNode = "gpu-mixed"

// TestGangStartsWholeOrNotAtAll: under kube-scheduler's gang scheduling
// (a Workload whose PodGroup asks for minCount 2), two pods that each need
// one Prism GPU start together or not at all. While only one GPU is free,
// neither pod is bound, neither claim is allocated and the plugin prepares
// nothing; once a second GPU frees up, both pods run. Prism's rewrite and
// prismctl explain work for a gang member as for any pod.
func TestGangStartsWholeOrNotAtAll(t *testing.T) {
	ctx, cluster := testbed.ForTest(t, gangOptions())
	b, err := bed.Setup(ctx, cluster, bed.Options{RepoRoot: repoRoot, PluginBin: pluginBinary, ControllerBin: controllerBinary,
		Nodes: []bed.NodeSpec{{Name: gangNode, Fleet: "mixed.yaml"}}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(b.Stop)
	e := &controllerEnv{ctx: ctx, cluster: cluster, prism: prismClient(t, cluster), minor: serverMinor(t, cluster), bed: b}
	client := cluster.Client
	stateDir := b.StateDirs[gangNode]
	cdiRoot := filepath.Join(filepath.Dir(stateDir), "cdi")

	if err := e.createProfile(t, "stream", prismv1alpha1.WorkloadProfileSpec{}, memoryBound); err != nil {
		t.Fatal(err)
	}
	e.profiledTemplate(t, "gang-profiled", "stream", gpuClaimSpec(1))
	e.profiledTemplate(t, "gang-plain", "", gpuClaimSpec(1))
	e.profiledTemplate(t, "seven", "", gpuClaimSpec(7))

	// A plain pod holds seven of the eight GPUs.
	createPod(ctx, t, client, hostNetworkPod(podWithClaim("blocker", "seven", "")))
	blocker, err := testbed.WaitForPod(ctx, client, "default", "blocker", time.Minute, testbed.PodRunning)
	if err != nil {
		t.Fatal(err)
	}
	blockerClaim := podClaim(ctx, t, client, blocker)
	if a := blockerClaim.Status.Allocation; a == nil || len(a.Devices.Results) != 7 {
		t.Fatalf("the blocker's claim holds %+v, want 7 GPUs", a)
	}

	// The gang: a Workload with one gang template, its PodGroup, and two
	// pods in that group, one of them profiled.
	workload := &schedulingv1beta1.Workload{
		ObjectMeta: metav1.ObjectMeta{Name: "trainer", Namespace: "default"},
		Spec: schedulingv1beta1.WorkloadSpec{PodGroupTemplates: []schedulingv1beta1.PodGroupTemplate{{
			Name:             "workers",
			SchedulingPolicy: schedulingv1beta1.PodGroupSchedulingPolicy{Gang: &schedulingv1beta1.GangSchedulingPolicy{MinCount: 2}},
		}}},
	}
	if _, err := client.SchedulingV1beta1().Workloads("default").Create(ctx, workload, metav1.CreateOptions{}); err != nil {
		t.Fatalf("create Workload (is scheduling.k8s.io/v1beta1 served?): %v", err)
	}
	group := &schedulingv1beta1.PodGroup{
		ObjectMeta: metav1.ObjectMeta{Name: "trainer-workers", Namespace: "default"},
		Spec: schedulingv1beta1.PodGroupSpec{
			WorkloadRef:      &schedulingv1beta1.WorkloadReference{WorkloadName: "trainer", TemplateName: "workers"},
			SchedulingPolicy: workload.Spec.PodGroupTemplates[0].SchedulingPolicy,
		},
	}
	if _, err := client.SchedulingV1beta1().PodGroups("default").Create(ctx, group, metav1.CreateOptions{}); err != nil {
		t.Fatalf("create PodGroup: %v", err)
	}
	members := map[string]string{"gang-0": "gang-profiled", "gang-1": "gang-plain"}
	for _, name := range slices.Sorted(maps.Keys(members)) {
		pod := hostNetworkPod(podWithClaim(name, members[name], ""))
		pod.Spec.SchedulingGroup = &corev1.PodSchedulingGroup{PodGroupName: ptr.To(group.Name)}
		createPod(ctx, t, client, pod)
		got, err := client.CoreV1().Pods("default").Get(ctx, name, metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		if got.Spec.SchedulingGroup == nil {
			t.Fatalf("the API server dropped %s's spec.schedulingGroup: is GenericWorkload on?", name)
		}
	}

	t.Run("with one GPU free neither member starts and nothing is prepared", func(t *testing.T) {
		// The scheduler tries the group as a whole and says so on the
		// PodGroup: proof that the gang, not a missing claim, holds it.
		var reason string
		waitFor(t, "the PodGroup marked unschedulable", func() bool {
			pg, err := client.SchedulingV1beta1().PodGroups("default").Get(ctx, group.Name, metav1.GetOptions{})
			if err != nil {
				return false
			}
			c := apimeta.FindStatusCondition(pg.Status.Conditions, schedulingv1beta1.PodGroupInitiallyScheduled)
			if c == nil || c.Status != metav1.ConditionFalse || c.Reason != schedulingv1beta1.PodGroupReasonUnschedulable {
				return false
			}
			reason = c.Message
			return true
		})
		t.Logf("PodGroup %s: %s", group.Name, reason)

		claims := map[string]*resourceapi.ResourceClaim{}
		deadline := time.Now().Add(20 * time.Second)
		err := wait.PollUntilContextTimeout(ctx, 500*time.Millisecond, 25*time.Second, true, func(ctx context.Context) (bool, error) {
			for name := range members {
				pod, err := client.CoreV1().Pods("default").Get(ctx, name, metav1.GetOptions{})
				if err != nil {
					return false, err
				}
				if pod.Spec.NodeName != "" {
					return false, fmt.Errorf("gang member %s was bound to %s while the gang does not fit", name, pod.Spec.NodeName)
				}
				if claim := memberClaim(ctx, t, client, pod); claim != nil {
					if claim.Status.Allocation != nil {
						return false, fmt.Errorf("claim %s of gang member %s was allocated while the gang does not fit: %+v", claim.Name, name, claim.Status.Allocation.Devices.Results)
					}
					claims[name] = claim
				}
			}
			if prepared := preparedClaims(t, stateDir); !slices.Equal(prepared, []string{string(blockerClaim.UID)}) {
				return false, fmt.Errorf("the plugin holds prepared claims %v, want only the blocker's %s", prepared, blockerClaim.UID)
			}
			for _, claim := range claims {
				if specs, _ := filepath.Glob(filepath.Join(cdiRoot, "*"+string(claim.UID)+"*")); len(specs) > 0 {
					return false, fmt.Errorf("the plugin wrote CDI specs %v for claim %s of a gang that does not fit", specs, claim.Name)
				}
			}
			return time.Now().After(deadline), nil
		})
		if err != nil {
			t.Fatal(err)
		}
		if len(claims) != len(members) {
			t.Fatalf("claims made for gang members %v, want one for each of %v", slices.Sorted(maps.Keys(claims)), slices.Sorted(maps.Keys(members)))
		}
		for name := range members {
			pod, err := client.CoreV1().Pods("default").Get(ctx, name, metav1.GetOptions{})
			if err != nil {
				t.Fatal(err)
			}
			t.Logf("%s: %s", name, schedulingStory(ctx, t, client, pod))
		}

		// The webhook rewrote the profiled member's claim when the claim
		// controller made it, before the gang was scheduled.
		assertRewritten(t, claims["gang-0"], "stream")
		if a := claims["gang-1"].Annotations[rewrite.AnnotationKey]; a != "" {
			t.Errorf("the plain member's claim carries a rewrite plan: %s", a)
		}
		out := e.explainClaim(t, claims["gang-0"].Name)
		for _, want := range []string{"Profile:  stream", "Allocated: not yet", "default/" + blockerClaim.Name + " (whole GPU)"} {
			if !strings.Contains(out, want) {
				t.Errorf("explain of the waiting member's claim lacks %q:\n%s", want, out)
			}
		}
	})

	t.Run("once a second GPU is free both members run", func(t *testing.T) {
		deletePod(ctx, t, cluster, "blocker")
		claims := map[string]*resourceapi.ResourceClaim{}
		for name := range members {
			pod, err := testbed.WaitForPod(ctx, client, "default", name, 2*time.Minute, testbed.PodRunning)
			if err != nil {
				t.Fatal(err)
			}
			if pod.Spec.NodeName != gangNode {
				t.Errorf("%s runs on %q, want %s", name, pod.Spec.NodeName, gangNode)
			}
			claims[name] = podClaim(ctx, t, client, pod)
		}
		var devices []string
		for _, name := range slices.Sorted(maps.Keys(claims)) {
			a := claims[name].Status.Allocation
			if a == nil || len(a.Devices.Results) != 1 || a.Devices.Results[0].Driver != "gpu.prism.dev" || a.Devices.Results[0].Pool != gangNode {
				t.Fatalf("claim of %s: allocation %+v, want one gpu.prism.dev device on %s", name, a, gangNode)
			}
			devices = append(devices, a.Devices.Results[0].Device)
		}
		if devices[0] == devices[1] {
			t.Errorf("both members got %s, want one GPU each", devices[0])
		}
		want := []string{string(claims["gang-0"].UID), string(claims["gang-1"].UID)}
		slices.Sort(want)
		if diff := cmp.Diff(want, preparedClaims(t, stateDir)); diff != "" {
			t.Errorf("prepared claims on %s (-want +got):\n%s", gangNode, diff)
		}
		pg, err := client.SchedulingV1beta1().PodGroups("default").Get(ctx, group.Name, metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		if c := apimeta.FindStatusCondition(pg.Status.Conditions, schedulingv1beta1.PodGroupInitiallyScheduled); c == nil || c.Status != metav1.ConditionTrue {
			t.Errorf("PodGroup condition %s = %+v, want True", schedulingv1beta1.PodGroupInitiallyScheduled, c)
		}

		assertRewritten(t, claims["gang-0"], "stream")
		out := e.explainClaim(t, claims["gang-0"].Name)
		for _, want := range []string{"Profile:  stream", "* " + claims["gang-0"].Status.Allocation.Devices.Results[0].Request,
			"default/" + claims["gang-1"].Name + " (whole GPU)"} {
			if !strings.Contains(out, want) {
				t.Errorf("explain of the running member's claim lacks %q:\n%s", want, out)
			}
		}
	})
}

func hostNetworkPod(p *corev1.Pod) *corev1.Pod {
	p.Spec.HostNetwork = true
	return p
}

// memberClaim is the claim the claim controller made for the pod's
// template, nil while there is none yet.
func memberClaim(ctx context.Context, t *testing.T, client kubernetes.Interface, pod *corev1.Pod) *resourceapi.ResourceClaim {
	t.Helper()
	if len(pod.Status.ResourceClaimStatuses) != 1 || pod.Status.ResourceClaimStatuses[0].ResourceClaimName == nil {
		return nil
	}
	return podClaim(ctx, t, client, pod)
}

// preparedClaims are the UIDs of the claims in the plugin's checkpoint,
// sorted.
func preparedClaims(t *testing.T, stateDir string) []string {
	t.Helper()
	var uids []string
	for _, c := range readCheckpoint(t, stateDir) {
		uids = append(uids, c.UID)
	}
	slices.Sort(uids)
	return uids
}

// assertRewritten checks that the claim carries the webhook's plan for
// the profile.
func assertRewritten(t *testing.T, claim *resourceapi.ResourceClaim, profile string) {
	t.Helper()
	if plan := claimPlan(t, claim); plan.Profile != profile || plan.BoundType == "" {
		t.Errorf("claim %s plan %+v, want one for profile %s with its bound type", claim.Name, plan, profile)
	}
}

// schedulingStory is what the scheduler said about the pod: its
// PodScheduled condition and its events.
func schedulingStory(ctx context.Context, t *testing.T, client kubernetes.Interface, pod *corev1.Pod) string {
	t.Helper()
	var parts []string
	for _, c := range pod.Status.Conditions {
		if c.Type == corev1.PodScheduled {
			parts = append(parts, fmt.Sprintf("condition PodScheduled=%s %s: %s", c.Status, c.Reason, c.Message))
		}
	}
	events, err := client.CoreV1().Events(pod.Namespace).List(ctx, metav1.ListOptions{FieldSelector: "involvedObject.kind=Pod,involvedObject.name=" + pod.Name})
	if err != nil {
		t.Fatal(err)
	}
	for _, ev := range events.Items {
		parts = append(parts, fmt.Sprintf("event %s ×%d: %s", ev.Reason, max(ev.Count, 1), ev.Message))
	}
	return strings.Join(parts, "; ")
}
