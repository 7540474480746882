/*
 * Multi-process test harness: rank 0 runs under cmocka and starts ranks 1..n-1 as fresh
 * processes of the same binary. Every rank listens on a port of its own and writes it to a
 * file in a scratch folder. Connections are made in a fixed order, so every accepted peer is
 * known without a handshake: rank i connects to ranks 0..i-1 once rank i-1 has finished
 * connecting, and rank r accepts ranks r+1..n-1 in that order. Every wait is bounded; a rank
 * that outlives its coordinator is killed (PR_SET_PDEATHSIG).
 */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include <errno.h>
#include <execinfo.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "test/common/shm_cleanup.h"
#include "mp.h"

#define SETUP_MS 30000
#define RANK_TIMEOUT_MS 240000

static const struct mp_scenario *table;
static int ntable;
static char scratch[256];

static uint64_t now_ms(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (uint64_t)ts.tv_sec * 1000 + (uint64_t)ts.tv_nsec / 1000000;
}

int mp_wait_flag(struct mp *mp, const volatile int *flag, int timeout_ms)
{
	uint64_t deadline = now_ms() + (uint64_t)timeout_ms;

	while (!*flag && now_ms() < deadline)
		tfab_progress(mp->ctx);
	return *flag;
}

bool mp_wait_count(struct mp *mp, const int *count, int want, int timeout_ms)
{
	uint64_t deadline = now_ms() + (uint64_t)timeout_ms;

	while (__atomic_load_n(count, __ATOMIC_ACQUIRE) < want && now_ms() < deadline)
		tfab_progress(mp->ctx);
	return __atomic_load_n(count, __ATOMIC_ACQUIRE) >= want;
}

/* sent and received are counted last, with release, and read with acquire. */
struct barrier_state {
	int sent, received, failed;
};

static int barrier_count(struct barrier_state *b)
{
	return __atomic_load_n(&b->sent, __ATOMIC_ACQUIRE) +
	       __atomic_load_n(&b->received, __ATOMIC_ACQUIRE);
}

static void barrier_sent(void *arg, int status)
{
	struct barrier_state *b = arg;

	if (status)
		b->failed = 1;
	__atomic_fetch_add(&b->sent, 1, __ATOMIC_RELEASE);
}

static void barrier_recv(void *arg, int status, DLManagedTensor *t, bool is_dead)
{
	struct barrier_state *b = arg;

	(void)is_dead;
	if (t)
		t->deleter(t);
	if (status)
		b->failed = 1;
	__atomic_fetch_add(&b->received, 1, __ATOMIC_RELEASE);
}

int mp_barrier(struct mp *mp, int64_t tag)
{
	static int32_t one = 1;
	static int64_t shape = 1;
	DLTensor t = {.data = &one,
		      .device = {kDLCPU, 0},
		      .ndim = 1,
		      .dtype = {kDLInt, 32, 1},
		      .shape = &shape};
	/*
	 * On the heap: a barrier that gives up (a peer never came) leaves its operations
	 * pending, and their callbacks run later (at the latest when the peers are destroyed).
	 * The state is then left to them rather than freed.
	 */
	struct barrier_state *b = calloc(1, sizeof(*b));
	uint64_t deadline = now_ms() + SETUP_MS;
	int want = mp->nranks - 1, posted = 0, rc;

	if (!b)
		return 1;
	for (int r = 0; r < mp->nranks; r++) {
		char key[64];

		if (r == mp->rank)
			continue;
		snprintf(key, sizeof(key), "mp/barrier/%d/%d", mp->rank, r);
		if (tfab_send(mp->ctx, key, tag, &t, false, barrier_sent, b))
			break;
		posted++;
		snprintf(key, sizeof(key), "mp/barrier/%d/%d", r, mp->rank);
		if (tfab_recv(mp->ctx, mp->peers[r], key, tag, NULL, barrier_recv, b))
			break;
		posted++;
	}
	while (barrier_count(b) < posted && now_ms() < deadline)
		tfab_progress(mp->ctx);
	if (barrier_count(b) < posted) {
		fprintf(stderr, "rank %d: barrier %lld: %d of %d operations done after %d ms\n",
			mp->rank, (long long)tag, barrier_count(b), posted, SETUP_MS);
		return 1;
	}
	rc = posted == 2 * want && !b->failed ? 0 : 1;
	free(b);
	return rc;
}

