//go:build !linux

package residency

func pageOut(uint64, uint64) error { return ErrUnsupported }
