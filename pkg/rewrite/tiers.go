package rewrite

// tier is one alternative of a generated firstAvailable list.
type tier struct {
	name     string
	selector selectorID // -1: hard needs only
	reason   string
}

// fits is the last tier of every ladder: hard needs and user selectors only,
// so the rewritten request matches every device the plain request matched,
// minus those that cannot hold the workload.
var fits = tier{name: "fits", selector: -1, reason: "hard needs only: never less schedulable than the plain claim"}

// ladders holds the tiers per bound type and policy.
//
// A tier that fails on a node costs a scan of all its devices with two CEL
// evaluations each (class selector, tier test), about 16 times what a plain
// claim pays on a node it accepts. So every ladder is one preferred tier plus
// fits, except memory-bound performance: there the middle step (A100 against
// GDDR cards) is a 2-7x difference in the bottleneck resource, worth one more
// failing scan on GDDR nodes.
var ladders = map[BoundType]map[Policy][]tier{
	MemoryBound: {
		Performance: {
			{"ultra", selBandwidthUltra, "bandwidth class ultra (>2500 GB/s): H100, H200"},
			{"high", selBandwidthHigh, "bandwidth class high (1200-2500 GB/s): A100"},
			fits,
		},
		Economy: {
			{"high", selBandwidthHigh, "bandwidth class high: HBM without taking ultra devices"},
			fits,
		},
	},
	ComputeBound: {
		Performance: {
			{"fp32-fast", selFP32Fast, "fp32 >= 60 TFLOPS: L40S, RTX 4090, H100, H200"},
			fits,
		},
		Economy: {
			{"fp32-value", selFP32Value, "low/mid bandwidth class with fp32 >= 25 TFLOPS: L4, A10, L40S"},
			fits,
		},
	},
	LatencyBound: {
		Performance: {
			{"mid", selBandwidthMid, "bandwidth class mid: fastest small cards, keeps HBM devices free"},
			fits,
		},
		Economy: {
			{"low", selBandwidthLow, "bandwidth class low: smallest cards (L4, T4), keeps big ones free"},
			fits,
		},
	},
}

// ladder picks the tiers for a bound type and policy.
func (o options) ladder(bound BoundType, policy Policy) []tier {
	return ladders[bound][policy]
}
