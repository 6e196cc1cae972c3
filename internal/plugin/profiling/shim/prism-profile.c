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

/*
 * libprism-profile.so: re-executes the first process that loads it under
 * Nsight Compute.
 *
 * CDI can add environment variables and mounts to a container but cannot
 * change its command line, so the kubelet plugin mounts a preload list
 * naming this library as /etc/ld.so.preload (not LD_PRELOAD, which a CDI
 * edit would replace, dropping the workload's own preload). Its
 * constructor runs before main() of the container's entrypoint and
 * replaces the process with
 *
 *     $PRISM_NCU <lines of $PRISM_NCU_ARGS_FILE> --log-file $PRISM_PROFILE_DIR/ncu.log <target> <argv[1..]>
 *
 * with stdout opened on $PRISM_PROFILE_DIR/report.csv, where ncu prints the
 * CSV. Every path comes from the environment, so the library holds no
 * policy; the plugin decides and writes the argument file.
 *
 * Rules, in order of importance:
 *  - Never act in a setuid or setgid program. The preload list is read for
 *    those too, and the PRISM_* variables are the tenant's to set.
 *  - Never break the workload. On any problem the constructor returns and
 *    the process runs normally; the reason goes to profile-error.txt.
 *  - Profile once. PRISM_PROFILE_ACTIVE stops the target and its children
 *    from re-executing, and report.csv is created with O_EXCL so that a
 *    restarted container or a second container of the claim is not profiled
 *    again.
 *  - Never use a shell. Arguments are read one per line and passed to
 *    execv as they are.
 *
 * Built with: gcc -shared -fPIC -O2 -o libprism-profile.so prism-profile.c
 */

#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/auxv.h>
#include <sys/stat.h>
#include <unistd.h>

#define ENV_ACTIVE "PRISM_PROFILE_ACTIVE"
#define ENV_NCU "PRISM_NCU"
#define ENV_ARGS_FILE "PRISM_NCU_ARGS_FILE"
#define ENV_DIR "PRISM_PROFILE_DIR"
#define ENV_MATCH "PRISM_PROFILE_MATCH"

#define REPORT_FILE "report.csv"
#define LOG_FILE "ncu.log"
#define ERROR_FILE "profile-error.txt"
#define SHIM_NAME "libprism-profile.so"

/* The plugin writes at most a few hundred bytes; the bounds only keep a
 * corrupt file from costing the workload memory. */
#define MAX_ARGS_BYTES (64 * 1024)
#define MAX_ARGS 512

extern char **environ;

static const char *base_name(const char *p) {
	const char *s = strrchr(p, '/');
	return s ? s + 1 : p;
}

/* record_error leaves the reason where the plugin collects it. It is best
 * effort: the workload is more important than the message. */
static void record_error(const char *dir, const char *what, const char *detail, int err) {
	char path[PATH_MAX];
	if (dir == NULL || snprintf(path, sizeof(path), "%s/%s", dir, ERROR_FILE) >= (int)sizeof(path))
		return;
	int fd = open(path, O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0644);
	if (fd < 0)
		return;
	dprintf(fd, "prism-profile: pid %d: %s%s%s%s%s\n", (int)getpid(), what,
		detail ? ": " : "", detail ? detail : "",
		err ? ": " : "", err ? strerror(err) : "");
	close(fd);
}

/* read_args reads one argument per line. Empty lines are kept out: no
 * argument Prism writes is empty, and a trailing newline is not an
 * argument. Returns the number of arguments or -1 with errno set. */
