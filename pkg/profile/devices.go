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

package profile

import "strings"

// devicePeaks are FP32 (non-tensor) peaks and DRAM bandwidths from NVIDIA's
// data sheets, at boost clock. ncu locks clocks to base by default, which
// lowers both peaks by about the same factor, so the ridge point (their
// ratio) is what matters and stays close. Order matters: the first entry
// whose key is in the product name wins, so longer names come first
// ("A100" before "A10", "L40S" before "L4").
var devicePeaks = []struct {
	key            string
	flops          float64 // FP32 FLOP/s
	bytesPerSecond float64 // DRAM byte/s
}{
	{"H200", 67e12, 4.8e12},
	{"H100 PCIe", 51.2e12, 2.0e12},
	{"H100 NVL", 60e12, 3.9e12},
	{"H100", 67e12, 3.35e12},
	{"A100-SXM4-80GB", 19.5e12, 2.039e12},
	{"A100 80GB PCIe", 19.5e12, 1.935e12},
	{"A100", 19.5e12, 1.555e12},
	{"A10", 31.2e12, 600e9},
	{"L40S", 91.6e12, 864e9},
	{"L40", 90.5e12, 864e9},
	{"L4", 30.3e12, 300e9},
	{"T4", 8.1e12, 320e9},
	{"V100", 15.7e12, 900e9},
}

// peaksOf looks a product name up in devicePeaks.
func peaksOf(product string) (flops, bytesPerSecond float64, ok bool) {
	for _, d := range devicePeaks {
		if strings.Contains(product, d.key) {
			return d.flops, d.bytesPerSecond, true
		}
	}
	return 0, 0, false
}
