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

// Package profilecmd implements `prismctl profile`: importing an ncu report
// as a WorkloadProfile and showing one.
package profilecmd

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/spf13/cobra"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/util/retry"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/yaml"

	"github.com/prismgpu/prism/api/prism/v1alpha1"
	"github.com/prismgpu/prism/internal/prismctl/cmdgroup"
	"github.com/prismgpu/prism/internal/prismctl/kubeconfig"
	"github.com/prismgpu/prism/pkg/profile"
)

type clientFunc = kubeconfig.ClientFunc[client.Client]

// NewCommand returns the `profile` command with its `import` and `show`
// subcommands. Connection flags (--kubeconfig, --context, --namespace)
// are its own, so it can be added to any root command.
func NewCommand() *cobra.Command {
	return kubeconfig.Command(func(cfg *rest.Config) (client.Client, error) {
		scheme := runtime.NewScheme()
		if err := v1alpha1.AddToScheme(scheme); err != nil {
			return nil, err
		}
		return client.New(cfg, client.Options{Scheme: scheme})
	}, newCommand)
}

func newCommand(newClient clientFunc) *cobra.Command {
	cmd := cmdgroup.New("profile", "Import and inspect GPU workload profiles")
	var namespace string
	cmd.PersistentFlags().StringVarP(&namespace, "namespace", "n", "", "Namespace of the WorkloadProfile (default: the kubeconfig's).")
	ns := func(fallback string) string {
		if namespace != "" {
			return namespace
		}
		if fallback == "" {
			return "default"
		}
		return fallback
	}
	cmd.AddCommand(newImportCommand(newClient, ns), newShowCommand(newClient, ns))
	return cmd
}

type importOptions struct {
	name, file, ncuVersion, device, output string
	dryRun                                 bool
}