static int read_args(const char *path, char *buf, size_t bufsize, char **args, int maxargs) {
	int fd = open(path, O_RDONLY | O_CLOEXEC);
	if (fd < 0)
		return -1;
	size_t n = 0;
	for (;;) {
		if (n == bufsize - 1) {
			close(fd);
			errno = EFBIG;
			return -1;
		}
		ssize_t r = read(fd, buf + n, bufsize - 1 - n);
		if (r < 0 && errno == EINTR)
			continue;
		if (r < 0) {
			int e = errno;
			close(fd);
			errno = e;
			return -1;
		}
		if (r == 0)
			break;
		n += (size_t)r;
	}
	close(fd);
	buf[n] = '\0';
	if (memchr(buf, '\0', n) != NULL) {
		errno = EINVAL;
		return -1;
	}
	int count = 0;
	char *save = NULL;
	for (char *tok = strtok_r(buf, "\n", &save); tok != NULL; tok = strtok_r(NULL, "\n", &save)) {
		if (count == maxargs) {
			errno = E2BIG;
			return -1;
		}
		args[count++] = tok;
	}
	return count;
}

/* drop_self removes this library from an LD_PRELOAD list in place and
 * keeps every other entry, the workload's own preload, in order. The
 * loader separates entries with spaces or colons. */
static void drop_self(char *list) {
	char *out = list;
	for (char *p = list; *p != '\0';) {
		size_t len = strcspn(p, " :");
		if (len > 0) {
			char saved = p[len];
			p[len] = '\0';
			int self = strcmp(base_name(p), SHIM_NAME) == 0;
			p[len] = saved;
			if (!self) {
				if (out != list)
					*out++ = ' ';
				memmove(out, p, len);
				out += len;
			}
		}
		p += len;
		if (*p != '\0')
			p++;
	}
	*out = '\0';
}

/* find_target names the program for ncu to start. argv[0] is preferred to
 * /proc/self/exe because multi-call binaries (busybox) dispatch on it; a
 * bare name is looked up in PATH as execvp would have done. */
static const char *find_target(const char *argv0, char *buf, size_t bufsize) {
	if (argv0 != NULL && argv0[0] != '\0' && argv0[0] != '-') {
		if (strchr(argv0, '/') != NULL)
			return argv0;
		const char *path = getenv("PATH");
		while (path != NULL && *path != '\0') {
			const char *end = strchr(path, ':');
			size_t len = end ? (size_t)(end - path) : strlen(path);
			if (len > 0 && (size_t)snprintf(buf, bufsize, "%.*s/%s", (int)len, path, argv0) < bufsize &&
			    access(buf, X_OK) == 0)
				return buf;
			path = end ? end + 1 : NULL;
		}
	}
	ssize_t n = readlink("/proc/self/exe", buf, bufsize - 1);
	if (n <= 0)
		return NULL;
	buf[n] = '\0';
	return buf;
}

