/*
 * Stands for a workload's own preload library in shim_test.go: every
 * program that loads it says whether it runs under the profiler.
 */
#define _GNU_SOURCE
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

__attribute__((constructor)) static void mark(int argc, char **argv) {
	const char *out = getenv("PRELOAD_OUT");
	if (out == NULL || argc < 1)
		return;
	int fd = open(out, O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0644);
	if (fd < 0)
		return;
	const char *name = strrchr(argv[0], '/');
	dprintf(fd, "%s: %s\n", name ? name + 1 : argv[0], getenv("PRISM_PROFILE_ACTIVE") ? "profiled" : "not profiled");
	close(fd);
}