func newImportCommand(newClient clientFunc, namespace func(string) string) *cobra.Command {
	var o importOptions
	cmd := &cobra.Command{
		Use:   "import --name NAME -f REPORT.csv",
		Short: "Create or update a WorkloadProfile from an ncu CSV report",
		Long: `Reads a CSV report from Nsight Compute (either "ncu --csv" or
"ncu --csv --page raw --metrics ..."), classifies the workload and writes
the result to the WorkloadProfile's status. The spec of an existing profile
is left alone.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			return runImport(cmd.Context(), cmd, o, newClient, namespace)
		},
	}
	f := cmd.Flags()
	f.StringVar(&o.name, "name", "", "Name of the WorkloadProfile.")
	f.StringVarP(&o.file, "filename", "f", "", `The ncu CSV report, "-" for standard input.`)
	f.StringVar(&o.ncuVersion, "ncu-version", "", "The ncu version that wrote the report, when the report does not say.")
	f.StringVar(&o.device, "device", "", `Product name of the profiled GPU (for example "NVIDIA H100 80GB HBM3"), for the roofline check.`)
	f.BoolVar(&o.dryRun, "dry-run", false, "Print the WorkloadProfile instead of writing it.")
	f.StringVarP(&o.output, "output", "o", "", "Print the result as yaml or json.")
	_ = cmd.MarkFlagRequired("name")
	_ = cmd.MarkFlagRequired("filename")
	return cmd
}

func runImport(ctx context.Context, cmd *cobra.Command, o importOptions, newClient clientFunc, namespace func(string) string) error {
	if o.output != "" && o.output != "yaml" && o.output != "json" {
		return fmt.Errorf("--output must be yaml or json, not %q", o.output)
	}
	in := cmd.InOrStdin()
	if o.file != "-" {
		f, err := os.Open(o.file)
		if err != nil {
			return fmt.Errorf("opening report: %w", err)
		}
		defer f.Close()
		in = f
	}
	st, err := profile.FromReport(ctx, in, profile.Options{
		NCUVersion: o.ncuVersion,
		Device:     v1alpha1.ProfiledDevice{ProductName: o.device},
		Source:     &v1alpha1.ProfileSource{Type: v1alpha1.ProfileSourceImport},
		ObservedAt: time.Now(),
	})
	if err != nil {
		return fmt.Errorf("reading %s: %w", o.file, err)
	}

	wp := &v1alpha1.WorkloadProfile{
		TypeMeta:   metav1.TypeMeta{APIVersion: v1alpha1.GroupVersion.String(), Kind: "WorkloadProfile"},
		ObjectMeta: metav1.ObjectMeta{Name: o.name},
	}
	if o.dryRun {
		wp.Namespace = namespace("")
		profile.Apply(wp, st)
		return write(cmd.OutOrStdout(), wp, o.output)
	}

	c, defaultNS, err := newClient()
	if err != nil {
		return err
	}
	wp.Namespace = namespace(defaultNS)
	key := client.ObjectKeyFromObject(wp)
	err = retry.RetryOnConflict(retry.DefaultRetry, func() error {
		current := &v1alpha1.WorkloadProfile{}
		err := c.Get(ctx, key, current)
		if apierrors.IsNotFound(err) {
			current = wp.DeepCopy()
			if err := c.Create(ctx, current); err != nil {
				return fmt.Errorf("creating WorkloadProfile %s: %w", key, err)
			}
		} else if err != nil {
			return fmt.Errorf("getting WorkloadProfile %s: %w", key, err)
		}
		// The main resource ignores status; only the subresource
		// writes it.
		profile.Apply(current, st)
		if err := c.Status().Update(ctx, current); err != nil {
			return err
		}
		wp = current
		return nil
	})
	if err != nil {
		return fmt.Errorf("updating status of WorkloadProfile %s: %w", key, err)
	}
	if o.output != "" {
		wp.SetGroupVersionKind(v1alpha1.GroupVersion.WithKind("WorkloadProfile"))
		return write(cmd.OutOrStdout(), wp, o.output)
	}
	_, err = fmt.Fprintf(cmd.OutOrStdout(), "workloadprofile.prism.dev/%s imported: %s\n", wp.Name, wp.Status.BoundType)
	return err
}

func write(w io.Writer, wp *v1alpha1.WorkloadProfile, format string) error {
	var b []byte
	var err error
	if format == "json" {
		b, err = json.MarshalIndent(wp, "", "  ")
		b = append(b, '\n')
	} else {
		b, err = yaml.Marshal(wp)
	}
	if err != nil {
		return fmt.Errorf("encoding WorkloadProfile: %w", err)
	}
	_, err = w.Write(b)
	return err
}

func newShowCommand(newClient clientFunc, namespace func(string) string) *cobra.Command {
	return &cobra.Command{
		Use:   "show NAME",
		Short: "Print a WorkloadProfile in readable form",
		Args:  cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			c, defaultNS, err := newClient()
			if err != nil {
				return err
			}
			wp := &v1alpha1.WorkloadProfile{}
			key := client.ObjectKey{Namespace: namespace(defaultNS), Name: args[0]}
			if err := c.Get(cmd.Context(), key, wp); err != nil {
				return fmt.Errorf("getting WorkloadProfile %s: %w", key, err)
			}
			return Describe(cmd.OutOrStdout(), wp)
		},
	}
}

// Describe writes a WorkloadProfile for people: percentages instead of
// milli-percent, and the top kernels as a table.
func Describe(out io.Writer, wp *v1alpha1.WorkloadProfile) error {
	w := tabwriter.NewWriter(out, 0, 4, 2, ' ', 0)
	st := &wp.Status
	line := func(label, value string) {
		if value != "" {
			fmt.Fprintf(w, "%s:\t%s\n", label, value)
		}
	}
	pct := func(v *int32) string {
		if v == nil {
			return ""
		}
		return profile.FormatMilliPercent(*v)
	}
	line("Name", wp.Name)
	line("Namespace", wp.Namespace)
	bound := string(st.BoundType)
	if bound == "" {
		bound = "(not profiled)"
	}
	line("Bound", bound)
	line("SM throughput", pct(st.SMThroughputMilliPercent))
	line("Memory throughput", pct(st.MemoryThroughputMilliPercent))
	line("DRAM throughput", pct(st.DRAMThroughputMilliPercent))
	line("L2 throughput", pct(st.L2ThroughputMilliPercent))
	line("Achieved occupancy", pct(st.AchievedOccupancyMilliPercent))
	if st.WavesPerSM != nil {
		line("Waves per SM", fmt.Sprintf("%.2f", st.WavesPerSM.AsApproximateFloat64()))
	}
	if st.ArithmeticIntensity != nil {
		line("Arithmetic intensity", fmt.Sprintf("%.3g FLOP/byte", st.ArithmeticIntensity.AsApproximateFloat64()))
	}
	if st.FLOPs != nil {
		line("FP32 FLOPs", st.FLOPs.String())
	}
	if st.DRAMBytes != nil {
		line("DRAM bytes", st.DRAMBytes.String())
	}
	if st.PeakMemory != nil {
		line("Peak memory", st.PeakMemory.String())
	}
	if st.KernelLaunches > 0 {
		line("Kernel launches", fmt.Sprint(st.KernelLaunches))
		line("GPU time", time.Duration(st.TotalGPUTimeNanoseconds).String())
	}
	if d := st.Device; d != nil {
		line("Device", strings.TrimSpace(d.ProductName+" (compute capability "+d.ComputeCapability+")"))
	}
	line("ncu version", st.NCUVersion)
	if st.ObservedAt != nil {
		line("Observed", st.ObservedAt.UTC().Format(time.RFC3339))
	}
	if s := st.Source; s != nil {
		src := string(s.Type)
		if r := s.ResourceClaim; r != nil {
			src += " " + r.Namespace + "/" + r.Name
		}
		line("Source", src)
	}
	for _, t := range []string{v1alpha1.ConditionProfiled, v1alpha1.ConditionRooflineConsistent} {
		if c := meta.FindStatusCondition(st.Conditions, t); c != nil {
			line(t, fmt.Sprintf("%s (%s): %s", c.Status, c.Reason, c.Message))
		}
	}
	if err := w.Flush(); err != nil {
		return err
	}
	if len(st.TopKernels) == 0 {
		return nil
	}
	fmt.Fprintln(out, "\nTop kernels:")
	w = tabwriter.NewWriter(out, 0, 4, 2, ' ', 0)
	fmt.Fprintln(w, "  TIME\tLAUNCHES\tSM\tMEMORY\tKERNEL")
	for _, k := range st.TopKernels {
		fmt.Fprintf(w, "  %s\t%d\t%s\t%s\t%s\n", profile.FormatMilliPercent(k.TimeShareMilliPercent), k.Launches,
			profile.FormatMilliPercent(k.SMThroughputMilliPercent), profile.FormatMilliPercent(k.MemoryThroughputMilliPercent), k.Name)
	}
	return w.Flush()
}