static int write_file(int rank, const char *what, unsigned value)
{
	char path[512], tmp[520];
	FILE *f;

	snprintf(path, sizeof(path), "%s/%s%d", scratch, what, rank);
	snprintf(tmp, sizeof(tmp), "%s.tmp", path);
	f = fopen(tmp, "w");
	if (!f)
		return -errno;
	fprintf(f, "%u\n", value);
	fclose(f);
	return rename(tmp, path) ? -errno : 0;
}

static int read_file(int rank, const char *what, unsigned *value_p)
{
	uint64_t deadline = now_ms() + SETUP_MS;
	char path[512];

	snprintf(path, sizeof(path), "%s/%s%d", scratch, what, rank);
	while (now_ms() < deadline) {
		FILE *f = fopen(path, "r");

		if (f) {
			int n = fscanf(f, "%u", value_p);

			fclose(f);
			if (n == 1)
				return 0;
		}
		usleep(5000);
	}
	return -ETIMEDOUT;
}

int mp_note(struct mp *mp, const char *what)
{
	return write_file(mp->rank, what, 1);
}

int mp_put(struct mp *mp, const char *what, unsigned value)
{
	return write_file(mp->rank, what, value);
}

int mp_get(struct mp *mp, int rank, const char *what, unsigned *value_p)
{
	(void)mp;
	return read_file(rank, what, value_p);
}

static int wait_note(struct mp *mp, int rank, const char *what, int timeout_ms, bool progress)
{
	uint64_t deadline = now_ms() + (uint64_t)timeout_ms;
	char path[512];

	snprintf(path, sizeof(path), "%s/%s%d", scratch, what, rank);
	while (access(path, F_OK) != 0) {
		if (now_ms() > deadline)
			return -ETIMEDOUT;
		if (progress)
			tfab_progress(mp->ctx);
		usleep(1000);
	}
	return 0;
}

int mp_wait_note(struct mp *mp, int rank, const char *what, int timeout_ms)
{
	return wait_note(mp, rank, what, timeout_ms, true);
}

int mp_wait_note_quiet(struct mp *mp, int rank, const char *what, int timeout_ms)
{
	return wait_note(mp, rank, what, timeout_ms, false);
}

static int mp_setup(struct mp *mp)
{
	uint16_t port;
	unsigned v;
	int rc;

	rc = tfab_context_create(&mp->ctx);
	if (rc) {
		fprintf(stderr, "rank %d: context: %s\n", mp->rank, tfab_strerror(rc));
		return rc;
	}
	rc = tfab_listen(mp->ctx, "127.0.0.1", 0, &port);
	if (rc == 0)
		rc = write_file(mp->rank, "port", port);
	if (rc == 0 && mp->rank > 0)
		rc = read_file(mp->rank - 1, "connected", &v);
	for (int r = 0; r < mp->rank && rc == 0; r++) {
		rc = read_file(r, "port", &v);
		if (rc == 0)
			rc = tfab_connect(mp->ctx, "127.0.0.1", (uint16_t)v, SETUP_MS,
					  &mp->peers[r]);
	}
	if (rc == 0)
		rc = write_file(mp->rank, "connected", 1);
	for (int r = mp->rank + 1; r < mp->nranks && rc == 0; r++)
		rc = tfab_accept(mp->ctx, SETUP_MS, &mp->peers[r]);
	if (rc)
		fprintf(stderr, "rank %d: connecting: %s\n", mp->rank, tfab_strerror(rc));
	return rc;
}

