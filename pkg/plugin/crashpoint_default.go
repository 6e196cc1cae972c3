//go:build !faultinject

package plugin

// crashPoint is a no-op in production builds.
func crashPoint(string) {}