__attribute__((constructor)) static void prism_profile(int argc, char **argv, char **envp) {
	(void)envp;
	if (getauxval(AT_SECURE) != 0)
		return;
	if (getenv(ENV_ACTIVE) != NULL)
		return;
	const char *ncu = getenv(ENV_NCU);
	const char *dir = getenv(ENV_DIR);
	const char *args_file = getenv(ENV_ARGS_FILE);
	if (ncu == NULL || dir == NULL || args_file == NULL)
		return;
	if (argc < 1 || argv == NULL)
		return;

	char exe[PATH_MAX];
	ssize_t exelen = readlink("/proc/self/exe", exe, sizeof(exe) - 1);
	if (exelen > 0) {
		exe[exelen] = '\0';
		/* ncu and its helpers must not profile themselves. LD_PRELOAD is
		 * removed before ncu starts, so this only matters when someone
		 * puts it back. */
		if (strcmp(base_name(exe), "ncu") == 0 || strcmp(base_name(exe), base_name(ncu)) == 0)
			return;
	}
	/* An optional opt-in for entrypoints that are wrappers: with
	 * PRISM_PROFILE_MATCH=python a shell script that execs python is not
	 * profiled, python is. Non-matching processes leave the guard unset so
	 * the environment they pass on still profiles the match. */
	const char *match = getenv(ENV_MATCH);
	if (match != NULL && match[0] != '\0' && strcmp(base_name(argv[0]), match) != 0 &&
	    (exelen <= 0 || strcmp(base_name(exe), match) != 0))
		return;

	/* From here on this process is the one: whatever happens next, its
	 * children must not try again. */
	setenv(ENV_ACTIVE, "1", 1);

	if (access(ncu, X_OK) != 0) {
		record_error(dir, "ncu is not executable, running without the profiler", ncu, errno);
		return;
	}

	static char argbuf[MAX_ARGS_BYTES];
	char *cfg[MAX_ARGS];
	int ncfg = read_args(args_file, argbuf, sizeof(argbuf), cfg, MAX_ARGS);
	if (ncfg < 0) {
		record_error(dir, "reading the ncu arguments, running without the profiler", args_file, errno);
		return;
	}

	char target_buf[PATH_MAX];
	const char *target = find_target(argv[0], target_buf, sizeof(target_buf));
	if (target == NULL) {
		record_error(dir, "cannot name the program to profile, running without the profiler", argv[0], errno);
		return;
	}

	char report[PATH_MAX], log[PATH_MAX];
	if (snprintf(report, sizeof(report), "%s/%s", dir, REPORT_FILE) >= (int)sizeof(report) ||
	    snprintf(log, sizeof(log), "%s/%s", dir, LOG_FILE) >= (int)sizeof(log)) {
		record_error(dir, "profile directory path too long", dir, 0);
		return;
	}

	/* O_EXCL makes the report the claim's "profiled once" token. */
	int rfd = open(report, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0644);
	if (rfd < 0) {
		if (errno != EEXIST)
			record_error(dir, "creating the report, running without the profiler", report, errno);
		return;
	}

	size_t nargs = 1 + (size_t)ncfg + 2 + 1 + (size_t)(argc - 1) + 1;
	char **nargv = calloc(nargs, sizeof(char *));
	if (nargv == NULL) {
		close(rfd);
		record_error(dir, "out of memory, running without the profiler", NULL, ENOMEM);
		return;
	}
	size_t i = 0;
	nargv[i++] = (char *)ncu;
	for (int j = 0; j < ncfg; j++)
		nargv[i++] = cfg[j];
	nargv[i++] = "--log-file";
	nargv[i++] = log;
	/* No "--": ncu takes the first argument that is not an option as the
	 * program, and the target is a path, never an option. */
	nargv[i++] = (char *)target;
	for (int j = 1; j < argc; j++)
		nargv[i++] = argv[j];
	nargv[i] = NULL;

	/* Keep the original stdout to put back if exec fails. */
	int saved = fcntl(STDOUT_FILENO, F_DUPFD_CLOEXEC, 3);
	if (dup2(rfd, STDOUT_FILENO) < 0) {
		record_error(dir, "redirecting stdout, running without the profiler", report, errno);
		close(rfd);
		if (saved >= 0)
			close(saved);
		free(nargv);
		return;
	}
	close(rfd);

	/* The workload's own preload must reach the target, this library
	 * need not: an older plugin put it in LD_PRELOAD, and the guard above
	 * stops it wherever the preload list still loads it. */
	char *preload = getenv("LD_PRELOAD");
	char *preload_copy = preload ? strdup(preload) : NULL;
	if (preload_copy != NULL) {
		char *kept = strdup(preload_copy);
		if (kept != NULL) {
			drop_self(kept);
			if (kept[0] != '\0')
				setenv("LD_PRELOAD", kept, 1);
			else
				unsetenv("LD_PRELOAD");
			free(kept);
		}
	}

	execv(ncu, nargv);

	int err = errno;
	if (saved >= 0) {
		dup2(saved, STDOUT_FILENO);
		close(saved);
	}
	if (preload_copy != NULL) {
		setenv("LD_PRELOAD", preload_copy, 1);
		free(preload_copy);
	}
	free(nargv);
	record_error(dir, "starting ncu failed, running without the profiler", ncu, err);
}