/* Run one rank of a scenario: set up, run, a closing barrier, tear down. */
static int run_rank(struct mp *mp, const struct mp_scenario *s)
{
	int rc = mp_setup(mp);

	if (rc == 0) {
		rc = s->fn(mp);
		if (rc)
			fprintf(stderr, "rank %d: scenario %s failed\n", mp->rank, s->name);
		else if (!s->no_barrier && mp_barrier(mp, INT64_MAX))
			rc = 1;
	}
	if (mp->ctx) {
		for (int r = 0; r < mp->nranks; r++)
			tfab_peer_destroy(mp->peers[r]);
		if (tfab_context_destroy(mp->ctx)) {
			fprintf(stderr, "rank %d: context still busy at the end\n", mp->rank);
			rc = 1;
		}
	}
	return rc ? 1 : 0;
}

/*
 * Rank 0 runs inside cmocka, whose own handler turns a crash into "Test failed with exception:
 * Segmentation fault(11)" and nothing more. This one says where first, in the words the other
 * ranks' crashes are reported in (test/verbs/known_crash.sh reads them), then puts cmocka's
 * handler back and returns: the fault comes again, and cmocka fails the test as before.
 */
static struct sigaction crash_prev[2];
static const int crash_signals[2] = {SIGSEGV, SIGBUS};

static void crash_report(int sig)
{
	static const char head[] = "rank 0 terminated with signal ", tail[] = "\nBacktrace:\n";
	void *frames[48];
	char num[2];
	int n = backtrace(frames, 48), k = 0;

	if (sig >= 10)
		num[k++] = (char)('0' + sig / 10);
	num[k++] = (char)('0' + sig % 10);
	(void)!write(2, head, sizeof(head) - 1);
	(void)!write(2, num, (size_t)k);
	(void)!write(2, tail, sizeof(tail) - 1);
	backtrace_symbols_fd(frames, n, 2);
	for (int i = 0; i < 2; i++)
		sigaction(crash_signals[i], &crash_prev[i], NULL);
}

static void crash_report_set(bool on)
{
	struct sigaction sa = {.sa_handler = crash_report};
	void *frame;

	backtrace(&frame, 1); /* loads the unwinder now, not inside the handler */
	sigemptyset(&sa.sa_mask);
	for (int i = 0; i < 2; i++) {
		if (on)
			sigaction(crash_signals[i], &sa, &crash_prev[i]);
		else
			sigaction(crash_signals[i], &crash_prev[i], NULL);
	}
}

static const struct mp_scenario *find(const char *name)
{
	for (int i = 0; i < ntable; i++)
		if (strcmp(table[i].name, name) == 0)
			return &table[i];
	return NULL;
}

