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

package sim

// Measured training throughput (iterations per second, one job alone on one
// GPU: the "null" entries) of each job type on each GPU model, carried over
// as figures from Gavel's released measurements:
//
//	repository: github.com/stanford-futuredata/gavel
//	path:       scheduler/oracle_throughputs.json
//	commit:     41f8851b5f6760fd9e82867462edd3477f9268de (2019-08-29)
//
// The file was removed from the repository later (c2bc4b8); the figures are
// those of the commit above. Only the isolated throughputs are used, never
// the co-located ones. Gavel measured Google Cloud's K80 (one GK210 die),
// P100 and V100. Transformer at batch size 256 shows the same figure on
// P100 and V100 in the source; it is kept as published.
//
// These figures are the simulator's ground truth for speed. Nothing in
// Prism's decision path reads them: Prism decides from the classifier's
// bound type (jobtypes.go) and the published datasheet attributes.
var gavelThroughput = map[string][numModels]float64{
	"ResNet-18 (batch size 16)":        {17.9205, 46.0379, 77.3174},
	"ResNet-18 (batch size 32)":        {13.415, 39.9937, 65.8054},
	"ResNet-18 (batch size 64)":        {7.74889, 30.8453, 48.8842},
	"ResNet-18 (batch size 128)":       {4.66035, 17.4355, 30.2875},
	"ResNet-18 (batch size 256)":       {2.50966, 9.94155, 16.9874},
	"ResNet-50 (batch size 16)":        {2.70217, 8.10835, 17.3744},
	"ResNet-50 (batch size 32)":        {1.47046, 4.43916, 9.92058},
	"ResNet-50 (batch size 64)":        {0.773264, 2.03768, 5.4576},
	"ResNet-50 (batch size 128)":       {0.296446, 1.08238, 2.84598},
	"Transformer (batch size 16)":      {5.51161, 5.51161, 12.8457},
	"Transformer (batch size 32)":      {3.84444, 5.39028, 12.4753},
	"Transformer (batch size 64)":      {2.022, 5.07238, 9.56802},
	"Transformer (batch size 128)":     {1.03763, 3.02952, 5.77121},
	"Transformer (batch size 256)":     {0.514796, 1.70703, 1.70703},
	"LM (batch size 5)":                {31.8213, 121.961, 167.123},
	"LM (batch size 10)":               {29.6651, 103.564, 143.361},
	"LM (batch size 20)":               {21.7606, 77.5674, 107.951},
	"LM (batch size 40)":               {13.8066, 42.7525, 71.723},
	"LM (batch size 80)":               {7.84656, 26.3605, 43.9036},
	"Recommendation (batch size 512)":  {0.206653, 0.218522, 0.331482},
	"Recommendation (batch size 1024)": {0.2489, 0.29667, 0.47998},
	"Recommendation (batch size 2048)": {0.261267, 0.264343, 0.567532},
	"Recommendation (batch size 4096)": {0.24027, 0.255846, 0.624408},
	"Recommendation (batch size 8192)": {0.214632, 0.276596, 0.602355},
	"CycleGAN":                         {0.529193, 2.44707, 4.91849},
	"A3C":                              {3.82905, 4.75467, 8.23303},
}

// Speed is how many times faster than on the reference GPU (V100) job type
// t trains on model m: the ratio of measured throughputs.
func (t JobType) Speed(m ModelID) float64 {
	tp := gavelThroughput[t.Name]
	return tp[m] / tp[Reference]
}