static void run_scenario(void **state)
{
	const struct mp_scenario *s = *state;
	pid_t pids[MP_MAX_RANKS] = {0};
	struct mp mp = {.rank = 0, .nranks = s->nranks, .test = s->name};
	char self[512];
	ssize_t n = readlink("/proc/self/exe", self, sizeof(self) - 1);
	int rc, failed = 0;

	assert_true(n > 0);
	self[n] = '\0';
	snprintf(scratch, sizeof(scratch), "/tmp/tfab-mp-XXXXXX");
	assert_non_null(mkdtemp(scratch));
	for (int r = 1; r < s->nranks; r++) {
		char rank[16], nranks[16];

		snprintf(rank, sizeof(rank), "%d", r);
		snprintf(nranks, sizeof(nranks), "%d", s->nranks);
		pids[r] = fork();
		assert_true(pids[r] >= 0);
		if (pids[r] == 0) {
			prctl(PR_SET_PDEATHSIG, SIGKILL);
			execl(self, self, "--rank", rank, "--nranks", nranks, "--dir", scratch,
			      "--test", s->name, (char *)NULL);
			_exit(127);
		}
	}
	crash_report_set(true);
	rc = run_rank(&mp, s);
	crash_report_set(false);
	for (int r = 1; r < s->nranks; r++) {
		uint64_t deadline = now_ms() + RANK_TIMEOUT_MS;
		int status = 0;
		pid_t w;

		while ((w = waitpid(pids[r], &status, WNOHANG)) == 0 && now_ms() < deadline)
			usleep(10000);
		if (w == 0) {
			fprintf(stderr, "rank %d did not finish; killed\n", r);
			kill(pids[r], SIGKILL);
			waitpid(pids[r], &status, 0);
			failed = 1;
		} else if ((s->killed & (1u << r)) && WIFSIGNALED(status) &&
			   WTERMSIG(status) == SIGKILL) {
			remove_shm_of(pids[r]); /* its shm region outlives it */
			continue;
		} else if (!WIFEXITED(status) || WEXITSTATUS(status)) {
			fprintf(stderr, "rank %d failed (status %#x)\n", r, status);
			failed = 1;
		}
	}
	{
		char cmd[300];

		snprintf(cmd, sizeof(cmd), "rm -rf '%s'", scratch);
		if (system(cmd))
			fprintf(stderr, "could not remove %s\n", scratch);
	}
	assert_int_equal(rc, 0);
	assert_int_equal(failed, 0);
}

/* Whether name is one of the comma-separated names in list (MP_ONLY=a,b). */
static bool listed(const char *list, const char *name)
{
	size_t len = strlen(name);

	for (const char *p = list; p; p = strchr(p, ',') ? strchr(p, ',') + 1 : NULL)
		if (strncmp(p, name, len) == 0 && (p[len] == ',' || p[len] == '\0'))
			return true;
	return false;
}

int mp_main(int argc, char **argv, const struct mp_scenario *scenarios, int n)
{
	struct CMUnitTest tests[64];
	const char *only = getenv("MP_ONLY");
	int ntests = 0;

	table = scenarios;
	ntable = n;
	if (argc == 9 && strcmp(argv[1], "--rank") == 0) {
		struct mp mp = {.rank = atoi(argv[2]), .nranks = atoi(argv[4])};
		const struct mp_scenario *s = find(argv[8]);

		snprintf(scratch, sizeof(scratch), "%s", argv[6]);
		if (!s || mp.rank <= 0 || mp.rank >= MP_MAX_RANKS || mp.nranks > MP_MAX_RANKS)
			return 2;
		mp.test = s->name;
		alarm(RANK_TIMEOUT_MS / 1000 + 30);
		return run_rank(&mp, s);
	}
	for (int i = 0; i < n && ntests < 64; i++) {
		if (only && !listed(only, scenarios[i].name))
			continue;
		tests[ntests] = (struct CMUnitTest){.name = scenarios[i].name,
						    .test_func = run_scenario,
						    .initial_state = (void *)&scenarios[i]};
		ntests++;
	}
	{
		/*
		 * Skip only where no provider is named and none is usable; a named one that is
		 * missing fails (the library's log above says why).
		 */
		struct tfab_context *probe;
		const char *named = named_provider();
		int rc = tfab_context_create(&probe);

		if (rc == -TFAB_ERR_NO_FABRIC && !named) {
			printf("SKIP: no usable fabric on this machine (TFAB_PROVIDER=auto)\n");
			return 77;
		}
		if (rc) {
			fprintf(stderr, "FAIL: context on TFAB_PROVIDER=%s: %s%s\n",
				named ? named : "auto", tfab_strerror(rc),
				named && rc == -TFAB_ERR_NO_FABRIC
				    ? " (the test names this provider: not a skip)"
				    : "");
			return 1;
		}
		printf("engine tests on %s %s\n", tfab_context_backend(probe),
		       tfab_context_fabric(probe));
		tfab_context_destroy(probe);
	}
	return _cmocka_run_group_tests("engine", tests, (size_t)ntests, NULL, NULL) ? 1 : 0;
}
